"""The docs (issue 32): generated reference pages are current, every TOML example plans and validates, the site
builds with warnings as errors, and the README stays a front door."""

from __future__ import annotations

import copy
import functools
import http.server
import re
import socketserver
import subprocess
import sys
import threading
import tomllib

import pytest

import browser
from browser import needs_browser
from helpers import ROOT
from vnetbench import docsgen
from vnetbench.runner import preview
from vnetbench.scenario import load as L
from vnetbench.scenario.schema import scenario_schema
from vnetbench.workloads import iperf3, registry
from vnetbench.workloads.base import WorkloadOptions

DOCS = ROOT / "docs"
README = ROOT / "README.md"
MINIMAL = 'name = "example"\n[workload.stream]\ntool = "iperf3"\n'
MARK = re.compile(r"<!--\s*example:\s*(?P<what>.*?)\s*-->")


def test_every_test_the_threat_model_names_exists():
    # the page says which tests hold each guarantee: a renamed or deleted test must not leave it naming nothing
    page = (ROOT / "docs" / "explanation" / "threat-model.md").read_text()
    named = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", page)
    assert len(named) >= 20, named
    missing = [f"{f}::{t}" for f, t in named
               if not re.search(rf"^\s*def {t}\(", (ROOT / f).read_text(), re.M)]
    assert not missing, f"docs/explanation/threat-model.md names tests that do not exist: {missing}"
    sections = page.split("## What tests each guarantee")[1].split("\n- ")[1:]
    assert len(sections) >= 10 and all("::test_" in section for section in sections), sections


def test_generated_pages_are_current():
    stale = docsgen.stale(ROOT)
    assert not stale, f"out of date: {', '.join(stale)}; run `python -m vnetbench.docsgen` and commit the pages"


