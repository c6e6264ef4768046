"""Terminal tables with rich: runs, and a run's per-configuration summary."""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from vnetbench.metrics import METRICS
from vnetbench.store.db import Store

# The columns people look for first in a congestion study; the rest follow.
PREFERRED = ["throughput.offered_mbps", "throughput.rx_mbps", "udp.loss_ratio", "rtt.avg_ms", "rtt.p99_ms",
             "tcp.retransmits", "flows.jain_fairness"]


def _when(ts: float | None) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


def _fmt(v: float) -> str:
    if not np.isfinite(v):
        return "-"
    a = abs(v)
    if a >= 100:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def runs_table(store: Store) -> Table:
    t = Table(title=f"runs in {store.path}")
    for col in ("run", "scenario", "started", "status", "configs", "trials ok", "failed"):
        t.add_column(col)
    for r in store.runs():
        t.add_row(r["id"], r["scenario_name"], _when(r["started"]), r["status"], str(r["configurations"]),
                  str(r["trials_ok"]), str(r["trials_failed"]))
    return t


def show(store: Store, run_id: str, console: Console, metrics: list[str] | None = None) -> None:
    """Per configuration and metric: n, median, min, max (and theory where it exists)."""
    run = store.run(run_id)
    configs = store.configurations(run_id)
    values = store.values(run_id)
    trials = store.trials(run_id)
    failed = [t for t in trials if t["status"] != "ok"]
    console.print(f"[bold]run {run_id}[/]  scenario [bold]{run['scenario_name']}[/]  status {run['status']}  "
                  f"trials ok {len(trials) - len(failed)}, failed {len(failed)}")
    fp = run["fingerprint"]
    console.print(f"kernel {fp.get('kernel')}  cpu {fp.get('cpu_model')} x{fp.get('cpus')}  "
                  f"iperf3 {(fp.get('tools') or {}).get('iperf3')}")
    for t in failed[:10]:
        console.print(f"  [yellow]{t['status']}[/] {t['config_key']} #{t['repetition']}: {t['reason']}")
    present = sorted({m for per in values.values() for m in per})
    wanted = metrics or [m for m in PREFERRED if m in present]
    label_keys = sorted({k for c in configs for k in c["labels"]}, key=lambda k: list(configs[0]["labels"]).index(k)
                        if configs and k in configs[0]["labels"] else 99)
    table = Table(title="median per configuration, min..max below (n = trials)", show_lines=True)
    for k in label_keys:
        table.add_column(k)
    table.add_column("n", justify="right")
    for m in wanted:
        meta = METRICS.get(m)
        table.add_column(f"{m.replace('.', chr(10), 1)}\n({meta.unit if meta else ''})", justify="right")
    for c in configs:
        per = values.get(c["key"], {})
        n = max((len(v) for v in per.values()), default=0)
        row = [str(c["labels"].get(k, "")) for k in label_keys] + [str(n)]
        for m in wanted:
            v = per.get(m)
            if v is None or len(v) == 0:
                row.append("-")
                continue
            cell = _fmt(float(np.median(v)))
            if len(v) > 1:
                cell += f"\n[dim]{_fmt(float(v.min()))}..{_fmt(float(v.max()))}[/]"
            theory = c["expected"].get(m)
            if theory is not None:
                cell += f"\n[cyan]theory {_fmt(theory)}[/]"
            row.append(cell)
        table.add_row(*row)
    console.print(table)
    if len(present) > len(wanted):
        console.print(f"[dim]more metrics stored: {', '.join(m for m in present if m not in wanted)} "
                      f"(vnetbench show RUN --metric NAME ...)[/]")


def summary_rows(store: Store, run_id: str) -> list[dict[str, Any]]:
    """Flat summary for scripts: configuration, labels, metric, n, median, min, max."""
    out = []
    for c in store.configurations(run_id):
        for m, v in store.values(run_id).get(c["key"], {}).items():
            out.append({"config_key": c["key"], "labels": c["labels"], "metric": m, "n": len(v),
                        "median": float(np.median(v)), "min": float(v.min()), "max": float(v.max())})
    return out
