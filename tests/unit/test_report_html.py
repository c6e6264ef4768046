"""The HTML report without a browser: content, escaping, self-containment, data for the charts.

Runs are built through the Store API with :mod:`vnetbench.report.html_synthetic`
(seeded numbers that follow the congestion physics), so no lab is needed.
The browser-side checks are in tests/integration/test_report_browser.py.
"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from vnetbench.report import html_model, plotly_bundle
from vnetbench.report.html_payload import unpack
from vnetbench.report.html import _csp_hash, render_report, write_report
from vnetbench.report.html_synthetic import make_run
from vnetbench.stats.compare import compare_metrics
from vnetbench.store.db import SampleRecord, SeriesRecord, Store, TrialRecord

XSS_SCRIPT = "<script>alert(1)</script>"
XSS_IMG = '"><img src=x onerror=alert(2)>'
XSS_SVG = "</script><svg onload=alert(3)>"


# ------------------------------------------------------------------ fixtures


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "r.db")
    yield s
    s.close()


@pytest.fixture
def one_run(store: Store) -> tuple[Store, str]:
    run = make_run(store, "run0000aaaa", matrix={"ratio": [0.6, 1.0, 2.0], "proto": ["udp", "tcp"]},
                   repetitions=6, duration_s=3, ping_interval_s=0.01, seed=1, fail_every=11)
    return store, run


@pytest.fixture
def two_runs(store: Store) -> tuple[Store, str, str]:
    matrix = {"ratio": [0.6, 2.0], "proto": ["udp", "tcp"]}
    a = make_run(store, "base0000aaaa", matrix=matrix, repetitions=8, duration_s=3, seed=1)
    b = make_run(store, "new00000bbbb", matrix=matrix, repetitions=8, duration_s=3, seed=2,
                 scale={"throughput.rx_mbps": 0.8}, fingerprint={"kernel": "6.13.0-rc1"})
    return store, a, b


class Tags(HTMLParser):
    """Every start tag with its attributes, and the text outside <script> and <style>."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag in ("script", "style"):
            self._skip += 1

    def handle_endtag(self, tag):
        if tag in ("script", "style"):
            self._skip -= 1

    def handle_data(self, data):
        if not self._skip:
            self.text.append(data)


def parse(page: str) -> Tags:
    p = Tags()
    p.feed(page)
    return p


def page_data(page: str) -> dict:
    """The chart data as the page script sees it, unpacked (gzip + base64, see html_payload)."""
    m = re.search(r'<script type="application/json" id="vnb-data">(.*?)</script>', page, re.S)
    assert m, "the page carries its data in one application/json script"
    return json.loads(unpack(m.group(1)))


def chart_specs(data: dict, prefix: str) -> list[dict]:
    out = []
    for cid, spec in data["charts"].items():
        if cid.startswith(prefix):
            out.extend(spec["facets"].values() if "facets" in spec else [spec])
    return out


# ------------------------------------------------------------------ the file


def test_write_report_returns_the_path_and_accepts_prefixes(one_run, tmp_path):
    store, run = one_run
    out = write_report(store, [run[:6]], str(tmp_path / "sub" / "report.html"))
    assert out == tmp_path / "sub" / "report.html"
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert write_report(store, ["last"], tmp_path / "again.html").exists()


def test_page_is_self_contained(one_run):
    store, run = one_run
    page = render_report(store, [run])
    tags = parse(page).tags
    scripts = [a for t, a in tags if t == "script"]
    assert len(scripts) == 3, "data, plotly.js and the page script; nothing else"
    assert all("src" not in a for a in scripts)
    assert not [t for t, a in tags if t in ("link", "iframe", "object", "embed", "img", "audio", "video")]
    plotly_js = unpack(re.search(r'<script type="application/json" id="vnb-plotly">(.*?)</script>', page,
                                 re.S).group(1))
    assert plotly_js == plotly_bundle.load().js, "plotly.js is inlined once, packed, as the bundle chosen"
    # No stylesheet or font from elsewhere.
    css = re.search(r"<style>(.*?)</style>", page, re.S).group(1)
    assert "@import" not in css and "url(" not in css
    # A Content Security Policy that forbids any request and any other script.
    csp = next(a["content"] for t, a in tags if t == "meta" and a.get("http-equiv") == "Content-Security-Policy")
    assert "default-src 'none'" in csp and "connect-src 'none'" in csp
    assert "unsafe-inline" not in csp.split("script-src")[1].split(";")[0]
    assert len(re.findall(r"'sha256-[A-Za-z0-9+/=]+'", csp)) == 2
    assert _csp_hash(plotly_js) in csp, "the page script may run the unpacked plotly.js, by its hash"


