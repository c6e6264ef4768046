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

import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from helpers import ROOT, cli, run_id_of
from vnetbench.report.html import write_report
from vnetbench.report.html_synthetic import make_run
from vnetbench.store.db import Store

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = ROOT / "test-artifacts"
READY_TIMEOUT_MS = 180_000

playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright (python) is not installed")
pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} not found (apt install chromium)")


# ------------------------------------------------------------------ browser plumbing


@dataclass
class Watch:
    """What the page did: console errors, uncaught errors, requests, dialogs."""

    url: str
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)

    @property
    def foreign_requests(self) -> list[str]:
        return [u for u in self.requests if u != self.url and not u.startswith(("data:", "blob:"))]


@contextlib.contextmanager
def chromium(bypass_csp: bool = False):
    """A fresh headless chromium with its own throw-away profile."""
    with playwright_api.sync_playwright() as p, tempfile.TemporaryDirectory(prefix="vnb-chromium-") as profile:
        ctx = p.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1366, "height": 900}, bypass_csp=bypass_csp, offline=True)
        try:
            yield ctx
        finally:
            ctx.close()


def open_report(ctx, path: Path):
    url = path.resolve().as_uri()
    watch = Watch(url)
    page = ctx.new_page()
    page.on("console", lambda m: watch.errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: watch.errors.append(f"uncaught: {e}"))
    page.on("request", lambda r: watch.requests.append(r.url))

    def on_dialog(d):
        watch.dialogs.append(d.message)
        d.dismiss()

    page.on("dialog", on_dialog)
    # Anything but the report itself is refused (and recorded above).
    ctx.route("**/*", lambda route: route.continue_() if route.request.url == url else route.abort())
    page.goto(url)
    page.wait_for_function("() => document.documentElement.getAttribute('data-vnb-charts') !== 'pending'",
                           timeout=READY_TIMEOUT_MS)
    return page, watch


def assert_all_charts_drawn(page, watch: Watch) -> int:
    state = page.evaluate("() => document.documentElement.getAttribute('data-vnb-charts')")
    status = page.evaluate("() => window.vnbStatus")
    assert state == "done", f"charts: {state}, {status}"
    charts = page.evaluate("""() => Array.from(document.querySelectorAll('[data-chart]')).map(el => ({
        id: el.dataset.chart, rendered: el.dataset.rendered,
        svg: !!el.querySelector('.main-svg'),
        traces: el.querySelectorAll('.trace, .boxlayer path, .scatterlayer path').length
    }))""")
    assert charts, "the report has charts"
    bad = [c for c in charts if c["rendered"] != "1" or not c["svg"]]
    assert not bad, f"chart containers without a rendered plot: {bad}"
    empty = [c["id"] for c in charts if c["traces"] == 0]
    assert not empty, f"charts drawn without any data: {empty}"
    assert not watch.errors, watch.errors
    assert not watch.foreign_requests, f"the page requested {watch.foreign_requests}"
    return len(charts)


def column_values(page, header: str) -> list[str]:
    return page.evaluate("""(header) => {
        const t = document.getElementById('cmp-table');
        const col = Array.from(t.tHead.rows[0].cells).findIndex(th => th.textContent.trim().startsWith(header));
        return Array.from(t.tBodies[0].rows).filter(r => !r.hidden)
            .map(r => r.cells[col].dataset.v ?? r.cells[col].textContent);
    }""", header)


def check_comparison_table(page) -> None:
    """Sorting by a numeric column, both ways; filtering by text and by verdict."""
    assert page.locator("#cmp-table tbody tr").count() > 0
    verdicts = column_values(page, "Verdict")
    assert verdicts == sorted(verdicts, key=float), "regressions first, as delivered"

    change = page.locator("#cmp-table thead th", has_text="Change").locator("button")
    change.click()
    nums = [float(v) for v in column_values(page, "Change") if v != ""]
    assert nums == sorted(nums), "ascending after one click"
    assert page.locator("#cmp-table thead th", has_text="Change").get_attribute("aria-sort") == "ascending"
    change.click()
    nums = [float(v) for v in column_values(page, "Change") if v != ""]
    assert nums == sorted(nums, reverse=True), "descending after a second click"
    metric = page.locator("#cmp-table thead th", has_text="Metric").locator("button")
    metric.click()
    names = column_values(page, "Metric")
    assert names == sorted(names, key=str.lower)

    total = page.locator("#cmp-table tbody tr").count()
    page.fill("#cmp-filter", "rtt.avg")
    visible = page.locator("#cmp-table tbody tr:not([hidden])")
    assert 0 < visible.count() < total
    assert all("rtt.avg" in t for t in visible.all_text_contents())
    assert page.locator("#cmp-count").text_content() == f"showing {visible.count()} of {total} rows"
    page.fill("#cmp-filter", "")
    for box in page.locator(".cmp-verdict").all():
        if box.get_attribute("value") != "regressed":
            box.uncheck()
    shown = page.locator("#cmp-table tbody tr:not([hidden])")
    assert all(v == "regressed" for v in (r.get_attribute("data-verdict") for r in shown.all()))
    for box in page.locator(".cmp-verdict").all():
        box.check()


def check_trial_selector(page) -> None:
    before = page.locator("#ts-status").text_content()
    page.click("#ts-next")
    page.wait_for_function("(b) => document.getElementById('ts-status').textContent !== b", arg=before)
    assert page.locator("#chart-timeseries .main-svg").count() >= 1
    assert page.locator("#chart-timeseries .scatterlayer .trace").count() >= 2
    options = page.locator("#ts-config option").count()
    if options > 1:
        value = page.locator("#ts-config option").nth(options - 1).get_attribute("value")
        page.select_option("#ts-config", value)
        assert page.locator("#ts-status").text_content().startswith(
            page.locator("#ts-config option").nth(options - 1).text_content())


def screenshot(page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path), full_page=True)
    return path


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
    with Store(db) as store:
        path = write_report(store, [a, b], tmp_path / "real-compare.html")
        rx = {c["labels"]["ratio"]: c for c in store.configurations(b)}
        assert rx[2.0]["expected"]["throughput.rx_mbps"] == pytest.approx(50.0)
    with chromium() as ctx:
        page, watch = open_report(ctx, path)
        assert_all_charts_drawn(page, watch)
        screenshot(page, "report-congestion.png")
        text = page.evaluate("() => document.body.innerText")
        assert "bottleneck" in text and "fingerprint" in text.lower()
        check_comparison_table(page)
        check_trial_selector(page)
        assert not watch.errors, watch.errors
        assert not watch.foreign_requests, watch.foreign_requests
