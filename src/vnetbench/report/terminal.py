"""Terminal tables with rich: runs, a run's per-configuration summary, comparisons, history."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import numpy as np
from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from vnetbench.metrics import COST, HEADLINE, METRICS, NOISE_MARKS, in_order
from vnetbench.report import sender
from vnetbench.runner.machine_load import machine_note
from vnetbench.runner import calibration
from vnetbench.runner.fingerprint import run_notes
from vnetbench.scenario.load import workload_order
from vnetbench.units import utc_text
from vnetbench.stats import IMPROVED, INCONCLUSIVE, REGRESSED, UNCHANGED, summarize
from vnetbench.stats.summary import UNSTABLE_CV, min_n_for_median_ci
from vnetbench.store.db import Store

# The columns people look for first in a congestion study; the rest follow.
# The offered load first (what the row asked for), then what was measured, then what it cost in CPU.
PREFERRED = ["throughput.offered_mbps", *HEADLINE, *COST]


def _when(ts: float | None) -> str:
    return utc_text(ts)


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
    notes = []
    for r in store.runs():
        status = r["status"] if r["status"] in ("completed", "running") else f"[yellow]{r['status']}[/]"
        t.add_row(r["id"], escape(str(r["scenario_name"])), _when(r["started"]), status, str(r["configurations"]),
                  str(r["trials_ok"]), str(r["trials_failed"]))
        if r["status"] == "interrupted" and r.get("status_reason"):
            notes.append(f"{r['id']}: {escape(str(r['status_reason']))}")
    if notes:
        t.caption = "\n".join(notes)
        t.caption_justify = "left"
    return t


# Below this many trials p5 and p95 only interpolate between the extremes: min..max says it all.
PERCENTILES_FROM_N = 10


def _summary_cell(values: np.ndarray, theory: float | None, row_n: int) -> str:
    """Median (bold), its exact 95% CI or "n too small", mean ± sd, min..max, p5..p95 (from 10 trials), CV
    with the unstable mark, outliers, theory; the metric's own n where it differs from the configuration's."""
    s = summarize(values)
    lines = [f"[bold]{_fmt(s.median)}[/]"]
    if s.ci is not None:
        lines.append(escape(f"[{_fmt(s.ci[0])}, {_fmt(s.ci[1])}]"))
    else:
        lines.append("[dim]n too small[/]")
    if s.n > 1:
        lines.append(f"[dim]{_fmt(s.mean)} ± {_fmt(s.std)}[/]")
        lines.append(f"[dim]{_fmt(s.min)}..{_fmt(s.max)}[/]")
    if s.n >= PERCENTILES_FROM_N:
        lines.append(f"[dim]p5-95 {_fmt(s.p5)}..{_fmt(s.p95)}[/]")
    if s.n != row_n:
        lines.append(f"[yellow]n {s.n}[/]")
    if s.cv is not None:
        lines.append(f"[red]cv {_pct(s.cv)} unstable[/]" if s.unstable else f"[dim]cv {_pct(s.cv)}[/]")
    if s.outliers:
        lines.append(f"[yellow]{s.outliers} outlier{'s' if s.outliers > 1 else ''}[/]")
    if theory is not None:
        lines.append(f"[cyan]theory {_fmt(theory)}[/]")
    return "\n".join(lines)


def _pct(x: float) -> str:
    v = 100 * x
    return f"{v:.1f}%" if abs(v) < 10 else f"{v:.0f}%"


def _label_keys(configs: list[dict[str, Any]]) -> list[str]:
    first = list(configs[0]["labels"]) if configs else []
    return sorted({k for c in configs for k in c["labels"]}, key=lambda k: first.index(k) if k in first else 99)


def host_lines(fp: dict) -> list[str]:
    """One line per host of a `run --hosts`: what it is, as the run found it."""
    out = []
    for name, facts in (fp.get("hosts") or {}).items():
        tools = "  ".join(f"{k[5:]} {_short_version(v)}" for k, v in facts.items() if k.startswith("tool ") and v)
        where = f"  {facts['interface']}" if facts.get("interface") else ""
        out.append(f"host {name}: kernel {facts.get('kernel', '?')}  cpu {facts.get('cpu model', '?')} "
                   f"x{facts.get('cpus', '?')}{where}  {tools}")
    return out


def cluster_lines(fp: dict) -> list[str]:
    """For a `run --kube`: the cluster, then one line per node it used: what it runs, and its pod network's
    encapsulation and devices' MTUs as the run read them."""
    kube = fp.get("kube")
    if not isinstance(kube, dict):
        return []
    out = [f"cluster: Kubernetes {kube.get('version') or '?'} at {kube.get('server') or '?'}  network "
           f"{kube.get('network') or '?'}  image {kube.get('image') or '?'}"]
    if kube.get("pod_security") == "baseline":
        out.append("pods kept to Pod Security's baseline level: no NET_ADMIN, so TCP's metrics were not flushed "
                   "between trials (a connection may start from what earlier trials' connections to its peer left)")
    for name, facts in (kube.get("nodes") or {}).items():
        if not isinstance(facts, dict):
            continue
        devices = facts.get("interfaces")
        # the node's own devices: its uplinks, bridges and tunnels (its pods' veths on a bridge are many)
        mtus = ", ".join(f"{dev} {d.get('mtu')}" for dev, d in devices.items() if isinstance(d, dict)
                         and not d.get("in")) if isinstance(devices, dict) else ""
        network = (f"  encapsulation {facts['encapsulation']}  MTU {mtus}" if "encapsulation" in facts else
                   f"  devices unknown: {facts['unknown']}" if "unknown" in facts else "")
        out.append(f"node {name}: kernel {facts.get('kernel', '?')}  {facts.get('container_runtime', '?')}  "
                   f"cpu {facts.get('cpu', '?')}  memory {facts.get('memory', '?')}{network}")
    return out


