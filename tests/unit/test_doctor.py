"""doctor's text: what is missing comes with what to do, and what was not probed says so."""

from vnetbench import doctor
from vnetbench.lab import netns


def by_name(report):
    return {c.name: c for c in report.checks}


def test_not_root_says_the_qdiscs_were_not_probed(monkeypatch):
    monkeypatch.setattr(doctor.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(netns, "probe_qdiscs", lambda *a, **k: (_ for _ in ()).throw(AssertionError("probed")))
    checks = by_name(doctor.run_checks())
    assert not checks["root"].ok and "sudo" in checks["root"].fix
    assert not checks["qdiscs"].ok and "netem" in checks["qdiscs"].detail and "sudo" in checks["qdiscs"].fix
    assert not any(name.startswith("qdisc ") for name in checks)


def test_missing_netem_names_the_module_and_the_fallback(monkeypatch):
    monkeypatch.setattr(doctor.os, "geteuid", lambda: 0)
    found = {kind: None for kind in doctor.QDISCS}
    found["netem"] = "Error: Specified qdisc kind is unknown."
    monkeypatch.setattr(netns, "probe_qdiscs", lambda *a, **k: found)
    monkeypatch.setattr(doctor.environments, "availability", lambda probe: [])
    monkeypatch.setattr(doctor, "kvm_state", lambda: (False, "/dev/kvm is absent"))
    checks = by_name(doctor.run_checks())
    netem = checks["qdisc netem"]
    assert not netem.ok and "unknown" in netem.detail
    assert "sch_netem" in netem.fix and "kernel-modules-extra" in netem.fix and "vnb-link" in netem.fix
    assert checks["qdisc tbf"].ok and "qdiscs" not in checks
    assert not checks["kvm"].ok and "TCG" in checks["kvm"].fix and "kvm_intel" in checks["kvm"].fix


def test_doctor_says_which_plotly_js_reports_carry(monkeypatch, tmp_path):
    from vnetbench.report import plotly_bundle

    monkeypatch.setattr(doctor.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(doctor.environments, "availability", lambda probe: [])
    monkeypatch.setattr(plotly_bundle, "bundle_dir", lambda: tmp_path)
    check = by_name(doctor.run_checks())["report plotly.js"]
    assert not check.ok and "is not installed" in check.detail and "full bundle" in check.detail
    assert "make setup" in check.fix
    (tmp_path / plotly_bundle.FILE_NAME).write_text("not plotly")
    check = by_name(doctor.run_checks())["report plotly.js"]
    assert not check.ok and "does not match its pinned sha256" in check.detail
    monkeypatch.setattr(plotly_bundle, "FILE_SHA256", __import__("hashlib").sha256(b"not plotly").hexdigest())
    check = by_name(doctor.run_checks())["report plotly.js"]
    assert check.ok and plotly_bundle.PACKAGE in check.detail and "verified" in check.detail
