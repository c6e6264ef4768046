"""Debian's headless chromium driven by Playwright, for the tests that open a report as a user would.

Every chart must be drawn, nothing logged to the console, and the page may ask the network for nothing:
any request other than the report file itself is refused and recorded. Screenshots go to test-artifacts/.
"""

from __future__ import annotations

import contextlib
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from helpers import ROOT

try:
    import playwright.sync_api as playwright_api
except ImportError:  # the tests that need it say so through needs_browser
    playwright_api = None

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = ROOT / "test-artifacts"
READY_TIMEOUT_MS = 180_000


def _browser_missing() -> str | None:
    if playwright_api is None:
        return "playwright (python) is not installed (make setup)"
    if not Path(CHROMIUM).exists():
        return f"{CHROMIUM} not found (apt install chromium)"
    return None


needs_browser = pytest.mark.skipif(_browser_missing() is not None, reason=_browser_missing() or "")


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


def check_comparison_table(page, filter_text: str = "rtt.avg") -> None:
    """Sorting by a numeric column, both ways; filtering by text (`filter_text`, a metric some rows have)
    and by verdict."""
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
    page.fill("#cmp-filter", filter_text)
    visible = page.locator("#cmp-table tbody tr:not([hidden])")
    assert 0 < visible.count() < total
    assert all(filter_text in t for t in visible.all_text_contents())
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