def test_docsgen_check_says_which_page_is_stale(tmp_path):
    for rel, text in docsgen.pages().items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    (tmp_path / "docs/reference/metrics.md").write_text("# edited by hand\n")
    proc = subprocess.run([sys.executable, "-m", "vnetbench.docsgen", "--check", "--root", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "out of date: docs/reference/metrics.md" in proc.stdout, proc


def test_every_scenario_key_and_option_says_what_it_is():
    """The reference is made of these descriptions: a key without one is a blank cell."""
    models = [m for _, m in docsgen.SCENARIO_SECTIONS] + [WorkloadOptions, iperf3.FlowTiming,
                                                          *registry.options_models().values()]
    blank = [f"{m.__module__}.{m.__qualname__}.{k}" for m in models for k, f in m.model_fields.items()
             if not f.description and k != "tool"]
    assert not blank, f"give these fields a description: {blank}"


def test_the_scenario_page_has_a_section_for_every_table_of_the_schema():
    defs = set(scenario_schema()["$defs"])
    covered = {m.__name__ for _, m in docsgen.SCENARIO_SECTIONS} | {"FlowTiming"} | \
        {f"workload_{t}" for t in registry.drivers()}
    assert defs <= covered, f"no section for {sorted(defs - covered)}: add it to docsgen.SCENARIO_SECTIONS"


def _examples() -> list[tuple[str, int, str, str | None]]:
    """(file, line, TOML text, what its marker says) of every ```toml block of the docs and the README."""
    out = []
    for path in [README, *sorted(DOCS.rglob("*.md"))]:
        lines = path.read_text(encoding="utf-8").splitlines()
        i = 0
        while i < len(lines):
            if lines[i].strip() == "```toml":
                start = i
                before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
                marker = MARK.search(before)
                i += 1
                body = []
                while lines[i].strip() != "```":
                    body.append(lines[i])
                    i += 1
                out.append((str(path.relative_to(ROOT)), start + 1, "\n".join(body) + "\n",
                            marker.group("what") if marker else None))
            i += 1
    return out


EXAMPLES = _examples()


def _merged(base: dict, fragment: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in fragment.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _scenario_of(text: str, marker: str | None) -> dict:
    raw = tomllib.loads(text)
    if marker and marker.startswith("fragment of "):
        base = marker.removeprefix("fragment of ").strip()
        return _merged(tomllib.loads(L.read_source(base)[1]), raw)
    if "name" in raw:
        return raw
    return _merged(tomllib.loads(MINIMAL), raw)


def test_there_are_examples_to_check():
    files = {f for f, *_ in EXAMPLES}
    assert "README.md" in files and "docs/how-to/scenario-files.md" in files and len(EXAMPLES) >= 15


IDS = [f"{f}:{n}" for f, n, *_ in EXAMPLES]


@pytest.mark.parametrize("where, line, text, marker", EXAMPLES, ids=IDS)
def test_every_toml_example_plans(where, line, text, marker, monkeypatch):
    """As `vnetbench plan` checks a file, without root: nothing is probed, built or written."""
    monkeypatch.setattr(preview.os, "geteuid", lambda: 1000)
    source = f"{where}:{line}"
    plan = preview.make_plan(L.load_data(_scenario_of(text, marker), text, source))
    assert plan.configurations, source


@pytest.mark.parametrize("where, line, text, marker", EXAMPLES, ids=IDS)
def test_every_toml_example_validates_against_the_schema(where, line, text, marker):
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is in the test extras: pip install -e '.[test]'")
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message[:200]}"
              for e in jsonschema.Draft202012Validator(scenario_schema()).iter_errors(_scenario_of(text, marker))]
    assert not errors, f"{where}:{line}: the schema marks {errors}"


def test_a_marker_names_a_builtin():
    for where, line, _, marker in EXAMPLES:
        if marker and marker.startswith("fragment of "):
            assert marker.removeprefix("fragment of ") in L.builtin_names(), f"{where}:{line}: {marker}"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The docs site, built once for this module with warnings as errors."""
    pytest.importorskip("mkdocs", reason="MkDocs is in the test extras: pip install -e '.[test]'")
    pytest.importorskip("material", reason="the Material theme is in the test extras: pip install -e '.[test]'")
    out = tmp_path_factory.mktemp("docs") / "site"
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out),
                           "--config-file", str(ROOT / "mkdocs.yml")], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def test_the_site_builds_with_warnings_as_errors(site):
    for page in ("index.html", "tutorial.html", "reference/cli.html", "reference/scenario.html",
                 "reproductions/seed-000.html"):  # page.html: readable from the file system
        assert (site / page).exists(), page
    assert (site / "reference" / "scenario.schema.json").exists()
    assert (site / "search" / "search_index.json").exists()
    # nothing outside the site: no web fonts, no scripts or styles from elsewhere
    outside = {m for html in site.rglob("*.html")
               for m in re.findall(r'(?:src|href)="(https?://[^"]+)"', html.read_text(encoding="utf-8"))
               if re.search(r"\.(js|css|woff2?)(\?|$)|fonts\.", m)}
    assert not outside, outside


@needs_browser
def test_the_site_renders_and_searches_offline_in_a_browser(site):
    """As a reader would: the site served from 127.0.0.1 (search runs only on pages served over HTTP), opened in
    headless chromium that may fetch nothing else; a page renders with its navigation, and typing a word into
    the search box lists the pages that have it, with no console error."""
    handler = functools.partial(_QuietHandler, directory=str(site))
    with socketserver.TCPServer(("127.0.0.1", 0), handler) as httpd:
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        base = f"http://127.0.0.1:{httpd.server_address[1]}/"
        try:
            with browser.playwright_api.sync_playwright() as p:
                chromium = p.chromium.launch(executable_path=browser.CHROMIUM, headless=True,
                                             args=browser.CHROMIUM_ARGS)
                ctx = chromium.new_context(viewport={"width": 1366, "height": 900})
                outside: list[str] = []
                ctx.route("**/*", lambda route: route.continue_() if route.request.url.startswith(base)
                          else (outside.append(route.request.url), route.abort()))
                page = ctx.new_page()
                errors: list[str] = []
                page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.goto(base + "tutorial.html")
                assert page.title() == "Tutorial - vnetbench"
                assert "regression gate" in page.locator("article h1").inner_text()
                assert page.locator("nav.md-nav--primary a.md-nav__link").count() > 20
                page.wait_for_load_state("networkidle")  # the search worker has its index
                page.locator("input.md-search__input").click()
                page.keyboard.type("fairness", delay=20)
                page.wait_for_selector("li.md-search-result__item", timeout=15_000)
                hits = page.locator("li.md-search-result__item").all_inner_texts()
                assert any("jain_fairness" in h for h in hits), hits
                assert not errors, errors
                assert not outside, outside
                chromium.close()
        finally:
            httpd.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def test_the_readme_is_a_front_door():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    # the two set-up commands, as they were
    assert "make demo   # installs what is missing, runs the built-in `quick` scenario (~90 s)," in text
    assert "make test   # installs the same and runs the whole test suite" in text
    for command in ("plan", "run", "show", "compare", "report"):
        assert f"vnetbench {command} " in text
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), f"README links to {target}, which is not there"