def endpoint_places(fp: dict) -> list[tuple[str, str, str, str, str, str]]:
    """The run's endpoint -> node mapping (fingerprint "endpoints"), as text: (variant, endpoint, node,
    addresses, interface, cpu), "" where not known. Whatever a database holds there is taken as text."""
    mapping = fp.get("endpoints")
    rows = []
    for variant, endpoints in (mapping.items() if isinstance(mapping, dict) else ()):
        for role, p in (endpoints.items() if isinstance(endpoints, dict) else ()):
            if not isinstance(p, dict):
                continue
            addresses = p.get("addresses")
            cpu = p.get("cpu")
            rows.append((str(variant), str(role), str(p.get("node") or "?"),
                         " ".join(map(str, addresses)) if isinstance(addresses, list) else "",
                         str(p.get("interface") or ""), "" if cpu is None else str(cpu)))
    return rows


def marked_lines(marked: dict[str, list[tuple[int, list[str]]]], ok: int, most: int = 10) -> list[str]:
    """The trials the machine's own noise marked (Store.marked_trials), as lines: how many, then which."""
    which = [f"  {key} #{rep}: {'; '.join(why)}" for key, trials in marked.items() for rep, why in trials]
    if not which:
        return []
    limits = ", ".join(f"{what} above {limit:g} % of a core" for _, limit, what in NOISE_MARKS)
    more = [f"  ... and {len(which) - most} more"] if len(which) > most else []
    return [f"marked: {len(which)} of {ok} ok trials ran while the machine was busy with other work ({limits}); "
            "they stay in the statistics", *which[:most], *more]


def endpoint_lines(fp: dict) -> list[str]:
    """Where each endpoint ran, a line per environment variant ("endpoints (docker): r = namespace ... ")."""
    per: dict[str, list[str]] = {}
    for variant, role, node, addresses, interface, cpu in endpoint_places(fp):
        where = ", ".join(x for x in (addresses, interface and f"interface {interface}", cpu and f"cpu {cpu}") if x)
        per.setdefault(variant, []).append(f"{role} = {node}" + (f" ({where})" if where else ""))
    return [("endpoints" if len(per) == 1 else f"endpoints ({variant})") + ": " + "; ".join(parts)
            for variant, parts in per.items()]


def _short_version(text: str) -> str:
    """The version number in a tool's version line ("iperf 3.12 (cJSON 1.7.15)" -> "3.12")."""
    import re

    found = re.search(r"\d+(\.\d+)+", str(text))
    return found.group(0) if found else str(text)


# ------------------------------------------------------------------ tables that fit the terminal


class Col:
    """One column of a table about to be split to fit: its header, justification and cells (markup or Text)."""

    def __init__(self, header: str, cells: list[str | Text], justify: str = "left") -> None:
        self.header, self.cells, self.justify = header, cells, justify

    @property
    def width(self) -> int:
        """The widest line of the header and the cells: what the column needs for nothing to wrap."""
        texts = [Text.from_markup(self.header), *(c if isinstance(c, Text) else Text.from_markup(c)
                                                  for c in self.cells)]
        return max((cell_len(line) for t in texts for line in t.plain.split("\n")), default=0)


def _table_width(console: Console, make: Callable[[], Table], widths: list[int]) -> int:
    """How wide a table of `make`'s style is with columns of these content widths (rich's own arithmetic)."""
    skeleton = make()
    skeleton.title = skeleton.caption = None
    for _ in widths:
        skeleton.add_column("")
    skeleton.add_row(*("x" * w for w in widths))
    return Measurement.get(console, console.options.update(width=1 << 20), skeleton).maximum


def stacked_tables(console: Console, make: Callable[[], Table], fixed: list[Col],
                   units: list[list[Col]]) -> list[Table]:
    """The fixed (label) columns with as many units of columns as fit the console's width, then the next
    table with the fixed columns again and the next units: stacked tables, never cut or wrapped cells.
    A unit too wide even alone gets a table of its own whose cells fold (nothing is ever truncated)."""
    fixed_w = [c.width for c in fixed]
    groups: list[list[list[Col]]] = []
    current: list[list[Col]] = []
    widths = list(fixed_w)
    for unit in units:
        more = [c.width for c in unit]
        if current and _table_width(console, make, widths + more) > console.width:
            groups.append(current)
            current, widths = [], list(fixed_w)
        current.append(unit)
        widths += more
    if current or not groups:
        groups.append(current)
    tables = []
    for group in groups:
        t = make()
        cols = fixed + [c for unit in group for c in unit]
        for c in cols:
            t.add_column(c.header, justify=c.justify, overflow="fold")  # type: ignore[arg-type]
        for i in range(max((len(c.cells) for c in cols), default=0)):
            t.add_row(*(c.cells[i] if i < len(c.cells) else "" for c in cols))
        tables.append(t)
    return tables