def test_sections_and_what_ran(one_run):
    store, run = one_run
    page = render_report(store, [run])
    for sid in ("headline", "glance", "what-ran", "distributions", "sweep", "cdf", "timeseries"):
        assert f'<section id="{sid}">' in page
        assert f'href="#{sid}"' in page, "the table of contents links every section"
    text = " ".join(parse(page).text)
    assert "Synthetic over-subscribed bottleneck" in text  # description
    assert "[workload.stream]" in text  # scenario file text
    assert "6.12.48-amd64" in text and "iperf 3.12" in text  # fingerprint: kernel, tool versions
    assert "100 Mbit/s" in text and "500,000 B" in text  # qdisc as applied
    assert "Connection refused" in text and "timed out" in text  # failed trials with reasons
    assert '<svg class="topology"' in page
    assert "bottleneck 100 Mbit/s" in page


def headline(page: str) -> tuple[str, dict]:
    """The page's headline chart: (the key of its data in data.charts, that chart's spec of the first view),
    after checking that it is the first thing in <main>, before any table."""
    main = page[page.index("<main>"):]
    assert main.startswith('<main><section id="headline">'), "the page opens with the headline chart"
    chart = main.index('id="chart-headline"')
    assert chart < main.index("<table"), "the headline chart comes before the first table"
    assert page.index('id="chart-headline"') < page.index("<table"), "… of the whole page too"
    assert page.index('href="#headline"') < page.index('href="#glance"'), "first in the table of contents"
    cid = re.search(r'id="chart-headline" data-chart="([^"]+)"', page).group(1)
    spec = page_data(page)["charts"][cid]
    assert "headline" not in page_data(page)["charts"], "the chart is reused, its data not on the page twice"
    return cid, next(iter(spec["facets"].values()))


def test_headline_chart_of_a_swept_run_is_the_key_metric_with_theory(one_run):
    store, run = one_run
    page = render_report(store, [run])
    cid, spec = headline(page)
    assert cid.startswith("sweep-"), "a numeric label is swept: the key metric against it"
    assert "throughput.rx_mbps" in spec["layout"]["title"]["text"], "the scenario's default key metric"
    assert "over-subscription ratio" in spec["layout"]["xaxis"]["title"]["text"]
    assert [t for t in spec["data"] if t["name"].startswith("theory")], "with its theory line"
    assert "<h2>Key metric: throughput.rx_mbps against ratio</h2>" in page
    assert page.count(f'data-chart="{cid}"') == 2, "the same chart again in its own section"


def test_headline_chart_without_a_numeric_sweep_is_box_plots(store):
    run = make_run(store, "envonly00run", matrix={"env": ["bare", "container"], "proto": ["udp", "tcp"]},
                   repetitions=4, duration_s=2)
    page = render_report(store, [run])
    assert '<section id="sweep">' not in page
    cid, spec = headline(page)
    assert cid.startswith("box-")
    assert "throughput.rx_mbps" in spec["layout"]["title"]["text"]
    assert all(t["type"] == "box" for t in spec["data"])


def test_headline_chart_of_a_comparison_of_runs(two_runs):
    store, a, b = two_runs
    page = render_report(store, [a, b])
    cid, spec = headline(page)
    assert cid.startswith("sweep-") and "throughput.rx_mbps" in spec["layout"]["title"]["text"]
    lines = {t["name"] for t in spec["data"] if t.get("mode") == "lines+markers"}
    assert any(a[:8] in n for n in lines) and any(b[:8] in n for n in lines), "one line per run"


def test_headline_metric_is_the_scenarios_first_key_metric_when_measured(store):
    run = make_run(store, "keymetric0run", matrix={"ratio": [0.6, 2.0], "proto": ["udp"]}, repetitions=3,
                   duration_s=2, series=False)
    text = store.run(run)["scenario_text"]
    for key, shown in (('["rtt.p50_ms", "throughput.rx_mbps"]', "rtt.p50_ms"),
                       ('["rr.p50_us"]', "throughput.rx_mbps")):  # not measured: the first HEADLINE metric
        with store.conn:
            store.conn.execute("UPDATE runs SET scenario_text = ? WHERE id = ?",
                               (text.replace("[repeat]\n", f"[repeat]\nkey_metrics = {key}\n"), run))
        page = render_report(store, [run])
        _, spec = headline(page)
        assert shown in spec["layout"]["title"]["text"], key
        assert f"<h2>Key metric: {shown} against ratio</h2>" in page


