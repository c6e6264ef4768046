"""What the HTML report shows, read from the store and arranged for plotting.

The report looks at *entries*: one (run, configuration) pair each. Its labels
(the scenario's matrix values, plus ``run`` when several runs are reported)
decide where the entry is drawn:

* the **sweep axis** is a numeric label (ratio, delay, message size) that goes
  on the x axis of the "metric against parameter" charts;
* the **colour axis** is the label whose value picks an entry's colour in every
  chart (``run`` when runs are compared, else the categorical label with the
  fewest values, e.g. ``proto``), so UDP is the same colour everywhere;
* the remaining varying labels become box-plot categories and sweep lines;
* when that gives more boxes or lines than fit a laptop screen, the labels with
  the fewest values become **facets**: one selector at the top of the page picks
  the slice every chart shows, instead of 200 configurations in one chart.

Long series are downsampled here (min and max of each bucket, so spikes
survive) to a global point budget, and packed as 16-bit quantised base64 so a
run with thousands of trials still fits in a file people can e-mail.
"""

from __future__ import annotations

import base64
import html
import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vnetbench import units
from vnetbench.metrics import METRICS
from vnetbench.store.db import Store

#: More box-plot categories than this per chart and the page facets the data.
MAX_CATEGORIES = 24
#: More entries than this in one view (CDF lines) and the page facets the data.
MAX_ENTRIES_PER_VIEW = 48
#: Points per downsampled series never go above this.
MAX_POINTS_PER_SERIES = 2000
#: ... nor below this, however many trials share the budget (a minute of per-second values).
MIN_POINTS_PER_SERIES = 60
#: Bytes of packed series for all trials together (about 2.7 bytes per point of a
#: per-second series, whose times are implicit, and 5.3 for a per-packet one).
SERIES_BYTE_BUDGET = 3_500_000

#: Colour-blind-aware categorical palette (Tableau 10), one colour per colour-axis value.
PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#ff9da7",
           "#e15759", "#bab0ac"]
DASHES = ["solid", "dash", "dot", "dashdot", "longdash", "longdashdot"]

#: Labels that, when numeric, are the natural x axis of a sweep (first match wins).
SWEEP_PREFERENCE = ("ratio", "delay", "rtt", "size", "length", "msg_size", "message_size", "bottleneck", "rate",
                    "buffer", "loss", "parallel", "streams", "senders")
#: Known label meanings, for axis titles.
AXIS_TITLES = {
    "ratio": "over-subscription ratio (offered load / bottleneck)",
    "run": "run",
}

RUN_AXIS = "run"


# ----------------------------------------------------------------- values


def fmt_value(v: Any) -> str:
    """How a label value reads on a chart or in a table."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:g}"
    if v is None:
        return "—"
    return str(v)


def fmt_num(x: float | None, digits: int = 4) -> str:
    """A measured number with a sensible number of significant digits."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    if x == 0:
        return "0"
    if 10 ** digits <= abs(x) < 1e12:
        return f"{x:,.0f}"
    if abs(x) >= 1e12 or abs(x) < 1e-3:
        return f"{x:.{digits - 1}e}"
    return f"{x:.{digits}g}"


def _numeric_values(values: list[Any]) -> tuple[list[float], str] | None:
    """Numbers for an axis whose values are all numbers or all quantities with units.

    Returns (numbers, unit shown on the axis) or None for a categorical axis.
    Strings such as "10ms" or "50Mbit" become numbers, so a delay sweep is a
    real x axis, not a list of words.
    """
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        nums = [float(v) for v in values]
        return (nums, "") if all(math.isfinite(x) for x in nums) else None
    if not all(isinstance(v, str) and v.strip() and v.strip()[-1].isalpha() for v in values):
        return None
    for parse, scale, unit in ((units.parse_duration, 1e3, "ms"), (units.parse_rate, 1e-6, "Mbit/s"),
                               (units.parse_size, 1.0, "B")):
        try:
            nums = [parse(v) * scale for v in values]
        except (units.UnitError, ValueError):
            continue
        if unit == "B" and max(nums) >= 1e4:
            return [x / 1e3 for x in nums], "kB"
        return nums, unit
    return None


# ----------------------------------------------------------------- model


