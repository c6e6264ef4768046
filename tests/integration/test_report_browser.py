"""The HTML report in a real browser: Debian's headless chromium driven by Playwright.

What a user would notice is checked: every chart is drawn, nothing is logged to
the console, the comparison table sorts and filters, the trial selector
switches trials, a malicious label stays text, and the page asks the network
for nothing (any request other than the report file itself fails the test).
Screenshots go to test-artifacts/.

The synthetic tests need no root; ``test_real_congestion_run_report`` runs a
short ``congestion`` twice through the CLI (root, ``lab`` marker) and opens the
comparison of the two runs.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from browser import (READY_TIMEOUT_MS, assert_all_charts_drawn, check_comparison_table, check_trial_selector, chromium,
                     needs_browser, open_report, screenshot)
from helpers import cli, run_id_of
from vnetbench.report import plotly_bundle
from vnetbench.report.html import write_report
from vnetbench.report.html_synthetic import make_run
from vnetbench.store.db import Store

pytestmark = needs_browser


# ------------------------------------------------------------------ synthetic runs


@pytest.fixture
def synthetic_reports(tmp_path: Path) -> dict[str, Path]:
    with Store(tmp_path / "r.db") as store:
        matrix = {"ratio": [0.4, 0.8, 1.0, 1.2, 2.0, 4.0], "proto": ["udp", "tcp"]}
        a = make_run(store, "synth0base01", matrix=matrix, repetitions=6, duration_s=5, ping_interval_s=0.002,
                     seed=1, fail_every=23)
        b = make_run(store, "synth0new002", matrix=matrix, repetitions=6, duration_s=5, ping_interval_s=0.002,
                     seed=2, scale={"throughput.rx_mbps": 0.88, "rtt.avg_ms": 1.25},
                     fingerprint={"kernel": "6.13.0-rc1"})
        return {"compare": write_report(store, [a, b], tmp_path / "compare.html"),
                "single": write_report(store, [a], tmp_path / "single.html")}


def test_synthetic_comparison_report_in_chromium(synthetic_reports):
    with chromium() as ctx:
        page, watch = open_report(ctx, synthetic_reports["compare"])
        n = assert_all_charts_drawn(page, watch)
        assert n >= 30
        screenshot(page, "report-synthetic-compare.png")
        check_comparison_table(page)
        check_trial_selector(page)
        # Printing: navigation and controls disappear, charts stay.
        page.emulate_media(media="print")
        assert not page.locator("nav.toc").is_visible()
        assert page.locator("[data-chart] .main-svg").first.is_visible()
        assert not watch.errors, watch.errors
        assert not watch.foreign_requests, watch.foreign_requests


def test_synthetic_single_run_report_in_chromium(synthetic_reports):
    with chromium() as ctx:
        page, watch = open_report(ctx, synthetic_reports["single"])
        assert_all_charts_drawn(page, watch)
        assert page.locator("#cmp-table").count() == 0
        check_trial_selector(page)
        screenshot(page, "report-synthetic-single.png")
        assert not watch.errors, watch.errors


def test_facet_selector_redraws_every_chart(tmp_path):
    matrix = {"ratio": [0.6, 1.0, 2.0], "delay": ["0ms", "10ms", "20ms", "30ms", "40ms", "50ms", "60ms",
                                                  "70ms", "80ms"], "proto": ["udp", "tcp"]}
    with Store(tmp_path / "r.db") as store:
        run = make_run(store, "facet000run1", matrix=matrix, repetitions=2, duration_s=2, series=False)
        path = write_report(store, [run], tmp_path / "facets.html")
    with chromium() as ctx:
        page, watch = open_report(ctx, path)
        assert_all_charts_drawn(page, watch)
        options = page.locator("#facet option")
        assert options.count() > 1
        page.select_option("#facet", options.nth(1).get_attribute("value"))
        page.wait_for_function("() => document.documentElement.getAttribute('data-vnb-charts') === 'done'",
                               timeout=READY_TIMEOUT_MS)
        assert_all_charts_drawn(page, watch)


# ------------------------------------------------------------------ hostile labels

PAYLOADS = [
    "<script>window.__pwned = 1; alert(1)</script>",
    '"><img src=x onerror="window.__pwned = 2; alert(2)">',
    "</script><svg onload=\"window.__pwned = 3; alert(3)\">",
]


@pytest.mark.parametrize("bypass_csp", [False, True], ids=["with-csp", "escaping-alone"])
def test_malicious_labels_do_not_execute(tmp_path, bypass_csp):
    """Nothing runs, with the page's Content Security Policy and without it (escaping alone)."""
    with Store(tmp_path / "r.db") as store:
        run = make_run(store, "evil00000001", name=f"evil {PAYLOADS[0]}", description=PAYLOADS[1],
                       matrix={"ratio": [0.6, 2.0], "env": PAYLOADS[:2], PAYLOADS[2]: ["a"]},
                       repetitions=3, duration_s=2, fail_every=4, fingerprint={"kernel": PAYLOADS[2]})
        other = make_run(store, "evil00000002", name="other", description="x",
                         matrix={"ratio": [0.6, 2.0], "env": PAYLOADS[:2], PAYLOADS[2]: ["a"]},
                         repetitions=3, duration_s=2, seed=5)
        path = write_report(store, [run, other], tmp_path / "evil.html")
    with chromium(bypass_csp=bypass_csp) as ctx:
        page, watch = open_report(ctx, path)
        assert page.evaluate("() => window.__pwned") is None, "an injected script ran"
        assert not watch.dialogs, f"alert() ran: {watch.dialogs}"
        assert page.locator("img").count() == 0
        assert page.evaluate("() => document.querySelectorAll('script').length") == 3
        text = page.evaluate("() => document.body.innerText")
        for p in PAYLOADS:
            assert p in text, f"the label {p!r} is not shown as text"
        assert page.title().startswith("vnetbench report: evil <script>")
        # In the charts the labels are text too (plotly's pseudo-HTML gets them escaped).
        svg_text = " ".join(page.locator(".main-svg text").all_text_contents())
        assert PAYLOADS[0] in svg_text
        assert_all_charts_drawn(page, watch)
        screenshot(page, f"report-malicious-{'csp' if not bypass_csp else 'nocsp'}.png")