def test_guests_under_software_emulation_are_called_out(store):
    run = make_run(store, "vmrun000aaaa", matrix={"env": ["bare", "vm"], "proto": ["tcp"]}, repetitions=3)
    assert "ran under TCG" not in render_report(store, [run])
    for c in store.configurations(run):
        host = {"accelerator": "tcg", "accelerator_reason": "KVM probe failed: failed to set MSR 0x10a"} \
            if c["labels"]["env"] == "vm" else {"netns": "vnb-x-r"}
        store.set_lab_state(run, c["key"], {**(c["lab_state"] or {}), "environment": {"hosts": {"r": host}}})
    text = " ".join(parse(render_report(store, [run])).text)
    assert "Guests of vm ran under TCG (software emulation), not KVM (KVM probe failed: failed to set MSR 0x10a)" \
        in text
    assert "Guests of bare" not in text


def test_a_run_that_shared_the_machine_is_called_out(store):
    quiet = {"monitored_s": 60.0, "load_at_start": [0.1, 0.1, 0.1], "load_max": [1.9, 1.2, 0.6],
             "load_at_end": [1.8, 1.2, 0.6], "other_processes_cores": 0.02, "busy_processes": [],
             "concurrent_runs": []}
    run = make_run(store, "quiet000aaaa", matrix={"proto": ["tcp"]}, repetitions=3,
                   fingerprint={"machine_load": [quiet]})
    text = " ".join(parse(render_report(store, [run])).text)
    assert "shared the machine" not in text
    assert "1-min load average at start / highest / end: 0.10 / 1.90 / 1.80" in text  # the fingerprint says it
    busy = {**quiet, "other_processes_cores": 0.8, "busy_processes": [{"pid": 42, "command": "stress-ng", "cores": 0.8}],
            "concurrent_runs": [{"run_id": "other0000001", "pid": 4242, "scenario": "quick"}]}
    run = make_run(store, "busy0000aaaa", matrix={"proto": ["tcp"]}, repetitions=3,
                   fingerprint={"machine_load": [quiet, busy], "allow_concurrent": True})
    text = " ".join(parse(render_report(store, [run])).text)
    assert ("This run shared the machine: it was started with --allow-concurrent; other vnetbench runs measured at "
            "the same time (other0000001 pid 4242); other processes used 0.80 of a core on average while it "
            "measured: stress-ng (pid 42, 0.80)") in text
    # two runs with different loads have the same setup: load is shown side by side, not counted as a difference
    both = render_report(store, ["quiet000aaaa", run])
    notes = re.findall(r'<p class="note warn">[^<]*setting[^<]*differ between the runs.*?</p>', both)
    assert "machine_load" in both and not any("machine_load" in n for n in notes), notes


def test_the_hosts_of_a_run_on_hosts_have_a_column_each(store):
    host = {"kernel": "6.1.0-28-amd64", "cpus": "8", "cpu model": "AMD EPYC", "interface": "eth1 (driver ixgbe, mtu 1500)",
            "tool iperf3": "iperf 3.12", "clock": {"offset_ms": 0.42, "uncertainty_ms": 0.8, "samples": 8}}
    run = make_run(store, "hosts000aaaa", matrix={"proto": ["tcp"]}, repetitions=3, fingerprint={
        "inventory": "lab.yml", "hosts": {"server-a": host, "client-1": {**host, "kernel": "6.12.9-amd64"}}})
    page = render_report(store, [run])
    text = "".join(parse(page).text)
    assert "From the inventory lab.yml; every host was checked over SSH" in text
    section = page[page.index("<h3>Hosts</h3>"):]
    table = section[:section.index("</table>")]
    rows = [["".join(parse(cell).text) for cell in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row)]
            for row in re.findall(r"<tr>(.*?)</tr>", table)]
    assert rows[0] == ["Fact", "server-a", "client-1"]
    by_fact = {r[0]: r[1:] for r in rows[1:]}
    assert by_fact["≠ kernel"] == ["6.1.0-28-amd64", "6.12.9-amd64"]  # the host unlike the other is marked
    assert by_fact["interface"] == ["eth1 (driver ixgbe, mtu 1500)"] * 2
    assert by_fact["clock"] == ["+0.4 ms ± 0.8 to the controller"] * 2
    # and not a second time, flattened, in the run's own fingerprint
    assert "hosts.server-a.kernel" not in text