@dataclass
class Axis:
    """One label across every entry: its values in display order."""

    name: str
    values: list[str]  # display strings, sorted (numerically when numeric)
    numbers: dict[str, float] | None  # display string -> number, for numeric axes
    unit: str = ""

    @property
    def numeric(self) -> bool:
        return self.numbers is not None

    @property
    def varying(self) -> bool:
        return len(self.values) > 1

    @property
    def title(self) -> str:
        base = AXIS_TITLES.get(self.name, self.name)
        return f"{base} ({self.unit})" if self.unit else base


@dataclass
class Trial:
    id: int
    repetition: int
    position: int
    status: str
    reason: str | None
    started: float
    ended: float
    marked: list[str] = field(default_factory=list)  # why the machine's own noise marked it (Store.marked_trials)


@dataclass
class Entry:
    """One configuration of one run."""

    index: int
    run_id: str
    run_short: str
    key: str
    labels: dict[str, Any]  # as stored
    axis: dict[str, str]  # axis name -> display value (includes "run")
    params: dict[str, Any]
    expected: dict[str, float]
    lab_state: Any
    stop_reason: str | None
    values: dict[str, np.ndarray]
    trials: list[Trial] = field(default_factory=list)
    colour: str = PALETTE[0]
    colour_value: str = ""
    facet: str = "all"
    category: str = ""  # box-plot x category
    line: str = ""  # sweep line: varying labels except the sweep axis and the facet
    dash: str = "solid"
    label_text: str = ""  # every varying label, for tables and selectors
    short_label: str = ""  # varying labels not fixed by the facet


@dataclass
class RunInfo:
    id: str
    short: str
    record: dict[str, Any]  # Store.run()
    configurations: list[dict[str, Any]]
    trials: list[dict[str, Any]]
    meta: dict[str, tuple[str, str]]


@dataclass
class Facet:
    id: str
    title: str  # "env=bare, delay=10ms", or "" for the whole data set


@dataclass
class Layout:
    sweep: Axis | None
    colour: Axis | None
    box_axes: list[Axis]  # axes that make a box-plot category
    line_axes: list[Axis]  # axes that make a separate line in sweep charts
    facet_axes: list[Axis]
    facets: list[Facet]


@dataclass
class ReportModel:
    runs: list[RunInfo]
    entries: list[Entry]
    axes: dict[str, Axis]
    layout: Layout
    metrics: list[str]  # in registry order, then alphabetical
    meta: dict[str, tuple[str, str]]  # metric -> (unit, direction)

    @property
    def varying_axes(self) -> list[Axis]:
        return [a for a in self.axes.values() if a.varying]

    def entries_in(self, facet: str) -> list[Entry]:
        return [e for e in self.entries if e.facet == facet]


def load(store: Store, run_ids: list[str]) -> ReportModel:
    """Read the runs and arrange their configurations for the report."""
    if not run_ids:
        raise ValueError("a report needs at least one run id")
    runs: list[RunInfo] = []
    entries: list[Entry] = []
    meta: dict[str, tuple[str, str]] = {}
    width = 8  # the shortest prefix, from 8 characters up, that tells every run apart
    while len({r[:width] for r in run_ids}) < len(set(run_ids)) and width < max(len(r) for r in run_ids):
        width += 1
    for run_id in run_ids:
        record = store.run(run_id)
        short = run_id[:width]
        configs = store.configurations(run_id)
        trials = store.trials(run_id)
        run_meta = store.metric_meta(run_id)
        for m, um in run_meta.items():
            meta.setdefault(m, um)
        values = store.values(run_id)
        runs.append(RunInfo(run_id, short, record, configs, trials, run_meta))
        by_key: dict[str, list[Trial]] = {}
        marked = {(key, rep): why for key, per in store.marked_trials(run_id).items() for rep, why in per}
        for t in trials:
            by_key.setdefault(t["config_key"], []).append(
                Trial(t["id"], t["repetition"], t["position"], t["status"], t["reason"], t["started"], t["ended"],
                      marked.get((t["config_key"], t["repetition"]), [])))
        for c in configs:
            entries.append(Entry(
                index=len(entries), run_id=run_id, run_short=short, key=c["key"], labels=c["labels"] or {},
                axis={}, params=c["params"] or {}, expected=c["expected"] or {}, lab_state=c["lab_state"],
                stop_reason=c.get("stop_reason"), values=values.get(c["key"], {}),
                trials=sorted(by_key.get(c["key"], []), key=lambda t: (t.repetition, t.position)),
            ))
    present = {m for e in entries for m, v in e.values.items() if len(v)}
    for m in present:
        if m not in meta and m in METRICS:
            meta[m] = (METRICS[m].unit, METRICS[m].direction)
    order = {name: i for i, name in enumerate(METRICS)}
    metrics = sorted(present, key=lambda m: (order.get(m, len(order)), m))
    axes = _axes(entries, multi_run=len(runs) > 1)
    layout = _layout(entries, axes)
    return ReportModel(runs, entries, axes, layout, metrics, meta)


