"""HTML report at scale: 200 configurations x 20 trials with per-second series.

    .venv/bin/python bench/report.py [--keep DIR] [--configs-only]

Builds a synthetic run through the Store API (seeded; ratio 10 x delay 5 x env 2 x
proto 2 = 200 configurations, 20 repetitions, 20 s trials with per-second
throughput, cwnd and srtt per flow and a ping RTT every 10 ms), renders the
report and prints what it cost next to the budget of issue 4: under 10 s and
under 15 MB. Also prints where the bytes go, so a regression in size points at
its cause. Exits 1 when over budget.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import re
import sys
import tempfile
import time
from pathlib import Path

from vnetbench.report.html import write_report
from vnetbench.report.html_synthetic import make_run
from vnetbench.store.db import Store

TIME_BUDGET_S = 10.0
SIZE_BUDGET_MB = 15.0

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
    size = html_path.stat().st_size
    text = html_path.read_text(encoding="utf-8")
    data = re.search(r'<script type="application/json" id="vnb-data">(.*?)</script>', text, re.S)
    scripts = re.findall(r"<script>(.*?)</script>", text, re.S)
    data_b = len(data.group(1).encode()) if data else 0
    script_b = sum(len(s.encode()) for s in scripts)
    mb = size / 1e6
    print(f"render: {render_s:6.2f} s   budget {TIME_BUDGET_S:g} s   ratio {render_s / TIME_BUDGET_S:.2f}")
    print(f"size:   {mb:6.2f} MB  budget {SIZE_BUDGET_MB:g} MB  ratio {mb / SIZE_BUDGET_MB:.2f}")
    print(f"bytes:  scripts (plotly.js + page script) {script_b / 1e6:.2f} MB, chart and series data "
          f"{data_b / 1e6:.2f} MB, HTML {(size - script_b - data_b) / 1e6:.2f} MB")
    print(f"report: {html_path}" + ("" if args.keep else " (temporary; --keep DIR to look at it)"))
    if prof:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(15)
        print(s.getvalue())
    store.close()
    over = render_s > TIME_BUDGET_S or mb > SIZE_BUDGET_MB
    print("OVER BUDGET" if over else "within budget")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