def compact_table() -> Table:
    """The style of the compact tables: no borders, a rule under the header, two spaces between columns."""
    return Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0), header_style="bold")


def print_stacked(console: Console, tables: list[Table]) -> None:
    for i, t in enumerate(tables):
        if i:
            console.print()
        console.print(t)


# ------------------------------------------------------------------ a run's summary

# Marks of the compact cells, explained once under the table.
MARK_NO_CI = "?"
MARK_UNSTABLE = "!"
MARK_OUTLIERS = "*"


def ci_half_width(s: Any) -> str:
    """benchstat's uncertainty: the larger half of the median's CI relative to the median, "±3%"; "±?" with
    too few trials for a CI, "±∞" when the median is 0 and the interval is not."""
    if s.ci is None:
        return f"±{MARK_NO_CI}"
    half = max(s.median - s.ci[0], s.ci[1] - s.median)
    if s.median == 0:
        return "±0%" if half == 0 else "±∞"
    return f"±{100 * half / abs(s.median):.0f}%"


def compact_parts(values: np.ndarray, row_n: int | None = None) -> tuple[str, str, str]:
    """(median, "±X%" or "±?", marks): "!" unstable, "*" outliers, "n=4" where the metric's own number of
    trials differs from its configuration's (`row_n`)."""
    s = summarize(values)
    marks = (MARK_UNSTABLE if s.unstable else "") + (MARK_OUTLIERS if s.outliers else "")
    if row_n is not None and s.n != row_n:
        marks += (" " if marks else "") + f"n={s.n}"
    return _fmt(s.median), ci_half_width(s), marks


def compact_cell(values: np.ndarray, row_n: int | None = None) -> str:
    """One metric of one configuration in benchstat's form: "95.78 ±0%", "1.38 ±? !"."""
    median, pm, marks = compact_parts(values, row_n)
    return f"{median} {pm}" + (f" {marks}" if marks else "")


def _compact_column(header: str, parts: list[tuple[str, str, str] | None]) -> Col:
    """A metric's column: medians, ± and marks each aligned, the block right-aligned under the header."""
    present = [p for p in parts if p is not None]
    w_med = max((len(p[0]) for p in present), default=0)
    w_pm = max((len(p[1]) for p in present), default=0)
    w_mark = max((len(p[2]) for p in present), default=0)
    inner = w_med + 1 + w_pm + (1 + w_mark if w_mark else 0)
    col = Col(header, [], "right")
    width = max(col.width, inner if present else 1)
    for p in parts:
        # every cell exactly the column's width, left-justified: right-justifying would strip the padding
        # after a cell without marks and shift it out of line with the others
        t = Text(justify="left")
        if p is None:
            t.append("-".rjust(width))
        else:
            median, pm, marks = p
            t.append(" " * (width - inner))
            t.append(median.rjust(w_med), style="bold")
            t.append(" " + pm.ljust(w_pm), style="dim" if pm.endswith(MARK_NO_CI) else "")
            if w_mark:
                t.append(" " + marks.ljust(w_mark), style="yellow" if marks else "")
        col.cells.append(t)
    return col


def _metric_header(m: str) -> str:
    meta = METRICS.get(m)
    arrow = "" if meta is None else (" ↑" if meta.direction == "higher" else " ↓")
    return escape(f"{m.replace('.', chr(10), 1)}\n({meta.unit if meta else ''}){arrow}")