# ------------------------------------------------------------------ escaping


def test_user_strings_are_escaped_everywhere(store):
    run = make_run(store, "evil0000run1", name=f"evil{XSS_SCRIPT}", description=f"desc {XSS_IMG}",
                   matrix={"ratio": [0.6, 2.0], "env": [XSS_SCRIPT, XSS_IMG], XSS_SVG: ["a", "b"]},
                   repetitions=3, duration_s=2, fail_every=5,
                   fingerprint={"kernel": XSS_SCRIPT, XSS_IMG: "x"})
    page = render_report(store, [run])
    for payload in (XSS_SCRIPT, XSS_IMG, XSS_SVG, "<img src=x", "<svg onload"):
        assert payload not in page, f"{payload!r} reached the page unescaped"
    parsed = parse(page)
    assert [t for t, _ in parsed.tags].count("script") == 3
    assert not [t for t, _ in parsed.tags if t == "img"]
    assert not [(t, a) for t, a in parsed.tags for k in a if k.startswith("on")], "no inline event handlers"
    text = " ".join(parsed.text)
    assert XSS_SCRIPT in text and XSS_IMG in text, "the labels read as typed"
    # In the chart data the same strings are HTML-escaped for plotly's pseudo-HTML, and the JSON holds no '<'.
    blob = re.search(r'id="vnb-data">(.*?)</script>', page, re.S).group(1)
    assert "<" not in blob and ">" not in blob
    inner = unpack(blob)
    assert "<" not in inner and ">" not in inner, "unpacked, it is the same inert JSON as before packing"
    data = json.loads(inner)
    box = chart_specs(data, "box-")[0]["layout"]
    assert box["legend"]["title"]["text"] == "&lt;/script&gt;&lt;svg onload=alert(3)&gt;"
    assert "&lt;script&gt;alert(1)&lt;/script&gt; / 0.6" in box["xaxis"]["categoryarray"]


def test_json_for_script_cannot_close_the_element():
    from vnetbench.report.html import json_for_script

    text = json_for_script({"a": "</script><!--<script>", "b": float("nan"), "c": "\u2028"})
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == {"a": "</script><!--<script>", "b": None, "c": "\u2028"}


# ------------------------------------------------------------------ charts


def test_every_chart_has_titles_and_units(one_run):
    store, run = one_run
    data = page_data(render_report(store, [run]))
    specs = chart_specs(data, "")
    assert specs
    for spec in specs:
        lay = spec["layout"]
        assert lay["title"]["text"]
        assert lay["xaxis"]["title"]["text"] and lay["yaxis"]["title"]["text"]
    rx = [s for s in chart_specs(data, "box-") if "throughput.rx_mbps" in s["layout"]["title"]["text"]][0]
    assert rx["layout"]["yaxis"]["title"]["text"] == "throughput.rx_mbps (Mbit/s)"
    assert "over-subscription ratio" in rx["layout"]["xaxis"]["title"]["text"]


def test_box_plots_show_every_trial_grouped_by_labels(one_run):
    store, run = one_run
    values = store.values(run)
    data = page_data(render_report(store, [run]))
    rx = [s for s in chart_specs(data, "box-") if "throughput.rx_mbps" in s["layout"]["title"]["text"]][0]
    assert {t["name"] for t in rx["data"]} == {"udp", "tcp"}, "one colour per proto, the fewest-valued label"
    assert all(t["type"] == "box" and t["boxpoints"] == "all" for t in rx["data"])
    n_points = sum(len(t["y"]) for t in rx["data"])
    assert n_points == sum(len(v["throughput.rx_mbps"]) for v in values.values())
    assert rx["layout"]["xaxis"]["categoryarray"] == ["0.6", "1", "2"], "numeric labels sort numerically"
    colours = {t["name"]: t["marker"]["color"] for t in rx["data"]}
    for spec in chart_specs(data, "box-"):
        for t in spec["data"]:
            assert t["marker"]["color"] == colours[t["name"]], "a configuration keeps its colour in every chart"


