"""Environments relative to `bare`: each configuration's medians next to the bare
configuration that ran the same workload (same labels apart from the environment).

Throughput, RTT and jitter are shown as ratios (env / bare); loss, which is
often 0 on bare, as a difference in percentage points. The pairing is by labels,
so it works for any scenario whose matrix has an ``env`` label.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from vnetbench.lab.environments import option_owners
from vnetbench.metrics import HEADLINE, METRICS, in_order
from vnetbench.report.terminal import Col, compact_table, print_stacked, stacked_tables
from vnetbench.scenario.load import workload_order
from vnetbench.store.db import Store

# Labels that say which environment a configuration ran in (LabSpec.env and its options).
ENV_LABELS = ("env", *option_owners())


def _kind(metric: str) -> str:
    """How to compare with bare: a fraction (loss) as a difference in percentage points, the rest as a
    ratio env / bare."""
    meta = METRICS.get(metric)
    return "pp" if meta is not None and meta.unit == "ratio" else "ratio"


@dataclass
class Row:
    environment: str  # "container", "vm nic=e1000", ...
    context: dict[str, Any]  # the other labels (workload, offload, ...)
    reference: str  # which bare configuration it is compared with
    cells: dict[str, tuple[float, float] | None]  # metric -> (this median, bare median)


def _environment(labels: dict[str, Any]) -> str:
    """"container", "vm e1000", "overlay routed", "container cpu_quota=50%"."""
    extra = " ".join(str(labels[k]) if k in ("overlay", "nic") else f"{k}={labels[k]}"
                     for k in ENV_LABELS[1:] if k in labels)
    return f"{labels.get('env', 'bare')}{' ' + extra if extra else ''}"


def _num(v: float) -> str:
    a = abs(v)
    return f"{v:.0f}" if a >= 1000 else f"{v:.1f}" if a >= 100 else f"{v:.2f}" if a >= 1 else f"{v:.3g}"


def _context(labels: dict[str, Any], drop: tuple[str, ...] = ()) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in labels.items() if k not in ENV_LABELS and k not in drop))


def relative_rows(configs: list[dict[str, Any]], values: dict[str, dict[str, np.ndarray]],
                  metrics: list[str] | None = None) -> list[Row]:
    """One row per configuration that has a bare counterpart (bare ones included, as the reference)."""
    metrics = metrics or list(HEADLINE)
    bare = [c for c in configs if c["labels"].get("env") == "bare"
            and not any(k in c["labels"] for k in ENV_LABELS[1:])]
    if not bare or not any("env" in c["labels"] for c in configs):
        return []
    exact = {_context(c["labels"]): c for c in bare}
    loose = {_context(c["labels"], ("offload",)): c for c in bare if c["labels"].get("offload", "on") == "on"}
    rows = []
    for c in configs:
        labels = c["labels"]
        ref = exact.get(_context(labels))
        note = ""
        if ref is None:  # e.g. an offload=off entry without a bare offload=off: compare with bare as deployed
            ref = loose.get(_context(labels, ("offload",)))
            note = " (offload on)"
        if ref is None:
            continue
        mine, theirs = values.get(c["key"], {}), values.get(ref["key"], {})
        cells: dict[str, tuple[float, float] | None] = {}
        for m in metrics:
            a, b = mine.get(m), theirs.get(m)
            cells[m] = (float(np.median(a)), float(np.median(b))) if a is not None and len(a) and b is not None \
                and len(b) else None
        context = {k: v for k, v in labels.items() if k not in ENV_LABELS}
        rows.append(Row(_environment(labels), context, "bare" + note, cells))
    # Workloads in the order the matrix has them; within each, bare first, then the environments as listed.
    contexts = {k: i for i, k in enumerate(dict.fromkeys(_context(r.context) for r in rows))}
    order = {k: i for i, k in enumerate(dict.fromkeys(r.environment for r in rows))}
    rows.sort(key=lambda r: (contexts[_context(r.context)], r.environment != "bare", order[r.environment]))
    return rows


def _cell(kind: str, pair: tuple[float, float] | None, detail: bool = True) -> str:
    """The change against bare, with this configuration's median below it in the detail view."""
    if pair is None:
        return "-"
    mine, bare = pair
    if kind == "pp":
        return f"{100 * (mine - bare):+.2f} pp" + (f"\n[dim]{100 * mine:.2f}%[/]" if detail else "")
    if not np.isfinite(mine) or not np.isfinite(bare) or bare == 0:
        return "-" + (f"\n[dim]{_num(mine)}[/]" if detail else "")
    return f"{mine / bare:.2f}x" + (f"\n[dim]{_num(mine)}[/]" if detail else "")