def show(store: Store, run_id: str, console: Console, metrics: list[str] | None = None,
         detail: bool = False) -> None:
    """A run's summary: one line per configuration, each metric's median ± the relative half-width of its
    95% CI with marks for a missing CI, instability and outliers (benchstat's form), and theory; with
    `detail`, cells of median, exact 95% CI, mean ± sd, min..max, p5-95 (from 10 trials), CV, outliers,
    theory. Either way split into stacked tables where the console is too narrow for every metric."""
    run = store.run(run_id)
    configs = store.configurations(run_id)
    values = store.values(run_id)
    trials = store.trials(run_id)
    failed = [t for t in trials if t["status"] != "ok"]
    console.print(f"[bold]run {run_id}[/]  scenario [bold]{escape(str(run['scenario_name']))}[/]  status "
                  f"{run['status']}  trials ok {len(trials) - len(failed)}, failed {len(failed)}")
    if run["status"] in ("interrupted", "failed") and run.get("status_reason"):
        console.print(f"  [yellow]{run['status']}:[/] {escape(str(run['status_reason']))}")
    for note in (machine_note(run["fingerprint"]), *run_notes(run["fingerprint"])):
        if note:
            console.print(f"[yellow]{escape(note)}[/]")
    fp = run["fingerprint"]
    tools = "  ".join(f"{name} {_short_version(v)}" for name, v in (fp.get("tools") or {}).items() if v)
    console.print(escape(f"kernel {fp.get('kernel')}  cpu {fp.get('cpu_model')} x{fp.get('cpus')}  {tools}"))
    for line in (*host_lines(fp), *cluster_lines(fp), *endpoint_lines(fp), *calibration.lines(fp.get("calibration"))):
        console.print(escape(line), highlight=False)
    if isinstance(fp.get("topology"), dict):
        topology_view(fp["topology"], console, rows=12)
    for t in failed[:10]:
        console.print(f"  [yellow]{t['status']}[/] {t['config_key']} #{t['repetition']}: {escape(str(t['reason']))}")
    for line in marked_lines(store.marked_trials(run_id), len(trials) - len(failed)):
        console.print(escape(line), highlight=False)
    present = sorted({m for per in values.values() for m in per})
    wanted = metrics or in_order(PREFERRED, present, workload_order(run.get("scenario_text") or ""))
    label_keys = _label_keys(configs)
    rows = []  # (configuration, n, its values)
    for c in configs:
        per = values.get(c["key"], {})
        rows.append((c, max((len(v) for v in per.values()), default=0), per))
    fixed = [Col(escape(k), [escape(str(c["labels"].get(k, ""))) for c, _, _ in rows]) for k in label_keys]
    fixed.append(Col("n", [str(n) for _, n, _ in rows], "right"))
    unstable = outliers = no_ci = per_metric_n = 0
    for _, n, per in rows:
        for m in wanted:
            v = per.get(m)
            if v is not None and len(v):
                s = summarize(v)
                unstable += s.unstable
                outliers += s.outliers
                no_ci += s.ci is None
                per_metric_n += s.n != n
    units: list[list[Col]] = []
    for m in wanted:
        theory = [c["expected"].get(m) for c, _, _ in rows]
        if detail:
            cells = [_summary_cell(per[m], c["expected"].get(m), n) if per.get(m) is not None and len(per[m])
                     else "-" for c, n, per in rows]
            units.append([Col(_metric_header(m), cells, "right")])
            continue
        parts = [compact_parts(per[m], n) if per.get(m) is not None and len(per[m]) else None
                 for _, n, per in rows]
        unit = [_compact_column(_metric_header(m), parts)]
        if any(x is not None for x in theory):
            lines = _metric_header(m).count("\n")
            unit.append(Col("\n" * lines + "theory", [f"[cyan]{_fmt(x)}[/]" if x is not None else ""
                                                       for x in theory], "right"))
        units.append(unit)
    if detail:
        console.print("per configuration: median, its exact 95% CI, mean ± sd, min..max, p5-95 (n >= 10), CV, "
                      "outliers (n = successful trials)")
        print_stacked(console, stacked_tables(console, lambda: Table(show_lines=True), fixed, units))
        console.print("[dim]cells: median, its CI, mean ± sd, min..max, p5-95 (from 10 trials), CV; "
                      "↑/↓ higher/lower is better; CI: exact order-statistic interval of the median (n >= 6); "
                      "unstable: CV >= 10%; outliers: beyond Tukey's fences, counted, never dropped[/]")
    else:
        print_stacked(console, stacked_tables(console, compact_table, fixed, units))
        need = min_n_for_median_ci()
        legend = [f"median ±X%: the larger side of the median's exact 95% CI (n >= {need}), relative to the median"]
        if no_ci:
            legend.append(f"{MARK_NO_CI} no CI: fewer than {need} trials")
        if unstable:
            legend.append(f"{MARK_UNSTABLE} unstable: CV >= {100 * UNSTABLE_CV:g}%")
        if outliers:
            legend.append(f"{MARK_OUTLIERS} outliers beyond Tukey's fences (kept)")
        if per_metric_n:
            legend.append("n=K: the metric from K trials")
        if any(len(unit) > 1 for unit in units):
            legend.append("theory: what the lab's physics predicts")
        legend.append("↑/↓ higher/lower is better; vnetbench show RUN --detail: CI, mean ± sd, min..max, "
                      "p5-95, CV")
        console.print("[dim]" + escape("; ".join(legend)) + "[/]")
    if unstable or outliers:
        console.print(f"[yellow]{unstable} unstable cell(s), {outliers} outlier trial value(s)[/]: "
                      "vnetbench export RUN shows every trial")
    _stop_reasons(configs, label_keys, console)
    _sender_shortfalls(configs, values, label_keys, console)
    if len(present) > len(wanted):
        console.print(f"[dim]more metrics stored: {', '.join(m for m in present if m not in wanted)} "
                      f"(vnetbench show RUN --metric NAME ...)[/]")