def test_sweep_has_median_ci_band_and_theory(one_run):
    store, run = one_run
    data = page_data(render_report(store, [run]))
    loss = [s for s in chart_specs(data, "sweep-") if "udp.loss_ratio" in s["layout"]["title"]["text"]][0]
    theory = [t for t in loss["data"] if t["name"].startswith("theory")]
    assert theory and theory[0]["name"] == "theory: 1 − 1/ratio"
    x, y = np.array(theory[0]["x"]), np.array(theory[0]["y"])
    assert np.allclose(y, np.maximum(0, 1 - 1 / x), atol=1e-5) and len(x) > 50, "a dense curve, not two points"
    bands = [t for t in loss["data"] if t.get("fill") == "toself"]
    assert bands, "95% CI band of the median (6 trials per configuration)"
    medians = [t for t in loss["data"] if t.get("mode") == "lines+markers"]
    assert medians[0]["x"] == [0.6, 1.0, 2.0]
    rx = [s for s in chart_specs(data, "sweep-") if "throughput.rx_mbps" in s["layout"]["title"]["text"]][0]
    th = [t for t in rx["data"] if t["name"].startswith("theory")][0]
    assert np.allclose(th["y"], np.minimum(th["x"], 1.0) * 100, atol=1e-3)
    rtt = [s for s in chart_specs(data, "sweep-") if "rtt.avg_ms" in s["layout"]["title"]["text"]][0]
    ref = [t for t in rtt["data"] if t["name"].startswith("full buffer")]
    assert ref and ref[0]["y"] == [40.0, 40.0], "queueing delay of a full buffer = buffer / rate"


def test_no_ci_band_below_six_trials(store):
    run = make_run(store, "few000trials", matrix={"ratio": [0.6, 2.0], "proto": ["udp"]}, repetitions=3,
                   duration_s=2)
    data = page_data(render_report(store, [run]))
    for spec in chart_specs(data, "sweep-"):
        assert not [t for t in spec["data"] if t.get("fill") == "toself"]
    assert "fewer than 6 trials" in render_report(store, [run])


def test_cdf_pools_every_packet(one_run):
    store, run = one_run
    data = page_data(render_report(store, [run]))
    cdf = chart_specs(data, "cdf")[0]
    assert len(cdf["data"]) == 6, "one line per configuration"
    for t in cdf["data"]:
        assert t["y"][-1] == 1.0 and np.all(np.diff(t["x"]) >= 0)
    assert cdf["layout"]["xaxis"]["title"]["text"] == "ping round-trip time (ms)"


def test_time_series_for_the_trial_selector(one_run):
    store, run = one_run
    data = page_data(render_report(store, [run]))
    s = data["series"]
    assert [r["id"] for r in s["rows"]] == ["throughput_mbps", "rtt_ms", "cwnd_bytes"]
    ok = [t for t in s["trials"] if t["status"] == "ok"]
    assert len(ok) == sum(1 for t in store.trials(run) if t["status"] == "ok")
    tcp = next(t for t in ok if any(s["kinds"][i["k"]]["kind"] == "cwnd_bytes" for i in t["series"]))
    stored = {r.name: r for r in store.series(next(
        x["id"] for x in store.trials(run) if x["status"] == "ok" and x["config_key"] ==
        next(e for e in store.configurations(run) if e["labels"]["proto"] == "tcp")["key"]))}
    assert {"cwnd_bytes/s1", "srtt_ms/s1", "throughput_mbps/s1", "rtt_ms"} <= set(stored)
    item = next(i for i in tcp["series"] if s["kinds"][i["k"]]["kind"] == "throughput_mbps")
    assert len(item["t"]) == 2, "per-second times are stored as t0 and dt"
    failed = [t for t in s["trials"] if t["status"] != "ok"]
    assert failed and all(t["reason"] for t in failed)


# ------------------------------------------------------------------ downsampling


def test_downsample_minmax_keeps_extremes_and_order():
    rng = np.random.default_rng(3)
    t = np.arange(20_000) * 0.001
    v = rng.normal(10, 1, t.size)
    v[12_345] = 500.0
    v[777] = -50.0
    v[5000] = np.nan
    td, vd = html_model.downsample_minmax(t, v, 2000)
    assert len(td) <= 2000 and np.all(np.diff(td) > 0)
    assert 500.0 in vd and -50.0 in vd
    assert td[0] == t[0] and td[-1] == t[-1]
    short_t, short_v = html_model.downsample_minmax(t[:100], v[:100], 2000)
    assert np.array_equal(short_v, v[:100])