# ------------------------------------------------------------------ a real run


def _vnetbench_available() -> str | None:
    try:
        proc = cli("run", "--help", check=False, timeout=60)
    except Exception as e:  # noqa: BLE001 - any failure means: no usable CLI yet
        return f"vnetbench CLI not usable: {e}"
    return None if proc.returncode == 0 else f"`vnetbench run --help` exited {proc.returncode}: {proc.stderr[-300:]}"


@pytest.mark.lab
def test_real_congestion_run_report(tmp_path, no_leftovers):
    """Two short `congestion` runs (the second with half the bottleneck), their report in chromium."""
    problem = _vnetbench_available()
    if problem:
        pytest.skip(problem)
    if os.geteuid() != 0:
        pytest.skip("the lab needs root")
    for tool in ("iperf3", "ping", "tc", "ip"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    db = tmp_path / "real.db"
    common = ["congestion", "--db", str(db), "--set", "ratios=[0.6,2.0]", "--set", "duration=2s",
              "--set", "omit=1s", "--set", "repetitions=1", "--no-progress"]
    single = tmp_path / "single.html"
    a = run_id_of(cli("run", *common, "--report", str(single), timeout=900))
    b = run_id_of(cli("run", *common, "--set", "bottleneck=50Mbit", timeout=900))
    assert single.exists() and single.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    path = tmp_path / "real-compare.html"
    assert cli("report", a, b, "--db", str(db), "-o", str(path)).stdout.strip() == f"report: {path}"
    with Store(db) as store:
        rx = {c["labels"]["ratio"]: c for c in store.configurations(b)}
        assert rx[2.0]["expected"]["throughput.rx_mbps"] == pytest.approx(50.0)
    with chromium() as ctx:
        page, watch = open_report(ctx, path)
        assert_all_charts_drawn(page, watch)
        screenshot(page, "report-congestion.png")
        text = page.evaluate("() => document.body.innerText")
        assert "bottleneck" in text and "fingerprint" in text.lower()
        assert "What it cost" in text  # lab trials measure CPU: throughput against it, drawn like the others
        check_comparison_table(page)
        check_trial_selector(page)
        assert not watch.errors, watch.errors
        assert not watch.foreign_requests, watch.foreign_requests


# ------------------------------------------------------------------ which plotly.js


def _small_report(tmp_path: Path) -> Path:
    with Store(tmp_path / "r.db") as store:
        run = make_run(store, "bundle000run", matrix={"ratio": [0.6, 1.0, 2.0], "proto": ["udp", "tcp"]},
                       repetitions=4, duration_s=3, ping_interval_s=0.01, seed=3)
        return write_report(store, [run], tmp_path / "bundle.html")


def _plotly_in_page(page) -> dict:
    return page.evaluate("""() => ({version: window.Plotly.version,
        traces: Object.keys(window.Plotly.PlotSchema.get().traces),
        boxes: document.querySelectorAll('.boxlayer .trace').length,
        scripts: document.querySelectorAll('script').length})""")


def test_report_draws_with_the_cartesian_bundle(tmp_path):
    """What `make setup` installs: Plotly's cartesian bundle, packed, run by its hash under the CSP."""
    problem = plotly_bundle.problem()
    if problem:
        pytest.fail(f"{problem}: run `make setup` (or `python -m vnetbench.report.plotly_bundle install`)")
    path = _small_report(tmp_path)
    assert "(cartesian bundle)" in path.read_text(encoding="utf-8")
    with chromium() as ctx:
        page, watch = open_report(ctx, path)
        assert_all_charts_drawn(page, watch)
        got = _plotly_in_page(page)
        assert got["version"] == plotly_bundle.VERSION
        assert {"scatter", "box"} <= set(got["traces"]) and "scattergeo" not in got["traces"], got["traces"]
        assert got["boxes"] > 0 and got["scripts"] == 3
        check_trial_selector(page)
        assert not watch.errors, watch.errors


def test_report_draws_with_the_full_bundle_when_the_cartesian_one_is_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(plotly_bundle, "bundle_dir", lambda: tmp_path / "nothing-installed")
    path = _small_report(tmp_path)
    assert "(full bundle)" in path.read_text(encoding="utf-8")
    with chromium() as ctx:
        page, watch = open_report(ctx, path)
        assert_all_charts_drawn(page, watch)
        got = _plotly_in_page(page)
        assert got["version"] == plotly_bundle.VERSION and "scattergeo" in got["traces"]
        assert "the full bundle of the plotly" in page.locator("footer.page").inner_text()
        assert not watch.errors, watch.errors


def test_a_browser_that_cannot_unpack_says_so_in_every_chart(tmp_path):
    path = _small_report(tmp_path)
    with chromium() as ctx:
        ctx.add_init_script("delete window.DecompressionStream;")
        page, watch = open_report(ctx, path)
        assert page.evaluate("() => document.documentElement.getAttribute('data-vnb-charts')") == "error"
        texts = page.locator("[data-chart]").all_text_contents()
        assert texts and all("no DecompressionStream" in t and "Firefox 113" in t for t in texts), texts
        assert not watch.foreign_requests