def _stop_reasons(configs: list[dict[str, Any]], label_keys: list[str], console: Console) -> None:
    reasons = [c.get("stop_reason") for c in configs]
    if not any(reasons) or all((r or "").startswith("fixed") for r in reasons):
        return
    t = Table(title="adaptive repetition: why each configuration stopped", title_justify="left")
    for k in label_keys:
        t.add_column(escape(k))
    t.add_column("stopped because")
    for c in configs:
        t.add_row(*[escape(str(c["labels"].get(k, ""))) for k in label_keys],
                  escape(c.get("stop_reason") or "not finished (resume the run)"))
    console.print(t)


def _sender_shortfalls(configs: list[dict[str, Any]], values: dict[str, dict[str, np.ndarray]],
                       label_keys: list[str], console: Console) -> None:
    found = sender.shortfalls((c["labels"], c["expected"], values.get(c["key"], {})) for c in configs)
    text = sender.note(found, sender.udp_count(c["expected"] for c in configs))
    if not text:
        return
    console.print(f"[yellow]{escape(text)}[/]")
    t = Table(title="UDP sender short of the offered rate (medians over trials)", title_justify="left")
    for k in label_keys:
        t.add_column(escape(k))
    for h in sender.HEADERS:
        t.add_column(h, justify="right")
    for s in found:
        t.add_row(*[escape(str(s.labels.get(k, ""))) for k in label_keys], *sender.row(s))
    console.print(t)


def summary_rows(store: Store, run_id: str) -> list[dict[str, Any]]:
    """Flat summary for scripts: configuration, labels, metric and its statistics (see stats.Summary)."""
    out = []
    values = store.values(run_id)
    for c in store.configurations(run_id):
        for m, v in values.get(c["key"], {}).items():
            meta = METRICS.get(m)
            out.append({"config_key": c["key"], "labels": c["labels"], "metric": m,
                        "unit": meta.unit if meta else None, "direction": meta.direction if meta else None,
                        "theory": c["expected"].get(m), **summarize(v).to_dict()})
    return out


# ------------------------------------------------------------------ comparisons

VERDICT_STYLE = {REGRESSED: "bold red", IMPROVED: "bold green", INCONCLUSIVE: "yellow", UNCHANGED: "dim"}
_CHANGE_PREFIX = re.compile(r"^median [+-]?[\d.]+% \(95% CI [^)]*\) ")


