"""HTML report at scale: 200 configurations x 20 trials with per-second series, and at the demo's size.

    .venv/bin/python bench/report.py [--keep DIR] [--repetitions N] [--profile]

Builds a synthetic run through the Store API (seeded; ratio 10 x delay 5 x env 2 x
proto 2 = 200 configurations, 20 repetitions, 20 s trials with per-second
throughput, cwnd and srtt per flow and a ping RTT every 10 ms), renders the
report and prints what it cost next to its budgets: under 10 s and under 8 MB
(issue 17, "reports of the right size"). Then renders a synthetic run shaped
like ``make demo``'s (the built-in ``quick``: ratio 2 x proto 2, 3 repetitions,
4 s trials, a ping every 2 ms) against its budget of 1.5 MB, without building
a lab. For both it prints where the bytes go (plotly.js, chart and series
data, each packed and as plain text, the page script, the HTML) and which
plotly.js bundle was inlined, so a regression in size points at its cause.
Exits 1 when over budget.
"""

from __future__ import annotations

import argparse
import cProfile
import html
import io
import pstats
import re
import sys
import tempfile
import time
from pathlib import Path

from vnetbench.report.html import write_report
from vnetbench.report.html_payload import unpack
from vnetbench.report.html_synthetic import make_run
from vnetbench.store.db import Store

TIME_BUDGET_S = 10.0
SIZE_BUDGET_MB = 8.0
DEMO_SIZE_BUDGET_MB = 1.5

MATRIX = {
    "ratio": [0.4, 0.6, 0.8, 0.9, 1.0, 1.2, 1.6, 2.0, 3.0, 4.0],
    "delay": ["0ms", "5ms", "10ms", "20ms", "50ms"],
    "env": ["bare", "container"],
    "proto": ["udp", "tcp"],
}


def build(db: Path, repetitions: int) -> tuple[Store, str, float]:
    store = Store(db)
    store.conn.execute("PRAGMA synchronous = OFF")  # generation speed only; the report reads the same data
    t = time.perf_counter()
    run_id = make_run(store, "bench0000report", matrix=MATRIX, repetitions=repetitions, duration_s=20,
                      ping_interval_s=0.01, seed=42, fail_every=97)
    return store, run_id, time.perf_counter() - t


#: The shape of `make demo`'s run (src/vnetbench/scenario/builtin/quick.toml).
DEMO = dict(name="quick", matrix={"ratio": [0.6, 2.0], "proto": ["udp", "tcp"]}, repetitions=3, duration_s=4,
            ping_interval_s=0.002, seed=1)


def sizes(path: Path) -> tuple[int, str]:
    """(bytes of the page, a line saying where they go)."""
    size = path.stat().st_size
    text = path.read_text(encoding="utf-8")
    blocks = dict(re.findall(r'<script type="application/json" id="(vnb-[a-z]+)">(.*?)</script>', text, re.S))
    app = sum(len(s.encode()) for s in re.findall(r"<script>(.*?)</script>", text, re.S))

    def block(name: str) -> str:
        b = blocks.get(name, "")
        return f"{len(b.encode()) / 1e6:.2f} MB (plain {len(unpack(b).encode()) / 1e6:.2f} MB)" if b else "none"

    packed = sum(len(b.encode()) for b in blocks.values())
    charts = re.search(r"charts: (plotly\.js [^,]*)", text)
    return size, (f"plotly.js {block('vnb-plotly')}, chart and series data {block('vnb-data')}, page script "
                  f"{app / 1e6:.2f} MB, HTML {(size - packed - app) / 1e6:.2f} MB; "
                  f"{html.unescape(charts.group(1)) if charts else 'plotly.js: not named on the page'}")


def demo(out_dir: Path) -> float:
    """The demo-sized report's size in MB, printed against its budget."""
    db = out_dir / "bench-demo.db"
    for p in out_dir.glob("bench-demo.db*"):
        p.unlink()
    with Store(db) as store:
        run_id = make_run(store, "bench0000demo", **DEMO)
        path = write_report(store, [run_id], out_dir / "bench-demo.html")
    size, where = sizes(path)
    mb = size / 1e6
    print(f"demo:   {mb:6.2f} MB  budget {DEMO_SIZE_BUDGET_MB:g} MB  ratio {mb / DEMO_SIZE_BUDGET_MB:.2f}   "
          "(synthetic run shaped like `make demo`'s)")
    print(f"bytes:  {where}")
    print(f"report: {path}")
    return mb


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", type=Path, help="write the database and report into this directory")
    ap.add_argument("--repetitions", type=int, default=20)
    ap.add_argument("--profile", action="store_true", help="print the 15 most expensive functions")
    args = ap.parse_args()
    tmp = tempfile.TemporaryDirectory(prefix="vnetbench-bench-")
    out_dir = args.keep or Path(tmp.name)
    out_dir.mkdir(parents=True, exist_ok=True)
    db = out_dir / "bench-report.db"
    for p in out_dir.glob("bench-report.db*"):
        p.unlink()
    store, run_id, gen_s = build(db, args.repetitions)
    n_configs = len(store.configurations(run_id))
    trials = store.trials(run_id)
    n_series = store.conn.execute("SELECT COUNT(*), SUM(LENGTH(v)) / 8 FROM series").fetchone()
    print(f"data: {n_configs} configurations x {args.repetitions} repetitions = {len(trials)} trials "
          f"({sum(t['status'] != 'ok' for t in trials)} not ok), {n_series[0]} series with {n_series[1]:,} points; "
          f"generated in {gen_s:.1f} s")

    html_path = out_dir / "bench-report.html"
    prof = cProfile.Profile() if args.profile else None
    t = time.perf_counter()
    if prof:
        prof.enable()
    write_report(store, [run_id], html_path)
    if prof:
        prof.disable()
    render_s = time.perf_counter() - t
    size, where = sizes(html_path)
    mb = size / 1e6
    print(f"render: {render_s:6.2f} s   budget {TIME_BUDGET_S:g} s   ratio {render_s / TIME_BUDGET_S:.2f}")
    print(f"size:   {mb:6.2f} MB  budget {SIZE_BUDGET_MB:g} MB  ratio {mb / SIZE_BUDGET_MB:.2f}")
    print(f"bytes:  {where}")
    print(f"report: {html_path}" + ("" if args.keep else " (temporary; --keep DIR to look at it)"))
    if prof:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(15)
        print(s.getvalue())
    store.close()
    demo_mb = demo(out_dir)
    over = render_s > TIME_BUDGET_S or mb > SIZE_BUDGET_MB or demo_mb > DEMO_SIZE_BUDGET_MB
    print("OVER BUDGET" if over else "within budget")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
