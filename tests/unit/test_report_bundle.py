"""The plotly.js a report inlines (the cartesian bundle when installed and verified, else the full
one, said on the page) and the packed blocks that carry it and the chart data. No network: downloads
are faked with tarballs built here, and the pins are swapped for the fakes' checksums where a test
needs a match.
"""

from __future__ import annotations

import base64
import hashlib
import html
import io
import json
import re
import tarfile
import urllib.error
from pathlib import Path

import pytest

from vnetbench.report import html_payload, plotly_bundle as pb
from vnetbench.report.html import _csp_hash, json_for_script, render_report
from vnetbench.report.html_synthetic import make_run
from vnetbench.store.db import Store

FAKE_JS = "/**\n* plotly.js (cartesian - minified) v4.1.1\n*/\nwindow.Plotly = {version: '4.1.1'};\n"


def tarball(member: str = pb.MEMBER, content: str = FAKE_JS) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = content.encode()
        info = tarfile.TarInfo(member)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def integrity(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


@pytest.fixture
def fake_pins(monkeypatch):
    """Pins that match FAKE_JS and its tarball; returns the tarball."""
    tgz = tarball()
    monkeypatch.setattr(pb, "FILE_SHA256", hashlib.sha256(FAKE_JS.encode()).hexdigest())
    monkeypatch.setattr(pb, "TARBALL_INTEGRITY", integrity(tgz))
    return tgz


def never(url):
    raise AssertionError(f"downloaded {url} although the bundle was present and verified")


# ------------------------------------------------------------------ the pin


def test_pinned_cartesian_bundle_is_the_plotly_packages_version():
    """A plotly upgrade in pyproject.toml must move the pin too: both bundles draw the same charts."""
    from plotly.offline import get_plotlyjs

    assert pb.bundle_version(get_plotlyjs()) == pb.VERSION
    assert pb.bundle_version(FAKE_JS) == "4.1.1"
    assert pb.bundle_version("no header") == "unknown"
    assert re.fullmatch(r"[0-9a-f]{64}", pb.FILE_SHA256)
    assert pb.TARBALL_INTEGRITY.startswith("sha512-") and pb.VERSION in pb.TARBALL_URL


def test_the_bundle_lives_in_the_running_environment(monkeypatch, tmp_path):
    monkeypatch.setattr(pb.sys, "prefix", str(tmp_path))
    assert pb.bundle_dir() == tmp_path / "share" / "vnetbench"


def test_installed_bundle_if_any_is_the_pinned_file():
    """Where `make setup` ran for this interpreter, the real file is there and verified."""
    path = pb.bundle_dir() / pb.FILE_NAME
    if not path.exists():
        pytest.skip(f"{path} not installed (make setup)")
    bundle = pb.load()
    assert bundle.kind == "cartesian" and bundle.version == pb.VERSION
    assert bundle.js.startswith("/**\n* plotly.js (cartesian - minified) v4.1.1")


# ------------------------------------------------------------------ choosing the bundle


def test_verified_bundle_is_used(fake_pins, tmp_path):
    pb.install(tmp_path, fetch=lambda url: fake_pins)
    bundle = pb.load(tmp_path)
    assert (bundle.kind, bundle.version, bundle.js) == ("cartesian", "4.1.1", FAKE_JS)
    assert "cartesian bundle" in bundle.note and "sha256 verified" in bundle.note


def test_missing_bundle_falls_back_to_the_full_one_and_says_why(tmp_path):
    from plotly.offline import get_plotlyjs

    bundle = pb.load(tmp_path)
    assert bundle.kind == "full" and bundle.js == get_plotlyjs() and bundle.version == pb.VERSION
    assert f"{tmp_path / pb.FILE_NAME} is not installed" in bundle.note
    assert "make setup" in bundle.note


def test_altered_bundle_falls_back_to_the_full_one(tmp_path):
    (tmp_path / pb.FILE_NAME).write_text(FAKE_JS + "window.evil = 1;\n")
    bundle = pb.load(tmp_path)
    assert bundle.kind == "full"
    assert "does not match its pinned sha256" in bundle.note and pb.FILE_SHA256[:16] in bundle.note


def test_report_names_its_bundle_in_header_and_footer(tmp_path, monkeypatch, fake_pins):
    with Store(tmp_path / "r.db") as store:
        run = make_run(store, "bundle00run1", matrix={"ratio": [0.6, 2.0]}, repetitions=2, duration_s=2)
        monkeypatch.setattr(pb, "bundle_dir", lambda: tmp_path / "share")
        full = render_report(store, [run])  # nothing installed: the full bundle, and a warning under the page
        pb.install(tmp_path / "share", fetch=lambda url: fake_pins)
        partial = render_report(store, [run])
    assert "charts: plotly.js 4.1.1 (full bundle)" in full
    footer = full[full.index('<footer class="page">'):]
    assert '<p class="note warn">Charts: plotly.js 4.1.1, the full bundle of the plotly' in footer
    assert "is not installed: `make setup` installs the cartesian bundle" in footer
    assert "charts: plotly.js 4.1.1 (cartesian bundle)" in partial
    assert '<p class="note">Charts: plotly.js 4.1.1, Plotly&#x27;s cartesian bundle' in partial
    assert html.escape(_csp_hash(FAKE_JS)) in partial and html.escape(_csp_hash(FAKE_JS)) not in full
    assert len(partial) < len(full) / 2


# ------------------------------------------------------------------ installing (make setup)


def test_install_downloads_once_then_only_verifies(fake_pins, tmp_path):
    fetched = []
    path, did = pb.install(tmp_path / "share", fetch=lambda url: fetched.append(url) or fake_pins)
    assert did and fetched == [pb.TARBALL_URL]
    assert path == tmp_path / "share" / pb.FILE_NAME and path.read_text() == FAKE_JS
    assert pb.install(tmp_path / "share", fetch=never) == (path, False)
    assert [p.name for p in path.parent.iterdir()] == [pb.FILE_NAME], "no temporary file left behind"


def test_install_replaces_an_altered_file(fake_pins, tmp_path):
    (tmp_path / pb.FILE_NAME).write_text("tampered")
    path, did = pb.install(tmp_path, fetch=lambda url: fake_pins)
    assert did and path.read_text() == FAKE_JS


def test_install_refuses_a_tarball_that_is_not_the_pinned_one(fake_pins, tmp_path):
    other = tarball(content=FAKE_JS + "// changed upstream\n")
    with pytest.raises(pb.BundleError) as err:
        pb.install(tmp_path, fetch=lambda url: other)
    msg = str(err.value)
    assert pb.TARBALL_URL in msg and "sha512" in msg and pb.TARBALL_INTEGRITY.split("-", 1)[1] in msg
    assert "pinned in src/vnetbench/report/plotly_bundle.py" in msg and "make setup" in msg
    assert not (tmp_path / pb.FILE_NAME).exists()


def test_install_refuses_a_file_that_is_not_the_pinned_one(monkeypatch, tmp_path):
    """The tarball matches its integrity, the file inside does not match its own pin."""
    tgz = tarball(content="something else")
    monkeypatch.setattr(pb, "TARBALL_INTEGRITY", integrity(tgz))
    with pytest.raises(pb.BundleError, match=r"plotly-cartesian.min.js has sha256 [0-9a-f]{64}, expected"):
        pb.install(tmp_path, fetch=lambda url: tgz)
    assert not (tmp_path / pb.FILE_NAME).exists()


def test_install_names_a_missing_member(monkeypatch, tmp_path):
    tgz = tarball(member="package/plotly.min.js")
    monkeypatch.setattr(pb, "TARBALL_INTEGRITY", integrity(tgz))
    with pytest.raises(pb.BundleError, match="cannot read package/plotly-cartesian.min.js from the tarball"):
        pb.install(tmp_path, fetch=lambda url: tgz)


def test_download_failure_says_what_setup_needs(monkeypatch):
    def refuse(url, timeout):
        raise urllib.error.URLError("Name or service not known")

    monkeypatch.setattr(pb.urllib.request, "urlopen", refuse)
    with pytest.raises(pb.BundleError, match=r"cannot download https://registry\.npmjs\.org/.*Name or service "
                                             r"not known.*needs the npm registry once"):
        pb.download()


def test_command_line_fails_clearly_and_is_idempotent(fake_pins, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(pb, "download", lambda url=pb.TARBALL_URL: tarball(content="not plotly"))
    assert pb.main(["install", "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: plotly.js-cartesian-dist-min 4.1.1: ") and "expected" in err
    assert pb.main(["check", "--dir", str(tmp_path)]) == 1
    assert "is not installed (run `make setup`)" in capsys.readouterr().out
    monkeypatch.setattr(pb, "download", lambda url=pb.TARBALL_URL: fake_pins)
    assert pb.main(["install", "--dir", str(tmp_path)]) == 0
    assert "downloaded and verified" in capsys.readouterr().out
    monkeypatch.setattr(pb, "download", never)
    assert pb.main(["install", "--dir", str(tmp_path)]) == 0
    assert "present and verified" in capsys.readouterr().out
    assert pb.main(["check", "--dir", str(tmp_path)]) == 0


# ------------------------------------------------------------------ packed blocks


def test_pack_round_trip_keeps_every_character():
    text = json_for_script({"a": "</script><!--", "b": "µs → ∞ \u2028 \U0001f600", "c": [1.5, None] * 1000})
    block = html_payload.pack(text)
    assert block["packed"] == "gzip+base64" and re.fullmatch(r"[A-Za-z0-9+/]*={0,2}", block["data"])
    assert html_payload.unpack(block) == text
    assert html_payload.unpack(json_for_script(block)) == text, "as the page carries it: JSON text"
    assert html_payload.pack(text) == block, "the same text packs to the same bytes (gzip mtime 0)"
    assert len(block["data"]) < len(text) / 4


def test_unpack_rejects_what_is_not_a_packed_block():
    for bad in ('{"charts": {}}', {"packed": "zstd", "data": ""}, "[]"):
        with pytest.raises(ValueError, match="not a packed block"):
            html_payload.unpack(bad)


def test_page_blocks_unpack_to_the_data_and_the_bundle_the_csp_allows(tmp_path):
    with Store(tmp_path / "r.db") as store:
        run = make_run(store, "pack0000run1", matrix={"ratio": [0.6, 2.0], "proto": ["udp", "tcp"]},
                       repetitions=3, duration_s=4, ping_interval_s=0.002)
        page = render_report(store, [run])
    blocks = dict(re.findall(r'<script type="application/json" id="(vnb-[a-z]+)">(.*?)</script>', page, re.S))
    assert set(blocks) == {"vnb-data", "vnb-plotly"}
    data_text = html_payload.unpack(blocks["vnb-data"])
    data = json.loads(data_text)
    assert data["charts"] and data["series"]["trials"]
    assert len(blocks["vnb-data"]) < len(data_text) / 2, "packing pays off for the chart data"
    js = html_payload.unpack(blocks["vnb-plotly"])
    assert js == pb.load().js
    csp = html.unescape(re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page).group(1))
    assert _csp_hash(js) in csp


def test_packed_page_has_no_byte_the_html_parser_could_misread(tmp_path):
    """Packed blocks are base64 inside JSON: nothing in them can close the element or start a comment."""
    with Store(tmp_path / "r.db") as store:
        run = make_run(store, "pack0000run2", name="</script><!--", matrix={"ratio": [0.6]}, repetitions=2,
                       duration_s=2)
        page = render_report(store, [run])
    for block in re.findall(r'<script type="application/json" id="vnb-[a-z]+">(.*?)</script>', page, re.S):
        assert re.fullmatch(r'\{"packed":"gzip\+base64","data":"[A-Za-z0-9+/]*={0,2}"\}', block)


def test_render_report_never_fails_for_a_broken_bundle_dir(tmp_path, monkeypatch):
    """An unreadable path (a directory where the file should be) is one more reason to fall back."""
    (tmp_path / pb.FILE_NAME).mkdir()
    monkeypatch.setattr(pb, "bundle_dir", lambda: Path(tmp_path))
    with Store(tmp_path / "r.db") as store:
        run = make_run(store, "pack0000run3", matrix={"ratio": [0.6]}, repetitions=2, duration_s=2)
        page = render_report(store, [run])
    assert "(full bundle)" in page and "cannot be read" in page