def _signed_pct(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{100 * x:+.1f}%"


def _p(x: float | None) -> str:
    if x is None:
        return "-"
    if x == 0:
        return "0"
    return f"{x:.2g}" if x >= 0.001 else f"{x:.0e}"


_P_CLAUSE = re.compile(r", p=\S+( \(Holm; raw [^)]*\))?(?=;)")


def _short_reason(reason: str) -> str:
    """The reason without the change, interval and p-value where they only repeat their own columns."""
    return _P_CLAUSE.sub("", _CHANGE_PREFIX.sub("", reason))


def _run_line(side: str, info: dict[str, Any], console: Console) -> None:
    when = (info.get("started") or "").replace("T", " ").replace("+00:00", " UTC")
    console.print(f"  {side} [bold]{escape(str(info.get('id')))}[/]  {escape(str(info.get('scenario')))}  started "
                  f"{escape(when)}  {escape(str(info.get('status')))}")
    if info.get("overrides"):
        console.print("      [dim]" + escape(" ".join(f"--set {o}" for o in info["overrides"])) + "[/]")


def comparison_view(report, console: Console) -> None:
    """The comparison table: regressions first, colour per verdict, why a verdict was inconclusive."""
    if report.kind == "runs":
        console.print("[bold]compare[/] A (reference) → B, configurations matched by key")
        _run_line("A", report.a_info, console)
        _run_line("B", report.b_info, console)
    else:
        console.print(f"[bold]compare within run {report.a}[/]: each value of [bold]{report.by}[/] against "
                      f"{report.by}=[bold]{report.ref}[/], the other labels held equal")
        _run_line("run", report.a_info, console)
    if report.differences:
        console.print("  what differs:")
        for d in report.differences:
            console.print(f"    {escape(str(d['what']))} {escape(str(d['name']))}: {escape(d['a'])} → {escape(d['b'])}")

    table = Table(show_lines=False, header_style="bold")
    # numbers keep their width on a narrow terminal; the interval and the reason wrap instead
    table.add_column("configuration" if report.kind == "runs" else f"{report.by}: {report.ref} →", min_width=12)
    table.add_column("metric", no_wrap=True)
    table.add_column("A" if report.kind == "runs" else escape(str(report.ref)), justify="right", no_wrap=True)
    table.add_column("B" if report.kind == "runs" else "variant", justify="right", no_wrap=True)
    table.add_column("change (95% CI)", justify="right", min_width=16)
    table.add_column("p Holm", justify="right", no_wrap=True)
    table.add_column("δ", justify="right", no_wrap=True)
    sizes = {(r.n_a, r.n_b) for _, r in report.rows()}
    if len(sizes) > 1:  # the same everywhere: said once under the table instead
        table.add_column("n A/B", justify="right", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    why: list[str] = []  # reasons of inconclusive verdicts, as numbered notes under the table
    previous = None
    for pair, r in report.sorted_rows():
        style = VERDICT_STYLE[r.verdict]
        arrow = "↑" if r.direction == "higher" else "↓"
        change = _signed_pct(r.rel_change)
        if r.rel_change_ci is not None:
            change += f" [dim]({_signed_pct(r.rel_change_ci[0])}..{_signed_pct(r.rel_change_ci[1])})[/]"
        if r.verdict in (REGRESSED, IMPROVED):
            change = f"[{style}]{change}[/]"
        if previous is not None and previous != r.verdict:
            table.add_section()
        previous = r.verdict
        where = escape(pair.config)
        if report.kind == "within":
            where = f"{escape(str(pair.labels.get(report.by)))} [dim]{where}[/]"
        cells = [where, f"{r.metric} [dim]{arrow}[/]", _fmt(r.median_a), _fmt(r.median_b),
                 change, _p(r.p_adjusted), f"{r.cliffs_delta:+.2f}",
                 *([f"{r.n_a}/{r.n_b}"] if len(sizes) > 1 else []), f"[{style}]{r.verdict}[/]"]
        if r.verdict == INCONCLUSIVE:
            why.append(f"{escape(pair.config)} {r.metric}: {escape(_short_reason(r.reason))}")
            cells[-1] += f" [dim]({len(why)})[/]"
        table.add_row(*cells)
    if report.rows():
        console.print(table)
    if why:
        console.print("[yellow]why inconclusive:[/]")
        for i, text in enumerate(why, 1):
            console.print(f"  ({i}) {text}")
    for pair in report.pairs:
        if pair.note:
            console.print(f"[yellow]{escape(pair.config)}[/]: {escape(pair.note)}")
    for side, items in (("only in A", report.only_a), ("only in B", report.only_b)):
        if items and report.kind == "within":
            side = "not paired"
        for c in items:
            console.print(f"[yellow]{side}[/]: {escape(c['config'])} [dim]({escape(c.get('reason', ''))})[/]")

    counts = report.counts()
    parts = [f"[{VERDICT_STYLE[v]}]{counts[v]} {v}[/]" for v in (REGRESSED, IMPROVED, INCONCLUSIVE, UNCHANGED)]
    noise = f"noise threshold {100 * report.noise_default:g}%"
    special = sorted({(r.metric, r.noise_threshold) for _, r in report.rows()
                      if r.noise_threshold != report.noise_default})
    if special:
        noise += " (" + ", ".join(f"{m} {100 * t:g}%" for m, t in special) + ")"
    matched = "configuration pair(s)" if report.kind == "within" else "configuration(s) matched by key"
    trials = f"; {next(iter(sizes))[0]} vs {next(iter(sizes))[1]} trials each" if len(sizes) == 1 else ""
    console.print(f"{', '.join(parts)} in {len(report.pairs)} {matched}{trials}")
    console.print(f"[dim]alpha {report.alpha:g} (Holm across the metrics of each configuration), {noise}, "
                  f"bootstrap seed {report.seed}; δ: Cliff's delta; ↑/↓ higher/lower is better[/]")
    for n in report.notes:
        console.print(f"[dim]note: {escape(n)}[/]")


# ------------------------------------------------------------------ history

_SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float]) -> str:
    if not values:
        return ""
    lo, hi = min(values), max(values)
    if hi == lo:
        return _SPARK[3] * len(values)
    return "".join(_SPARK[min(7, int((v - lo) / (hi - lo) * 8))] for v in values)


def history_view(hist, console: Console) -> None:
    """One table per configuration: time, run, n, median and CI; change points marked where they start."""
    better = "higher" if hist.direction == "higher" else "lower"
    where = escape(" where " + ", ".join(f"{k}={v}" for k, v in hist.where.items())) if hist.where else ""
    console.print(f"[bold]{escape(hist.metric)}[/] ({escape(str(hist.unit))}, {better} is better) per run of "
                  f"scenario [bold]{escape(str(hist.scenario))}[/]{where}: median over the run's trials, oldest first")
    console.print(f"[dim]change points: E-divisive means (Hunter), window {hist.window}, p <= {hist.pvalue:g}, "
                  f"minimum magnitude {100 * hist.min_magnitude:g}%[/]")
    for line in hist.lines:
        medians = [p["median"] for p in line.points]
        cps = {cp["index"]: cp for cp in line.change_points}
        t = Table(title=f"{escape(line.config)}  {sparkline(medians)}", title_justify="left", header_style="bold")
        for col, just in (("time (UTC)", "left"), ("run", "left"), ("status", "left"), ("n", "right"),
                          ("median", "right"), ("95% CI", "right"), ("change point", "left")):
            t.add_column(col, justify=just)
        for i, p in enumerate(line.points):
            ci = escape(f"[{_fmt(p['ci'][0])}, {_fmt(p['ci'][1])}]") if p["ci"] else "[dim]n too small[/]"
            mark = ""
            cp = cps.get(i)
            if cp is not None:
                rel = cp["rel_change"]
                good = rel is not None and ((rel > 0) == (hist.direction == "higher"))
                colour = "green" if good else "red"
                mark = (f"[bold {colour}]◆ {_signed_pct(rel)}[/] {_fmt(cp['mean_before'])} → "
                        f"{_fmt(cp['mean_after'])} (p={_p(cp['pvalue'])})")
            status = p["status"] if p["status"] == "completed" else f"[yellow]{escape(str(p['status']))}[/]"
            t.add_row((p["time"] or "").replace("T", " ").replace("+00:00", ""), escape(p["run_id"]), status, str(p["n"]),
                      _fmt(p["median"]), ci, mark)
        console.print(t)
        found = len(line.change_points)
        console.print(f"  {found} change point{'s' if found != 1 else ''} in {len(line.points)} runs")
    for n in hist.notes:
        console.print(f"[dim]note: {escape(n)}[/]")