def test_pack_round_trip_and_gaps():
    v = np.array([0.08, 40.0, np.nan, 12.345678, 39.9])
    out = html_model.unpack(html_model.pack(v))
    assert np.isnan(out[2])
    fin = ~np.isnan(v)
    assert np.allclose(out[fin], v[fin], atol=(40 - 0.08) / 65534)
    assert html_model.pack_time(np.arange(1.0, 21.0)) == [1.0, 1.0]
    irregular = np.array([0.0, 0.1, 0.25, 0.3])
    assert np.allclose(html_model.unpack(html_model.pack_time(irregular)), irregular, atol=1e-5)
    assert html_model.unpack(html_model.pack(np.full(3, 7.0))).tolist() == [7.0, 7.0, 7.0]


def test_series_cap_fills_the_budget():
    few = [(20, True)] * 10 + [(20_000, False)] * 4
    assert html_model.series_cap(few) == html_model.MAX_POINTS_PER_SERIES
    many = [(20, True)] * 18_000 + [(1850, False)] * 4000
    cap = html_model.series_cap(many)
    assert html_model.MIN_POINTS_PER_SERIES <= cap < 1850
    cost = 18_000 * 20 * 8 / 3 + 4000 * cap * 16 / 3
    assert cost <= html_model.SERIES_BYTE_BUDGET


def test_long_series_are_downsampled_and_the_page_says_so(store):
    run = "long00series"
    store.create_run(run, "long", "long.toml", 'name = "long"\n', "h", [], 1, {})
    store.add_configuration(run, "k1", {"proto": "udp"}, {}, {})
    t = np.arange(60_000) * 0.001
    v = np.full(t.size, 0.2)
    v[30_000] = 42.0
    store.record_trial(run, TrialRecord("k1", 0, 0, 0.0, 60.0, "ok", None, {}, [
        SampleRecord("rtt.avg_ms", 0.2, "ms", "lower")], [SeriesRecord("rtt_ms", "ms", t, v)]))
    page = render_report(store, [run])
    data = page_data(page)
    item = data["series"]["trials"][0]["series"][0]
    assert item["n"] == 60_000
    shown = html_model.unpack(item["v"])
    assert len(shown) <= html_model.MAX_POINTS_PER_SERIES and abs(shown.max() - 42.0) < 1e-3
    assert "downsampled" in page and "60000 points" in page
    cdf = chart_specs(data, "cdf")[0]["data"][0]
    assert cdf["x"][-1] == pytest.approx(42.0), "CDFs use every point"


# ------------------------------------------------------------------ comparison


def test_two_runs_compared_with_regressions_first(two_runs):
    store, a, b = two_runs
    page = render_report(store, [a, b])
    assert '<section id="comparison">' in page
    rows = re.findall(r'<tr data-verdict="(\w+)"', page)
    assert rows and rows[0] == "regressed"
    assert rows == sorted(rows, key=["regressed", "improved", "inconclusive", "unchanged"].index)
    first = page[page.index('<tr data-verdict="regressed"'):]
    first = first[:first.index("</tr>")]
    assert "throughput.rx_mbps" in first and "-2" in first, "20% less goodput is the regression"
    assert "▼" in first and "regressed" in first, "the verdict is text and a symbol, not colour alone"
    # Side by side: the fingerprint marks what differs.
    assert "6.13.0-rc1" in page and "differ between the runs" in page
    # Runs become the colour of the box plots, matched by configuration.
    data = page_data(page)
    rx = [s for s in chart_specs(data, "box-") if "throughput.rx_mbps" in s["layout"]["title"]["text"]][0]
    assert {t["name"] for t in rx["data"]} == {a[:8], b[:8]}


def test_run_ids_are_shortened_to_a_unique_prefix(store):
    a = make_run(store, "same0000aaaa", matrix={"proto": ["udp"]}, repetitions=2, duration_s=2, series=False)
    b = make_run(store, "same0000bbbb", matrix={"proto": ["udp"]}, repetitions=2, duration_s=2, series=False)
    m = html_model.load(store, [a, b])
    assert [r.short for r in m.runs] == ["same0000a", "same0000b"]


def test_given_comparison_is_shown(two_runs):
    store, a, b = two_runs
    va, vb = store.values(a), store.values(b)
    key = next(iter(va))
    res = compare_metrics([("throughput.rx_mbps", va[key]["throughput.rx_mbps"], vb[key]["throughput.rx_mbps"],
                            "higher", None)])
    given = {"a": "baseline-kernel", "b": "new-kernel",
             "configurations": [{"labels": {"ratio": 2.0, "proto": "<b>udp</b>"},
                                 "results": [r.to_dict() for r in res]}]}
    page = render_report(store, [a], comparison=given)
    assert "baseline-kernel → new-kernel" in page
    assert "proto=&lt;b&gt;udp&lt;/b&gt;" in page
    assert re.findall(r'<tr data-verdict="(\w+)"', page) == [res[0].verdict]