def _axes(entries: list[Entry], multi_run: bool) -> dict[str, Axis]:
    names: list[str] = []
    for e in entries:
        for k in e.labels:
            if k not in names:
                names.append(k)
    axes: dict[str, Axis] = {}
    if multi_run:
        shorts = list(dict.fromkeys(e.run_short for e in entries))
        axes[RUN_AXIS] = Axis(RUN_AXIS, shorts, None)
        for e in entries:
            e.axis[RUN_AXIS] = e.run_short
    for name in names:
        if name == RUN_AXIS and multi_run:
            continue  # a label called "run" would clash with the run axis; keep the run
        raw = [e.labels.get(name) for e in entries]
        distinct: dict[str, Any] = {}
        for v in raw:
            distinct.setdefault(fmt_value(v), v)
        present = [v for v in distinct.values() if v is not None]
        numeric = _numeric_values(present) if present and len(present) == len(distinct) else None
        if numeric is not None:
            numbers = dict(zip(distinct.keys(), numeric[0]))
            ordered = sorted(distinct, key=lambda d: numbers[d])
            axes[name] = Axis(name, ordered, numbers, numeric[1])
        else:
            axes[name] = Axis(name, list(distinct), None)
        for e, v in zip(entries, raw):
            e.axis[name] = fmt_value(v)
    return axes


def _choose_sweep(varying: list[Axis]) -> Axis | None:
    numeric = [a for a in varying if a.numeric and a.name != RUN_AXIS]
    if not numeric:
        return None
    for name in SWEEP_PREFERENCE:
        for a in numeric:
            if a.name.lower() == name:
                return a
    return max(numeric, key=lambda a: len(a.values))


def _choose_colour(varying: list[Axis], sweep: Axis | None) -> Axis | None:
    for a in varying:
        if a.name == RUN_AXIS:
            return a
    categorical = [a for a in varying if not a.numeric]
    if not categorical:
        categorical = [a for a in varying if a is not sweep]
    if not categorical:
        return None
    fewest = min(len(a.values) for a in categorical)
    return [a for a in categorical if len(a.values) == fewest][-1]


def _combo(entry: Entry, axes: list[Axis], with_names: bool = False, sep: str = " / ") -> str:
    if with_names:
        return ", ".join(f"{a.name}={entry.axis.get(a.name, '—')}" for a in axes)
    return sep.join(entry.axis.get(a.name, "—") for a in axes)