def baselines_table(rows: list[dict[str, Any]], path: Any) -> Table:
    t = Table(title=f"baselines in {path}", title_justify="left")
    for col in ("name", "run", "scenario", "run started (UTC)", "status", "set (UTC)"):
        t.add_column(col)
    for b in rows:
        t.add_row(escape(b["name"]), escape(b["run_id"]), escape(str(b["scenario"])),
                  (b["run_started"] or "").replace("T", " ")[:19], escape(str(b["status"])),
                  (b["set"] or "").replace("T", " ")[:19])
    return t


def _span(seconds: float) -> str:
    """35 s, 12 min, 2 h 05 min."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def _routes_count(topology: dict[str, Any]) -> int:
    """How many routes the topology's nodes have: counted from plan's, or as a run stored it."""
    if "routes" in topology:
        return sum(len(r) for r in topology["routes"].values())
    return int(topology.get("routes_count", 0))


def topology_view(topology: dict[str, Any], console: Console, rows: int = 24) -> None:
    """A declared topology in a few lines: what it holds, its conditioned links (all of them while they fit),
    and each configuration's endpoints with the links between them. `plan --json` has every address and route.
    Several graphs (a matrix over the topology): each, under the configurations that run on it."""
    graphs = topology.get("graphs")
    if graphs:
        for k, graph in enumerate(graphs, start=1):
            on = "; ".join(", ".join(f"{a}={b}" for a, b in labels.items()) for labels in graph["configurations"][:4])
            console.print(f"graph {k} of {len(graphs)} ({escape(on)}{', ...' if len(graph['configurations']) > 4 else ''}):",
                          soft_wrap=True, highlight=False)
            _one_topology_view(graph, console, rows)
        return
    _one_topology_view(topology, console, rows)


def _one_topology_view(topology: dict[str, Any], console: Console, rows: int) -> None:
    kinds = list(topology["nodes"].values())
    shape = (f"template {topology['template']}" if topology["template"] else
             f"containerlab file {escape(topology['containerlab'])}" if topology.get("containerlab") else "written out")
    def count(n: int, what: str) -> str:
        return f"{n:,} {what}" + ("" if n == 1 else "es" if what.endswith("ch") else "s")

    console.print(f"topology ({shape}): {count(kinds.count('host'), 'host')}, {count(kinds.count('switch'), 'switch')}, "
                  f"{count(kinds.count('router'), 'router')}, {count(len(topology['links']), 'link')}; "
                  + ("on real hosts: its switches and routers stand for the hosts' own network, each host's link is "
                     "made on its interface" if topology.get("on_hosts") else
                     f"{count(_routes_count(topology), 'route')} (plan --json lists them)"),
                  soft_wrap=True, highlight=False)
    links = topology["links"]
    shown = links if len(links) <= rows else [x for x in links if x["conditions"] != ["plain"]][:rows]
    for x in shown:
        console.print(f"  {escape(x['name'])}: {escape(x['a'])} -> {escape(x['b'])}  "
                      f"{escape(' | '.join(x['conditions']))}", soft_wrap=True, highlight=False)
    if len(shown) < len(links):
        console.print(f"  [dim]... {len(links) - len(shown):,} more links (--json lists every one)[/]")
    for pair in topology["endpoints"][:rows]:
        who = f" ({', '.join(pair['workloads'])})" if pair.get("workloads") else ""
        for client, path in pair["paths"].items():
            console.print(f"  path {escape(client)} -> {escape(pair['server'])}{escape(who)}: "
                          f"{escape(' -> '.join(path))}", soft_wrap=True, highlight=False)


def plan_view(plan: Any, console: Console, rows: int = 20) -> None:
    """`vnetbench plan`: what the run would be, its cost and what it needs, in a terminal's width."""
    n = len(plan.configurations)
    lo, hi = plan.repetitions
    reps = f"{lo} repetitions" if lo == hi else f"{lo}..{hi} repetitions (adaptive)"
    trials = plan.trials
    count = f"{trials[0]:,}" if trials[0] == trials[1] else f"{trials[0]:,}..{trials[1]:,}"
    wall = plan.wall_s
    when = _span(wall[0]) if trials[0] == trials[1] else f"{_span(wall[0])}..{_span(wall[1])}"
    console.print(f"[bold]{escape(plan.scenario)}[/] ({escape(plan.source)}): {n:,} configuration"
                  f"{'s' if n != 1 else ''} x {reps}{' + 1 warm-up' if plan.warmup else ''} = {count} trials")
    console.print(f"estimated time: [bold]{when}[/] (environments built once and the machine calibrated: "
                  f"{_span(plan.setup_s)}; each trial "
                  f"its workloads' seconds + {plan.as_json()['estimated_s']['per_trial_overhead']:g} s)")
    labels = list(dict.fromkeys(k for c in plan.configurations for k in c.labels))
    t = Table(box=None, pad_edge=False, header_style="bold")
    t.add_column("#", justify="right")
    for k in labels:
        t.add_column(escape(k))
    if not any("env" == k for k in labels):
        t.add_column("env")
    t.add_column("trial", justify="right")
    t.add_column("runs")
    for i, c in enumerate(plan.configurations[:rows], 1):
        cells = [escape(str(c.labels.get(k, ""))) for k in labels]
        if "env" not in labels:
            cells.append(escape(c.environment))
        t.add_row(str(i), *cells, f"{c.trial_s:.1f} s", escape(" then ".join(c.phases)))
    console.print(t)
    if n > rows:
        console.print(f"[dim]... {n - rows:,} more configurations (--json lists every one)[/]")
    found = [x["command"] for x in plan.tools if x["path"]]
    console.print(f"tools: {escape(', '.join(found)) or 'none'} found"
                  + "".join(f"; [red]{escape(x['command'])} missing[/]" for x in plan.tools if not x["path"]))
    console.print("environments: " + ", ".join(
        escape(e["variant"]) + (" [green]ok[/]" if not e["problems"] else " [red]cannot be built[/]")
        for e in plan.environments))
    if plan.hosts:
        placed = (", ".join(f"{n} on {h}" for n, h in plan.hosts["nodes"].items()) if plan.hosts.get("nodes") else
                  f"receiver {plan.hosts['receiver']}, senders {', '.join(plan.hosts['senders'])}")
        console.print(f"endpoints on real hosts (vnetbench run ... --hosts INVENTORY): {escape(placed)}; "
                      "the hosts are checked over SSH when the run starts", soft_wrap=True)
        # Where the traffic goes is the user's to see before it is sent: every address the scenario gives
        given = plan.hosts.get("addresses") or {}
        console.print("traffic to: " + "".join(f"{escape(h)} at {escape(a)}, " for h, a in given.items())
                      + ("the other hosts" if given else "every host") + " at the inventory's address"
                      + ("; each address given is checked to be on its host's interfaces" if given else ""),
                      soft_wrap=True, highlight=False)
        for h, i in (plan.hosts.get("interfaces") or {}).items():
            console.print(f"  {escape(h)}'s traffic through its interface {escape(i)}", soft_wrap=True,
                          highlight=False)
    if plan.kube:
        console.print("endpoints as pods of a Kubernetes cluster (vnetbench run ... --kube); the cluster is checked "
                      "when the run starts:", soft_wrap=True)
        for k in plan.kube:
            network = "the nodes' own network (hostNetwork)" if k["network"] == "host" else "the pod network"
            senders = {"same-node": "on the receiver's node",
                       "cross-node": "on " + (", ".join(k["senders"]) if k["senders"] else
                                              "the cluster's other Ready nodes")}.get(
                k.get("placement") or "", "on " + ", ".join(k["senders"]))
            receiver = f"node {k['receiver']}" if k["receiver"] else "the cluster's first Ready node"
            via = ", through a Service (ClusterIP)" if k.get("path") == "service" else ""
            console.print(f"  receiver on {escape(receiver)}, senders {escape(senders)}, in {network}{via}",
                          soft_wrap=True, highlight=False)
    if plan.scale:
        console.print(f"scaled: {escape(plan.scale)}", soft_wrap=True, highlight=False)
    for e in plan.left_out:
        console.print(f"[yellow]left out here[/] (if_available): {escape(e['environment'])}, "
                      f"{e['configurations']} configuration{'s' if e['configurations'] != 1 else ''}: {escape(e['reason'])}", soft_wrap=True)
    if plan.topology:
        topology_view(plan.topology, console)
    links = plan.links
    if links.get("choice") is not None:
        console.print("links: " + (", ".join(f"{k} -> {v}" for k, v in links["choice"].items()) or
                                   "plain (no shaping or conditions)"))
    elif links.get("note"):
        console.print(f"links: [dim]{escape(links['note'])}[/]")
    if plan.problems:
        console.print("[yellow]before it can run here:[/]")
        for p in plan.problems:
            console.print(f"  - {escape(p)}", soft_wrap=True)
    elif plan.hosts:
        console.print(f"[green]ready[/]: vnetbench run {escape(plan.source.removeprefix('builtin:'))} --hosts "
                      "INVENTORY can start (`vnetbench doctor --hosts INVENTORY` checks the hosts)")
    elif plan.kube:
        console.print(f"[green]ready[/]: vnetbench run {escape(plan.source.removeprefix('builtin:'))} --kube can "
                      "start (`vnetbench doctor --kube` checks the cluster)")
    else:
        console.print(f"[green]ready[/]: vnetbench run {escape(plan.source.removeprefix('builtin:'))} "
                      "can start on this machine")