def relative_tables(store: Store, run_id: str, configs: list[dict[str, Any]], console: Console,
                    metrics: list[str] | None = None, detail: bool = False) -> list[Table]:
    """The relative table, split into stacked tables where the console is too narrow for every metric:
    one line per configuration, or with `detail` each median under its ratio."""
    values = store.values(run_id)
    present = {m for per in values.values() for m in per}
    order = workload_order(store.run(run_id).get("scenario_text") or "")
    metrics = [m for m in metrics if m in present] if metrics else in_order(HEADLINE, present, order)
    rows = relative_rows(configs, values, metrics)
    if not rows or not metrics:
        return []
    context_keys = list(dict.fromkeys(k for r in rows for k in r.context))
    fixed = [Col(escape(k), [escape(str(r.context.get(k, ""))) for r in rows]) for k in context_keys]
    fixed.append(Col("environment", [escape(r.environment) + ("" if r.reference == "bare" else
                                                              f"{chr(10) if detail else ' '}[dim]vs "
                                                              f"{escape(r.reference)}[/]") for r in rows]))
    units = []
    for m in metrics:
        meta = METRICS.get(m)
        arrow = "" if meta is None else (" ↑" if meta.direction == "higher" else " ↓")
        units.append([Col(escape(f"{m.replace('.', chr(10), 1)}{arrow}"),
                          [_cell(_kind(m), r.cells.get(m), detail) for r in rows], "right")])
    return stacked_tables(console, (lambda: Table(show_lines=True)) if detail else compact_table, fixed, units)


def _software_guests(configs: list[dict[str, Any]]) -> dict[str, str]:
    """Configurations whose guests ran under TCG (software emulation), by environment, with why:
    their numbers measure QEMU's CPU emulator more than the virtual NIC, and readers must know."""
    out: dict[str, str] = {}
    for c in configs:
        hosts = ((c.get("lab_state") or {}).get("environment") or {}).get("hosts") or {}
        for facts in hosts.values():
            if isinstance(facts, dict) and facts.get("accelerator") == "tcg":
                out.setdefault(_environment(c["labels"]), facts.get("accelerator_reason") or "")
    return out


def software_guest_note(configs: list[dict[str, Any]]) -> str | None:
    tcg = _software_guests(configs)
    if not tcg:
        return None
    reasons = sorted({r for r in tcg.values() if r})
    return (f"Guests of {', '.join(sorted(tcg))} ran under TCG (software emulation), not KVM"
            + (f" ({'; '.join(reasons)})" if reasons else "")
            + ": their throughput and latency measure QEMU's CPU emulation, not what the NIC model costs "
              "under KVM.")


def show_relative(store: Store, run_id: str, console: Console, detail: bool = False) -> None:
    """Print the relative table when the run compared environments (nothing otherwise), and say when
    guests ran in software."""
    configs = store.configurations(run_id)
    tables = relative_tables(store, run_id, configs, console, detail=detail)
    if tables:
        console.print()
        console.print("relative to env=bare with the same workload: ratio env/bare (loss: difference in "
                      "percentage points)" + (", median below" if detail else ""))
        print_stacked(console, tables)
    note = software_guest_note(configs)
    if note:
        console.print(f"[yellow]{note}[/]")