def _layout(entries: list[Entry], axes: dict[str, Axis]) -> Layout:
    varying = [a for a in axes.values() if a.varying]
    sweep = _choose_sweep(varying)
    colour = _choose_colour(varying, sweep)
    # Sweep axis last so box categories cluster by the other labels, each swept in order.
    others = [a for a in varying if a is not colour and a is not sweep]
    box_axes = others + ([sweep] if sweep is not None and sweep is not colour else [])
    facet_axes: list[Axis] = []

    def sizes() -> tuple[int, int]:
        cats = {_combo(e, [a for a in box_axes if a not in facet_axes]) for e in entries}
        per_view: dict[str, int] = {}
        for e in entries:
            k = _combo(e, facet_axes)
            per_view[k] = per_view.get(k, 0) + 1
        return len(cats), max(per_view.values(), default=0)

    candidates = sorted((a for a in others if a is not sweep), key=lambda a: len(a.values))
    while candidates:
        n_cats, n_view = sizes()
        if n_cats <= MAX_CATEGORIES and n_view <= MAX_ENTRIES_PER_VIEW:
            break
        facet_axes.append(candidates.pop(0))
    facet_axes.sort(key=lambda a: list(axes).index(a.name))
    box_axes = [a for a in box_axes if a not in facet_axes]
    line_axes = [a for a in varying if a is not sweep and a not in facet_axes]

    # Facets in the product order of their axes' values.
    facets: list[Facet] = []
    facet_of: dict[tuple[str, ...], str] = {}
    present = {tuple(e.axis.get(a.name, "—") for a in facet_axes) for e in entries}
    if facet_axes:
        for combo in itertools.product(*(a.values for a in facet_axes)):
            if combo in present:
                fid = f"f{len(facets)}"
                facet_of[combo] = fid
                facets.append(Facet(fid, ", ".join(f"{a.name}={v}" for a, v in zip(facet_axes, combo))))
    else:
        facets = [Facet("all", "")]

    colour_values = colour.values if colour else [""]
    colour_index = {v: i for i, v in enumerate(colour_values)}
    non_colour_lines = [a for a in line_axes if a is not colour]
    dash_keys: dict[str, int] = {}
    label_axes = [a for a in axes.values() if a.varying]
    for e in entries:
        e.colour_value = e.axis.get(colour.name, "") if colour else ""
        e.colour = PALETTE[colour_index.get(e.colour_value, 0) % len(PALETTE)]
        e.facet = facet_of.get(tuple(e.axis.get(a.name, "—") for a in facet_axes), "all")
        e.category = _combo(e, box_axes) if box_axes else "all"
        e.line = _combo(e, line_axes, sep=", ") if line_axes else "all"
        dkey = _combo(e, non_colour_lines)
        e.dash = DASHES[dash_keys.setdefault(dkey, len(dash_keys)) % len(DASHES)]
        e.label_text = _combo(e, label_axes, with_names=True) if label_axes else "(single configuration)"
        short_axes = [a for a in label_axes if a not in facet_axes]
        e.short_label = _combo(e, short_axes, with_names=True) if short_axes else e.label_text
    return Layout(sweep, colour, box_axes, line_axes, facet_axes, facets)


# --------------------------------------------------------------- series


def shade(hex_colour: str, amount: float) -> str:
    """Mix a #rrggbb colour with white: amount 0 keeps it, 1 gives white."""
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    mix = lambda c: int(round(c + (255 - c) * amount))  # noqa: E731
    return f"#{mix(r):02x}{mix(g):02x}{mix(b):02x}"


def rgba(hex_colour: str, alpha: float) -> str:
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha:g})"