def test_comparison_report_of_vnetbench_compare_is_accepted(two_runs):
    analysis = pytest.importorskip("vnetbench.analysis")
    store, a, b = two_runs
    report = analysis.compare_runs(store, a, b)
    given = json.loads(json.dumps(report.to_dict()))  # as it would arrive from JSON
    page = render_report(store, [a, b], comparison=given)
    verdicts = re.findall(r'<tr data-verdict="(\w+)"', page)
    assert len(verdicts) == len(report.rows())
    assert sorted(verdicts) == sorted(r.verdict for _, r in report.rows())
    assert verdicts[0] == "regressed"
    assert "6.13.0-rc1" in page
    within = analysis.compare_within(store, a, "proto", "udp")
    page = render_report(store, [a], comparison=within.to_dict())
    assert "proto: udp → tcp" in page or "udp → tcp" in page


def test_within_run_comparison_against_the_reference_value(store):
    run = make_run(store, "env000000run", matrix={"ratio": [0.6, 2.0], "env": ["bare", "container"]},
                   repetitions=6, duration_s=2)
    page = render_report(store, [run])
    assert "Within the run: each env against env=bare" in page
    assert "env: bare → container" in page


def test_single_run_without_reference_has_no_comparison(one_run):
    store, run = one_run
    assert '<section id="comparison">' not in render_report(store, [run])


# ------------------------------------------------------------------ shapes of data


def test_many_configurations_are_faceted(store):
    matrix = {"ratio": [0.4, 0.6, 0.8, 1.0, 1.2, 2.0], "delay": ["0ms", "10ms", "20ms", "50ms"],
              "env": ["bare", "container"], "proto": ["udp", "tcp"]}
    run = make_run(store, "many00config", matrix=matrix, repetitions=2, duration_s=2, series=False)
    page = render_report(store, [run])
    assert '<select id="facet">' in page
    data = page_data(page)
    assert len(data["facets"]) > 1
    for spec in data["charts"].values():
        assert set(spec["facets"]) <= {f["id"] for f in data["facets"]}
    m = html_model.load(store, [run])
    assert m.layout.sweep.name == "ratio"
    assert m.axes["delay"].numeric and m.axes["delay"].unit == "ms", "'10ms' labels are a numeric axis"
    for f in m.layout.facets:
        assert len(m.entries_in(f.id)) <= html_model.MAX_ENTRIES_PER_VIEW


def test_run_with_only_failed_trials_still_reports(store):
    run = "fail00000run"
    store.create_run(run, "broken", "broken.toml", 'name = "broken"\n', "h", [], 1, {"kernel": "6.1"})
    store.add_configuration(run, "k1", {"proto": "tcp"}, {"topology": "dumbbell", "senders": 2}, {})
    store.record_trial(run, TrialRecord("k1", 0, 0, 0.0, 1.0, "failed", "iperf3 not found on PATH", {}, [], []))
    store.finish_run(run, "failed", "every trial failed")
    page = render_report(store, [run])
    assert "iperf3 not found on PATH" in page and "every trial failed" in page
    assert "No trial produced a metric" in page
    assert '<section id="headline">' not in page, "no metric, no headline chart"


def test_single_configuration_without_labels(store):
    run = make_run(store, "single000run", matrix={}, repetitions=4, duration_s=2)
    data = page_data(render_report(store, [run]))
    box = chart_specs(data, "box-")[0]
    assert box["layout"]["showlegend"] is False
    assert "sweep" not in " ".join(data["charts"])


def test_report_cli_takes_the_comparison_of_compare(two_runs, tmp_path, capsys):
    """`report RUN --baseline`, `report RUN --by L --ref V` and `compare A B --report FILE` put compare's own
    verdicts in the page: the same rows as `compare --json` with the same options."""
    from vnetbench.cli import main

    store, a, b = two_runs
    db = str(store.path)
    assert main(["baseline", "set", a, "--name", "k6.12", "--db", db]) == 0
    capsys.readouterr()
    assert main(["compare", b, "--baseline", "k6.12", "--json", "--db", db]) == 0
    doc = json.loads(capsys.readouterr().out)
    expected = sorted(r["verdict"] for c in doc["configurations"] for r in c["results"])
    assert "regressed" in expected
    for argv in (["report", b, "--baseline", "k6.12", "-o", str(tmp_path / "base.html")],
                 ["compare", a, b, "--report", str(tmp_path / "pair.html")]):
        assert main([*argv, "--db", db]) == 0
        page = Path(argv[-1]).read_text()
        assert sorted(re.findall(r'<tr data-verdict="(\w+)"', page)) == expected, argv[0]
    assert "A is baseline" in (tmp_path / "base.html").read_text()
    capsys.readouterr()
    assert main(["compare", a, "--by", "proto", "--ref", "udp", "--json", "--db", db]) == 0
    within = sorted(r["verdict"] for c in json.loads(capsys.readouterr().out)["configurations"] for r in c["results"])
    assert main(["report", a, "--by", "proto", "--ref", "udp", "-o", str(tmp_path / "within.html"), "--db", db]) == 0
    page = (tmp_path / "within.html").read_text()
    assert "udp → tcp" in page and sorted(re.findall(r'<tr data-verdict="(\w+)"', page)) == within
    # A report cannot compare two runs and a baseline at once: a usage error, nothing written.
    assert main(["report", a, b, "--baseline", "-o", str(tmp_path / "bad.html"), "--db", db]) == 2
    assert not (tmp_path / "bad.html").exists()


def test_marked_trials_are_listed_with_why(store):
    """A trial the machine's own noise marked (metrics.NOISE_MARKS) stays in the charts and is listed apart."""
    run = "mark00000run"
    store.create_run(run, "noisy", "noisy.toml", 'name = "noisy"\n', "h", [], 1, {"kernel": "6.1"})
    store.add_configuration(run, "k1", {"proto": "tcp"}, {"topology": "dumbbell", "senders": 1}, {})
    for rep, foreign in enumerate((1.0, 99.0, 2.0)):
        samples = [SampleRecord("throughput.rx_mbps", 900.0 + rep, "Mbit/s", "higher"),
                   SampleRecord("cpu.foreign_pct", foreign, "%", "lower")]
        store.record_trial(run, TrialRecord("k1", rep, rep, 0.0, 1.0, "ok", None, {}, samples, []))
    store.finish_run(run, "completed")
    page = render_report(store, [run])
    assert "1 ok trial(s) ran while the machine was busy with other work" in page
    assert "Marked trials (1)" in page and "other processes 99 % of a core" in page


def test_efficiency_chart_puts_what_was_delivered_against_cpu(store):
    """With CPU measured, a chart of throughput against cpu.util_pct: a point per configuration at the medians,
    quartile bars, iso-cost lines through the origin; without CPU, no such chart."""
    run = "effi00000run"
    store.create_run(run, "cost", "cost.toml", 'name = "cost"\n', "h", [], 1, {"kernel": "6.1"})
    position = 0
    for env, (mbps, cpu) in {"bare": (16000.0, 100.0), "emulator": (8000.0, 200.0)}.items():
        key = f"k-{env}"
        store.add_configuration(run, key, {"env": env}, {"topology": "dumbbell", "senders": 1}, {})
        for rep in range(4):
            samples = [SampleRecord("throughput.rx_mbps", mbps + 10 * rep, "Mbit/s", "higher"),
                       SampleRecord("cpu.util_pct", cpu + rep, "%", "lower")]
            store.record_trial(run, TrialRecord(key, rep, position, 0.0, 1.0, "ok", None, {}, samples, []))
            position += 1
    store.finish_run(run, "completed")
    page = render_report(store, [run])
    assert '<section id="efficiency">' in page and "What it cost" in page
    (spec,) = chart_specs(page_data(page), "efficiency")
    points = {t["name"]: (t["x"][0], t["y"][0]) for t in spec["data"]}
    assert points == {"bare": (101.5, 16015.0), "emulator": (201.5, 8015.0)}  # the medians of 4 trials
    assert spec["data"][0]["error_x"]["arrayminus"][0] == pytest.approx(0.75)  # median - first quartile
    lines = spec["layout"]["shapes"]
    assert len(lines) == 2 and all(s["x0"] == 0 and s["y0"] == 0 for s in lines)  # the cheapest and the dearest
    slopes = sorted(s["y1"] / s["x1"] for s in lines)
    assert slopes == pytest.approx([8015 / 201.5, 16015 / 101.5])
    without = make_run(store, "nocpu000run", matrix={"ratio": [1, 2]}, repetitions=3, duration_s=2)
    assert '<section id="efficiency">' not in render_report(store, [without])