def downsample_minmax(t: np.ndarray, v: np.ndarray, max_points: int) -> tuple[np.ndarray, np.ndarray]:
    """At most ``max_points`` points: the minimum and maximum of each of
    max_points/2 equal buckets, in time order. Spikes (the RTT outliers people
    look for) survive; the first and last points are kept too.
    """
    t = np.asarray(t, dtype=float)
    v = np.asarray(v, dtype=float)
    n = v.size
    if n <= max_points:
        return t, v
    buckets = max(1, (max_points - 2) // 2)
    size = math.ceil(n / buckets)
    buckets = math.ceil(n / size)
    pad = buckets * size - n
    finite = np.isfinite(v)
    lo_src = np.where(finite, v, np.inf)
    hi_src = np.where(finite, v, -np.inf)
    lo = np.concatenate([lo_src, np.full(pad, np.inf)]).reshape(buckets, size)
    hi = np.concatenate([hi_src, np.full(pad, -np.inf)]).reshape(buckets, size)
    base = np.arange(buckets) * size
    i_lo = base + lo.argmin(axis=1)
    i_hi = base + hi.argmax(axis=1)
    idx = np.unique(np.concatenate([[0, n - 1], np.minimum(i_lo, n - 1), np.minimum(i_hi, n - 1)]))
    return t[idx], v[idx]


def _round_sig(x: float, digits: int = 7) -> float:
    if x == 0 or not math.isfinite(x):
        return x
    return round(x, digits - 1 - int(math.floor(math.log10(abs(x)))))


def pack(a: np.ndarray) -> list[Any]:
    """A float array as ``[lo, hi, base64 of uint16]``; 65535 means NaN (a gap).

    Values are quantised to 65534 steps of their range: for a 0-45 ms RTT
    series a step is 0.7 us, far below what a chart can show, at a third of the
    bytes of JSON text. lo and hi are rounded to 7 significant digits.
    """
    a = np.asarray(a, dtype=float)
    if a.size == 0:
        return [0.0, 0.0, ""]
    lo, hi = float(a.min()), float(a.max())
    if math.isfinite(lo) and math.isfinite(hi):  # no NaN or inf anywhere: the fast path
        lo, hi = _round_sig(lo), _round_sig(hi)
        if hi > lo:
            q = np.clip((a - lo) * (65534 / (hi - lo)) + 0.5, 0, 65534).astype("<u2")
        else:
            q = np.zeros(a.shape, dtype="<u2")
        return [lo, hi, base64.b64encode(q.tobytes()).decode("ascii")]
    finite = np.isfinite(a)
    if finite.any():
        lo, hi = _round_sig(float(a[finite].min())), _round_sig(float(a[finite].max()))
    else:
        lo = hi = 0.0
    q = np.full(a.shape, 65535, dtype="<u2")
    if hi > lo:
        q[finite] = np.clip(np.round((a[finite] - lo) / (hi - lo) * 65534), 0, 65534).astype("<u2")
    else:
        q[finite] = 0
    return [lo, hi, base64.b64encode(q.tobytes()).decode("ascii")]


def pack_time(t: np.ndarray, regular: bool | None = None) -> list[Any]:
    """Times as ``[t0, dt]`` when evenly spaced (per-second series), else :func:`pack`."""
    t = np.asarray(t, dtype=float)
    if _is_regular(t) if regular is None else regular:
        return [_round_sig(float(t[0]), 9), _round_sig(float((t[-1] - t[0]) / (t.size - 1)), 9)]
    return pack(t)


def _is_regular(t: np.ndarray) -> bool:
    """Evenly spaced times (then :func:`pack_time` stores just t0 and dt)."""
    t = np.asarray(t, dtype=float)
    n = t.size
    if n < 2:
        return False
    step = (float(t[-1]) - float(t[0])) / (n - 1)
    if not (math.isfinite(step) and step > 0):
        return False
    return float(np.abs(np.diff(t) - step).max()) <= 1e-6 * max(1.0, step)


def series_cap(series: list[tuple[int, bool]], budget: int = SERIES_BYTE_BUDGET) -> int:
    """Points per series so that all series together fit the byte budget.

    ``series``: (points, evenly spaced times?) per series. Water-filling: the
    largest cap c with sum(min(n, c) x bytes per point) <= budget, so short
    per-second series stay whole and the long per-packet ones give way; never
    below MIN_POINTS_PER_SERIES nor above MAX_POINTS_PER_SERIES.
    """
    if not series:
        return MAX_POINTS_PER_SERIES
    n = np.array([s[0] for s in series], dtype=float)
    regular = np.array([s[1] for s in series], dtype=bool)

    def cost(c: float) -> float:
        # base64 of 2 bytes (value) or 4 (time and value) per point; a downsampled
        # series keeps bucket minima and maxima, whose times are no longer regular.
        kept = np.minimum(n, c)
        bpp = np.where(regular & (n <= c), 8 / 3, 16 / 3)
        return float((kept * bpp).sum())

    lo, hi = MIN_POINTS_PER_SERIES, MAX_POINTS_PER_SERIES
    if cost(hi) <= budget:
        return hi
    if cost(lo) > budget:
        return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if cost(mid) <= budget else (lo, mid)
    return lo


def unpack(p: list[Any], n: int | None = None) -> np.ndarray:
    """The inverse of :func:`pack` / :func:`pack_time` (what the page's script does), for tests."""
    if len(p) == 2:
        return p[0] + np.arange(n) * p[1]
    lo, hi, b = p
    q = np.frombuffer(base64.b64decode(b), dtype="<u2").astype(float)
    out = lo + q / 65534 * (hi - lo)
    out[q == 65535] = np.nan
    return out


SERIES_KINDS = {
    # kind: (row title, unit shown, scale applied to the stored values)
    "throughput_mbps": ("Received throughput per flow", "Mbit/s", 1.0),
    "rtt_ms": ("Round-trip time", "ms", 1.0),
    "srtt_ms": ("Round-trip time", "ms", 1.0),
    "cwnd_bytes": ("Congestion window", "kB", 1e-3),
    "rr_rtt_us": ("Request/response round trip", "us", 1.0),
    "irtt_rtt_ms": ("Round-trip time", "ms", 1.0),
}
#: Series whose every point is a latency sample, pooled per configuration for the CDFs: kind -> (the
#: instrument's words for it, scale to milliseconds). Each kind gets its own chart: packets of two
#: instruments are never pooled together.
LATENCY_KINDS = {
    "rtt_ms": ("ping round-trip time", 1.0),
    "rr_rtt_us": ("request/response round trip (sockperf)", 1e-3),
    "irtt_rtt_ms": ("UDP round-trip time (irtt)", 1.0),
}
ROW_ORDER = ["throughput_mbps", "rtt_ms", "cwnd_bytes"]
ROW_OF = {"srtt_ms": "rtt_ms", "irtt_rtt_ms": "rtt_ms"}


def series_display_name(name: str) -> str:
    kind, _, host = name.partition("/")
    if kind == "rtt_ms":
        return "ping RTT" + (f" {host}" if host else "")
    if kind == "srtt_ms":
        return f"TCP srtt {host}".strip()
    if kind == "cwnd_bytes":
        return f"cwnd {host}".strip()
    if kind == "throughput_mbps":
        return host or "throughput"
    if kind == "rr_rtt_us":
        return "request/response RTT"
    return name


@dataclass
class SeriesData:
    rows: list[dict[str, Any]]  # [{id, title}], in display order
    kinds: list[dict[str, Any]]  # series catalogue: name, kind, row, host, unit
    trials: list[dict[str, Any]]  # per trial: entry, rep, status, reason, series [{k, n, t, v}]
    downsampled: int  # number of series that were downsampled
    longest: int  # longest stored series (points)
    cap: int  # points per series after downsampling
    latency_pooled: dict[str, dict[int, np.ndarray]]  # LATENCY_KINDS kind -> entry index -> every sample (ms)


def collect_series(store: Store, model: ReportModel) -> SeriesData:
    """Every trial's stored series, downsampled to the budget and packed for the page."""
    raw: list[tuple[Entry, Trial, list]] = []
    for e in model.entries:
        for t in e.trials:
            raw.append((e, t, store.series(t.id)))
    regular = {id(r): _is_regular(r.t) for _, _, recs in raw for r in recs}
    cap = series_cap([(r.v.size, regular[id(r)]) for _, _, recs in raw for r in recs])
    rows: dict[str, dict[str, Any]] = {}
    kinds: dict[tuple[str, str], int] = {}
    catalogue: list[dict[str, Any]] = []
    trials_out: list[dict[str, Any]] = []
    pooled: dict[str, dict[int, list[np.ndarray]]] = {}
    downsampled = 0
    longest = 0
    for e, t, recs in raw:
        packed = []
        for r in recs:
            kind = r.name.partition("/")[0]
            row_id = ROW_OF.get(kind, kind)
            title, unit, scale = SERIES_KINDS.get(kind, (kind, r.unit, 1.0))
            if row_id not in rows:
                row_title = SERIES_KINDS[row_id][0] if row_id in SERIES_KINDS else title
                rows[row_id] = {"id": row_id, "title": html.escape(f"{row_title} ({unit})" if unit else row_title)}
            k = kinds.get((r.name, r.unit))
            if k is None:
                k = kinds[(r.name, r.unit)] = len(catalogue)
                catalogue.append({"name": html.escape(series_display_name(r.name)), "kind": kind, "row": row_id,
                                  "host": r.name.partition("/")[2], "unit": html.escape(unit)})
            tt, vv = np.asarray(r.t, dtype=float), np.asarray(r.v, dtype=float)
            longest = max(longest, vv.size)
            if kind in LATENCY_KINDS and t.status == "ok":
                fin = vv[np.isfinite(vv)] * LATENCY_KINDS[kind][1]
                if fin.size:
                    pooled.setdefault(kind, {}).setdefault(e.index, []).append(fin)
            n0 = vv.size
            is_regular = regular[id(r)]
            if n0 > cap:
                tt, vv = downsample_minmax(tt, vv, cap)
                downsampled += 1
                is_regular = None  # bucket minima and maxima: check again
            item: dict[str, Any] = {"k": k, "t": pack_time(tt, is_regular), "v": pack(vv * scale if scale != 1 else vv)}
            if vv.size != n0:
                item["n"] = int(n0)  # stored points, when fewer are shown
            packed.append(item)
        out = {"entry": e.index, "rep": t.repetition, "status": t.status, "series": packed}
        if t.reason:
            out["reason"] = t.reason
        trials_out.append(out)
    ordered_rows = sorted(rows.values(), key=lambda r: (ROW_ORDER.index(r["id"]) if r["id"] in ROW_ORDER
                                                         else len(ROW_ORDER), r["id"]))
    return SeriesData(ordered_rows, catalogue, trials_out, downsampled, longest, cap,
                      {kind: {k: np.concatenate(v) for k, v in per.items()} for kind, per in pooled.items()})
