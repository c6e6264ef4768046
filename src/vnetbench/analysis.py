"""Glue between the store and the statistics: comparisons, baselines, history.

Everything here reads the store, hands plain arrays to :mod:`vnetbench.stats`
and returns JSON-ready results; printing is :mod:`vnetbench.report.terminal`'s
and argument parsing :mod:`vnetbench.cli_analysis`'s.

* :func:`compare_runs` -- run A (the reference, e.g. a baseline) against run B,
  configuration by configuration, matched by the configuration's stable key
  (a hash of its labels), never by position. Configurations present on one
  side only are listed as such.
* :func:`compare_within` -- one run, one label: every configuration whose label
  ``by`` has another value than ``ref`` is compared with the configuration
  that has ``by = ref`` and all other labels equal (container vs bare,
  e1000 vs virtio).
* :func:`history` -- a metric's per-run median over every stored run of a
  scenario, in time order, one line per configuration, with change points
  (E-divisive means, Hunter's variant).

Which metrics a comparison judges matters for its power: Holm's correction
divides alpha among the metrics of one configuration, and with 5 trials per
side (and no ties) the smallest possible Mann-Whitney p-value is 2/252 = 0.008,
so more than six metrics in one family could never be "changed". By default a
comparison therefore judges the headline metrics (:data:`DEFAULT_METRICS`);
``metrics`` chooses others, ``all_metrics`` takes every stored one (and a note
names the metrics that cannot be "changed" with their own trial counts and
values in a family that large).
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np

from vnetbench import units
from vnetbench.errors import VnetbenchError
from vnetbench.units import UnitError, parse_percent, utc_iso
from vnetbench.metrics import METRICS
from vnetbench.stats import (
    IMPROVED,
    INCONCLUSIVE,
    REGRESSED,
    UNCHANGED,
    Comparison,
    compare_many,
    detect_change_points,
    holm,
    junit_xml,
    smallest_pvalue,
    summarize,
)
from vnetbench.metrics import HEADLINE, in_order
from vnetbench.runner import calibration
from vnetbench.stats.compare import DEFAULT_ALPHA, DEFAULT_N_BOOT, DEFAULT_NOISE
from vnetbench.store.db import Store

#: What a comparison judges unless told otherwise: what a person asks first
#: ("did throughput, loss, delay or fairness change?"), one metric per question.
DEFAULT_METRICS = HEADLINE

#: History: E-divisive window and significance (Hunter's defaults).
HISTORY_WINDOW = 50
HISTORY_PVALUE = 0.001

#: Order in which verdicts are listed: what needs attention first.
VERDICT_ORDER = (REGRESSED, IMPROVED, INCONCLUSIVE, UNCHANGED)

# Fingerprint entries worth naming when two runs differ in them.
_FINGERPRINT_KEYS = ("kernel", "kernel_version", "hostname", "cpu_model", "cpus", "vnetbench_version",
                     "vnetbench_git")


# ---------------------------------------------------------------- small parsers


def parse_fraction(text: str | float, what: str) -> float:
    """'5%' or '0.05' (or 0.05) -> 0.05; a finite value >= 0, else a VnetbenchError naming ``what``."""
    try:
        value = parse_percent(str(text))
    except UnitError:
        raise VnetbenchError(f"{what}: {text!r} is not a fraction; write e.g. 5% or 0.05") from None
    if not math.isfinite(value) or value < 0:
        raise VnetbenchError(f"{what}: {text!r} must be a fraction >= 0 (5% or 0.05)")
    return value


def parse_noise_overrides(items: Iterable[str] | None) -> dict[str, float]:
    """``METRIC=FRACTION`` items (``rtt.p99_ms=10%``) -> {metric: fraction}."""
    out: dict[str, float] = {}
    for item in items or []:
        if "=" not in item:
            raise VnetbenchError(f"--noise {item!r}: expected METRIC=FRACTION, e.g. --noise rtt.p99_ms=10%")
        name, value = item.split("=", 1)
        out[name.strip()] = parse_fraction(value, f"--noise {name.strip()}")
    return out


def parse_where(items: Iterable[str] | None) -> dict[str, str]:
    """``label=value`` items -> {label: value text}."""
    out: dict[str, str] = {}
    for item in items or []:
        if "=" not in item:
            raise VnetbenchError(f"--where {item!r}: expected LABEL=VALUE, e.g. --where proto=udp")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def label_matches(value: Any, text: str) -> bool:
    """Whether a stored label value equals a value typed on the command line (2 == 2.0 == '2.0')."""
    if str(value) == text:
        return True
    if isinstance(value, bool):
        return text.lower() == str(value).lower()
    if isinstance(value, (int, float)):
        try:
            return float(text) == float(value)
        except ValueError:
            return False
    return False


def label_text(labels: dict[str, Any], skip: Iterable[str] = ()) -> str:
    skip = set(skip)
    return ", ".join(f"{k}={v}" for k, v in labels.items() if k not in skip) or "(single configuration)"


def metric_unit_direction(name: str, recorded: dict[str, tuple[str, str]] | None = None) -> tuple[str, str]:
    """(unit, direction) from the registry; for metrics it does not know, as recorded with the samples."""
    meta = METRICS.get(name)
    if meta is not None:
        return meta.unit, meta.direction
    if recorded and name in recorded:
        return recorded[name]
    return "", "higher"


def noise_for(name: str, overrides: dict[str, float] | None = None, default: float = DEFAULT_NOISE) -> float:
    """The noise threshold of a metric: --noise METRIC=, else the metric's own, else the default."""
    if overrides and name in overrides:
        return overrides[name]
    meta = METRICS.get(name)
    if meta is not None and meta.noise is not None:
        return meta.noise
    return default


def _metric_order(names: Iterable[str]) -> list[str]:
    registry = list(METRICS)
    return sorted(set(names), key=lambda m: (registry.index(m) if m in registry else len(registry), m))


def _when(ts: float | None) -> str | None:
    return utc_iso(ts)


def _fmt_param(name: str, value: Any) -> str:
    if value is None:
        return "(not recorded)"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "_bps" in name:
            return units.format_rate(value)
        if name.endswith("_bytes"):
            return units.format_size(value)
        if name.endswith("_s"):
            return units.format_duration(value)
        return f"{value:g}"
    return str(value)


# ---------------------------------------------------------------- comparison results


@dataclass
class PairResult:
    """One compared pair of configurations and its per-metric comparisons (one Holm family)."""

    pair: str  # "A → B" or "env: bare → container"
    config: str  # what the configuration is, in labels
    labels: dict[str, Any]
    key_a: str
    key_b: str
    results: list[Comparison] = field(default_factory=list)
    units: dict[str, str] = field(default_factory=dict)
    note: str | None = None  # why nothing (or not everything) was compared
    marked: tuple[int, int] = (0, 0)  # trials of A and of B the machine's own noise marked (Store.marked_trials)

    def to_dict(self) -> dict[str, Any]:
        return {
            "pair": self.pair, "config": self.config, "labels": self.labels, "key_a": self.key_a,
            "key_b": self.key_b, "note": self.note, "marked_trials": {"a": self.marked[0], "b": self.marked[1]},
            "results": [{**r.to_dict(), "unit": self.units.get(r.metric, "")} for r in self.results],
        }


@dataclass
class ComparisonReport:
    """Everything one ``vnetbench compare`` found, JSON-ready through :meth:`to_dict`."""

    kind: str  # "runs" or "within"
    title: str
    a: str  # run id of the reference side
    b: str
    alpha: float
    seed: int
    noise_default: float
    noise_overrides: dict[str, float]
    metrics: list[str]
    pairs: list[PairResult]
    only_a: list[dict[str, Any]] = field(default_factory=list)  # {key, labels, config}
    only_b: list[dict[str, Any]] = field(default_factory=list)
    by: str | None = None
    ref: str | None = None
    a_info: dict[str, Any] = field(default_factory=dict)
    b_info: dict[str, Any] = field(default_factory=dict)
    differences: list[dict[str, Any]] = field(default_factory=list)  # {what, name, a, b}
    notes: list[str] = field(default_factory=list)

    def rows(self) -> list[tuple[PairResult, Comparison]]:
        return [(p, r) for p in self.pairs for r in p.results]

    def counts(self) -> dict[str, int]:
        out = {v: 0 for v in VERDICT_ORDER}
        for _, r in self.rows():
            out[r.verdict] += 1
        return out

    @property
    def regressions(self) -> list[tuple[PairResult, Comparison]]:
        return [(p, r) for p, r in self.rows() if r.verdict == REGRESSED]

    @property
    def regressed(self) -> bool:
        return bool(self.regressions)

    def sorted_rows(self) -> list[tuple[PairResult, Comparison]]:
        """Regressions first, then improvements, inconclusive, unchanged; stable otherwise."""
        rank = {v: i for i, v in enumerate(VERDICT_ORDER)}
        return sorted(self.rows(), key=lambda pr: rank[pr[1].verdict])

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; the shape `vnetbench report` also accepts as a given comparison."""
        return {
            "kind": self.kind, "title": self.title, "a": self.a, "b": self.b, "by": self.by, "ref": self.ref,
            "a_run": self.a_info, "b_run": self.b_info,
            "alpha": self.alpha, "seed": self.seed, "noise_default": self.noise_default,
            "noise_overrides": self.noise_overrides, "metrics": self.metrics,
            "counts": self.counts(), "regressed": self.regressed,
            "configurations": [p.to_dict() for p in self.pairs],
            "only_a": self.only_a, "only_b": self.only_b,
            "differences": self.differences, "notes": self.notes,
        }

    def junit(self) -> str:
        """JUnit XML: one test case per configuration and metric; only a regression fails."""
        cases: list[tuple[str, str, str, str]] = []
        for p in self.pairs:
            classname = p.config if self.kind == "runs" else f"{p.pair} | {p.config}"
            for r in p.results:
                cases.append((classname, r.metric, r.verdict, r.reason))
            if not p.results:
                cases.append((classname, "(configuration)", INCONCLUSIVE, p.note or "nothing compared"))
        for side, items in (("A (reference)", self.only_a), ("B", self.only_b)):
            for c in items:
                cases.append((c["config"], "(configuration)", INCONCLUSIVE,
                              f"only in run {side}: {c.get('reason') or 'not compared'}"))
        return junit_xml(self.title, cases)


# ---------------------------------------------------------------- comparing


def _run_info(store: Store, run_id: str) -> dict[str, Any]:
    run = store.run(run_id)
    return {"id": run_id, "scenario": run["scenario_name"], "started": _when(run["started"]),
            "status": run["status"], "overrides": run["overrides"]}


def _default_metrics(present: set[str], all_metrics: bool) -> list[str]:
    if all_metrics:
        return _metric_order(present)
    chosen = in_order(DEFAULT_METRICS, present)
    return chosen or _metric_order(present)


def _check_noise_names(overrides: dict[str, float], present: set[str]) -> None:
    for name in overrides:
        if name not in present and name not in METRICS:
            raise VnetbenchError(f"--noise {name}=...: no metric {name!r}; stored metrics: "
                                 f"{', '.join(_metric_order(present))}")


def _power_notes(compared: list[tuple[PairResult, list[tuple]]], alpha: float) -> list[str]:
    """Say which metrics can never be reported as changed, given their trials and their Holm family.

    ``compared``: each compared configuration with the items it was judged on
    (metric, values A, values B, ...), in the order of its results. Per
    configuration, each tested metric's smallest reachable p-value (the test
    on the most extreme split of its own pooled values, ties and sample sizes
    included) is Holm-adjusted together with the other metrics' smallest ones.
    Holm's adjusted p-values only grow when any p-value grows, so a metric
    whose adjusted value is still >= alpha cannot be "changed", whatever its
    trials or the other metrics had shown.
    """
    # (na, nb, m) -> [configurations, smallest raw, smallest adjusted] where no metric can change
    whole: dict[tuple[int, int, int], list] = {}
    # (na, nb, m, metric) -> same, for single metrics of families that can otherwise change
    single: dict[tuple[int, int, int, str], list] = {}

    def add(table: dict, key: tuple, raw: float, adj: float) -> None:
        entry = table.setdefault(key, [0, math.inf, math.inf])
        entry[0] += 1
        entry[1] = min(entry[1], raw)
        entry[2] = min(entry[2], adj)

    for pr, items in compared:
        tested = [(r, it) for r, it in zip(pr.results, items) if r.p_value is not None]
        if not tested:
            continue
        m = len(tested)
        reach = [smallest_pvalue(it[1], it[2]) for _, it in tested]
        adjusted = holm(reach).tolist()
        blocked, open_ = [], 0
        for (r, it), raw, adj in zip(tested, reach, adjusted):
            if np.ptp(np.concatenate([np.asarray(it[1], float), np.asarray(it[2], float)])) == 0:
                continue  # all values equal: reported as unchanged, nothing to reach
            if adj >= alpha:
                blocked.append((r, raw, adj))
            else:
                open_ += 1
        if not blocked:
            continue
        sizes = {(r.n_a, r.n_b) for r, _, _ in blocked}
        if open_ == 0 and len(sizes) == 1:
            (na, nb), = sizes
            add(whole, (na, nb, m), min(x for _, x, _ in blocked), min(x for _, _, x in blocked))
        else:
            for r, raw, adj in blocked:
                add(single, (r.n_a, r.n_b, m, r.metric), raw, adj)

    def reach_text(raw: float, adj: float, m: int) -> str:
        holm_part = f", {min(1.0, adj):.2g} after Holm over {m} metrics" if m > 1 else ""
        advice = "add repetitions" if raw >= alpha else "add repetitions or judge fewer metrics (--metric)"
        return (f"the smallest p-value the test can reach is {raw:.2g}{holm_part}, not below alpha {alpha:g}; "
                f"{advice}")

    notes = []
    for (na, nb, m), (count, raw, adj) in sorted(whole.items()):
        family = f"{m} metric" if m == 1 else f"{m} metrics"
        notes.append(f"{count} configuration(s) with n={na} vs {nb} trials and {family}: no metric can be "
                     f"reported as changed; {reach_text(raw, adj, m)}")
    # metrics with the same trial counts, family size and number of configurations share a note
    shared: dict[tuple[int, int, int, int], list] = {}
    for (na, nb, m, metric), (count, raw, adj) in single.items():
        entry = shared.setdefault((na, nb, m, count), [[], math.inf, math.inf])
        entry[0].append(metric)
        entry[1] = min(entry[1], raw)
        entry[2] = min(entry[2], adj)
    for (na, nb, m, count), (names, raw, adj) in sorted(shared.items()):
        notes.append(f"{', '.join(_metric_order(names))} ({count} configuration(s), n={na} vs {nb} trials, "
                     f"{m} metrics judged together) cannot be reported as changed; {reach_text(raw, adj, m)}")
    return notes


def _compare_pairs(
    pairs: list[tuple[str, str, dict[str, Any], str, str]],
    values_a: dict[str, dict[str, np.ndarray]],
    values_b: dict[str, dict[str, np.ndarray]],
    recorded: dict[str, tuple[str, str]],
    metrics: Sequence[str] | None,
    all_metrics: bool,
    alpha: float,
    seed: int,
    noise_overrides: dict[str, float],
    noise_default: float,
    n_boot: int,
    where: str,
) -> tuple[list[PairResult], list[str], list[str]]:
    """Run the statistics for matched pairs. ``pairs``: (pair, config, labels, key_a, key_b)."""
    present: set[str] = set()
    for _, _, _, ka, kb in pairs:
        present |= set(values_a.get(ka, {})) & set(values_b.get(kb, {}))
    everything = {m for v in (values_a, values_b) for per in v.values() for m in per}
    _check_noise_names(noise_overrides, everything)
    if metrics:
        unknown = [m for m in metrics if m not in everything]
        if unknown:
            raise VnetbenchError(f"--metric {', '.join(unknown)}: not stored in {where}; stored metrics: "
                                 f"{', '.join(_metric_order(everything)) or '(none)'}")
    chosen = list(dict.fromkeys(metrics)) if metrics else _default_metrics(present, all_metrics)

    results: list[PairResult] = []
    groups: list[list[tuple]] = []
    grouped: list[PairResult] = []
    one_sided: dict[str, set[str]] = {}
    for pair, config, labels, ka, kb in pairs:
        va, vb = values_a.get(ka, {}), values_b.get(kb, {})
        pr = PairResult(pair=pair, config=config, labels=labels, key_a=ka, key_b=kb)
        results.append(pr)
        if not va or not vb:
            side = "A" if not va else "B"
            if not va and not vb:
                side = "A or B"
            pr.note = f"no successful trial in {side}: nothing to compare"
            continue
        items = []
        for m in chosen:
            if m in va and m in vb:
                unit, direction = metric_unit_direction(m, recorded)
                pr.units[m] = unit
                meta = METRICS.get(m)
                items.append((m, va[m], vb[m], direction, noise_for(m, noise_overrides, noise_default),
                              meta.resolution if meta else None))
            elif m in va or m in vb:
                one_sided.setdefault(m, set()).add("A" if m in va else "B")
        if not items:
            pr.note = "no metric measured on both sides"
            continue
        groups.append(items)
        grouped.append(pr)
    if groups:
        for pr, comps in zip(grouped, compare_many(groups, alpha=alpha, seed=seed, n_boot=n_boot)):
            pr.results = comps
    notes = [f"{m} was measured only in {'/'.join(sorted(s))} for some configurations: not compared there"
             for m, s in sorted(one_sided.items())]
    notes += _power_notes(list(zip(grouped, groups)), alpha)
    return results, chosen, notes


def _mark(pairs: list[PairResult], marked_a: dict[str, list], marked_b: dict[str, list]) -> list[str]:
    """Count each pair's marked trials (steal or other processes above metrics.NOISE_MARKS) and say where a
    change was found on them: the change may be the machine's, not the configurations'."""
    notes = []
    for pr in pairs:
        pr.marked = (len(marked_a.get(pr.key_a, ())), len(marked_b.get(pr.key_b, ())))
        changed = [r.metric for r in pr.results if r.verdict in ("improved", "regressed")]
        if changed and any(pr.marked):
            notes.append(f"{pr.config}: {', '.join(changed)} changed, and {pr.marked[0]} trial(s) of A and "
                         f"{pr.marked[1]} of B ran while the machine was busy with other work (steal or other "
                         "processes: `vnetbench show` lists them); run again on a quiet machine before trusting it")
    return notes


def _differences(store: Store, run_a: str, run_b: str, matched: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """Parameters and machine facts that differ between the two runs (what a comparison measures)."""
    out: list[dict[str, Any]] = []
    pa = {c["key"]: c["params"] for c in store.configurations(run_a)}
    pb = {c["key"]: c["params"] for c in store.configurations(run_b)}
    params: dict[str, tuple[set[str], set[str]]] = {}
    for ka, kb in matched:
        a, b = pa.get(ka, {}), pb.get(kb, {})
        for name in sorted(set(a) | set(b)):
            if a.get(name) != b.get(name):
                sa, sb = params.setdefault(name, (set(), set()))
                sa.add(_fmt_param(name, a.get(name)))
                sb.add(_fmt_param(name, b.get(name)))
    for name, (sa, sb) in params.items():
        out.append({"what": "parameter", "name": name, "a": ", ".join(sorted(sa)), "b": ", ".join(sorted(sb))})
    fa, fb = store.run(run_a)["fingerprint"], store.run(run_b)["fingerprint"]
    flat_a = {k: fa.get(k) for k in _FINGERPRINT_KEYS}
    flat_b = {k: fb.get(k) for k in _FINGERPRINT_KEYS}
    for section in ("tools", "sysctls"):
        for k in set(fa.get(section) or {}) | set(fb.get(section) or {}):
            flat_a[f"{section}.{k}"] = (fa.get(section) or {}).get(k)
            flat_b[f"{section}.{k}"] = (fb.get(section) or {}).get(k)
    # What `run --hosts` ran on: each host's facts (its clock offset varies by nature and is left out), and the
    # hosts themselves when one run has a host the other has not.
    hosts_a, hosts_b = fa.get("hosts") or {}, fb.get("hosts") or {}
    for host in set(hosts_a) | set(hosts_b):
        facts_a, facts_b = hosts_a.get(host), hosts_b.get(host)
        if facts_a is None or facts_b is None:
            flat_a[f"hosts.{host}"] = "a host of this run" if facts_a is not None else None
            flat_b[f"hosts.{host}"] = "a host of this run" if facts_b is not None else None
            continue
        for k in (set(facts_a) | set(facts_b)) - {"clock"}:
            flat_a[f"hosts.{host}.{k}"] = facts_a.get(k)
            flat_b[f"hosts.{host}.{k}"] = facts_b.get(k)
    # What `run --kube` ran on: the cluster, its version, the pods' image and network, and each node's facts
    # (kernel, runtime, ... and its devices' MTUs and the pod network's encapsulation); the context's name and
    # the nodes' addresses name the same cluster differently, and are left out.
    kube_a, kube_b = _flat("kube", fa.get("kube") or {}), _flat("kube", fb.get("kube") or {})
    for k in set(kube_a) | set(kube_b):
        if k != "kube.context" and ".addresses." not in k:
            flat_a[k], flat_b[k] = kube_a.get(k), kube_b.get(k)
    for k in sorted(flat_a):
        if flat_a[k] != flat_b.get(k):
            out.append({"what": "machine", "name": k, "a": str(flat_a[k]), "b": str(flat_b.get(k))})
    return out


def _flat(prefix: str, value: Any) -> dict[str, Any]:
    """A nested record as dotted keys: {"kube.nodes.node1.kernel": "6.1", ...}."""
    if not isinstance(value, dict) or not value:
        return {prefix: value}
    return {k: v for key, sub in value.items() for k, v in _flat(f"{prefix}.{key}", sub).items()}


def compare_runs(
    store: Store,
    run_a: str,
    run_b: str,
    *,
    metrics: Sequence[str] | None = None,
    all_metrics: bool = False,
    alpha: float = DEFAULT_ALPHA,
    seed: int = 0,
    noise_overrides: dict[str, float] | None = None,
    noise_default: float = DEFAULT_NOISE,
    n_boot: int = DEFAULT_N_BOOT,
    title: str | None = None,
) -> ComparisonReport:
    """Run A (reference) vs run B, configuration by configuration, matched by key."""
    noise_overrides = dict(noise_overrides or {})
    _check_alpha(alpha)
    ca = store.configurations(run_a)
    cb = store.configurations(run_b)
    keys_b = {c["key"]: c for c in cb}
    keys_a = {c["key"] for c in ca}
    info_a, info_b = _run_info(store, run_a), _run_info(store, run_b)
    pair_name = f"{run_a} → {run_b}"
    matched = [(pair_name, label_text(c["labels"]), c["labels"], c["key"], c["key"]) for c in ca if c["key"] in keys_b]
    values_a, values_b = store.values(run_a), store.values(run_b)
    only_a = [{"key": c["key"], "labels": c["labels"], "config": label_text(c["labels"]),
               "reason": f"run {run_b} has no configuration with these labels"} for c in ca if c["key"] not in keys_b]
    only_b = [{"key": c["key"], "labels": c["labels"], "config": label_text(c["labels"]),
               "reason": f"run {run_a} has no configuration with these labels"} for c in cb if c["key"] not in keys_a]
    recorded = {**store.metric_meta(run_a), **store.metric_meta(run_b)}
    pairs, chosen, notes = _compare_pairs(
        matched, values_a, values_b, recorded, metrics, all_metrics, alpha, seed, noise_overrides,
        noise_default, n_boot, f"runs {run_a} and {run_b}")
    notes += _mark(pairs, store.marked_trials(run_a), store.marked_trials(run_b))
    machine = calibration.differences(store.run(run_a)["fingerprint"].get("calibration"),
                                      store.run(run_b)["fingerprint"].get("calibration"))
    notes += [f"the machine itself measured differently in B: {line}; a change found here may be the machine's"
              for line in machine]
    if info_a["scenario"] != info_b["scenario"]:
        notes.insert(0, f"different scenarios: {info_a['scenario']} (A) and {info_b['scenario']} (B); "
                        "configurations are still matched by their labels")
    if run_a == run_b:
        notes.insert(0, "A and B are the same run: everything is unchanged by construction")
    for side, info in (("A", info_a), ("B", info_b)):
        if info["status"] != "completed":
            notes.append(f"run {side} ({info['id']}) is {info['status']}: some trials may be missing")
    return ComparisonReport(
        kind="runs", title=title or f"vnetbench compare {run_a} {run_b}", a=run_a, b=run_b, alpha=alpha, seed=seed,
        noise_default=noise_default, noise_overrides=noise_overrides, metrics=chosen, pairs=pairs,
        only_a=only_a, only_b=only_b, a_info=info_a, b_info=info_b,
        differences=_differences(store, run_a, run_b, [(p.key_a, p.key_b) for p in pairs]), notes=notes)


def compare_within(
    store: Store,
    run_id: str,
    by: str,
    ref: str,
    *,
    metrics: Sequence[str] | None = None,
    all_metrics: bool = False,
    alpha: float = DEFAULT_ALPHA,
    seed: int = 0,
    noise_overrides: dict[str, float] | None = None,
    noise_default: float = DEFAULT_NOISE,
    n_boot: int = DEFAULT_N_BOOT,
) -> ComparisonReport:
    """Within one run: every value of label ``by`` against ``by = ref``, the other labels held equal."""
    noise_overrides = dict(noise_overrides or {})
    _check_alpha(alpha)
    configs = store.configurations(run_id)
    with_label = [c for c in configs if by in c["labels"]]
    if not with_label:
        names = sorted({k for c in configs for k in c["labels"]})
        raise VnetbenchError(f"--by {by}: run {run_id} has no label {by!r}; its labels are: "
                             f"{', '.join(names) or '(none: a single configuration)'}")
    values_of = list(dict.fromkeys(str(c["labels"][by]) for c in with_label))
    refs = [c for c in with_label if label_matches(c["labels"][by], ref)]
    if not refs:
        raise VnetbenchError(f"--ref {ref}: no configuration of run {run_id} has {by}={ref}; "
                             f"values of {by}: {', '.join(values_of)}")
    if len(refs) == len(with_label):
        raise VnetbenchError(f"every configuration of run {run_id} has {by}={ref}: there is nothing to compare with it")

    def rest(labels: dict[str, Any]) -> str:
        return json.dumps({k: v for k, v in labels.items() if k != by}, sort_keys=True, default=str)

    ref_by_rest = {rest(c["labels"]): c for c in refs}
    matched = []
    unpaired = []
    for c in with_label:
        if label_matches(c["labels"][by], ref):
            continue
        r = ref_by_rest.get(rest(c["labels"]))
        if r is None:
            unpaired.append({"key": c["key"], "labels": c["labels"], "config": label_text(c["labels"]),
                             "reason": f"no configuration with {by}={ref} and the same other labels"})
            continue
        matched.append((f"{by}: {r['labels'][by]} → {c['labels'][by]}", label_text(c["labels"], skip=[by]),
                        c["labels"], r["key"], c["key"]))
    values = store.values(run_id)
    recorded = store.metric_meta(run_id)
    pairs, chosen, notes = _compare_pairs(
        matched, values, values, recorded, metrics, all_metrics, alpha, seed, noise_overrides,
        noise_default, n_boot, f"run {run_id}")
    marked = store.marked_trials(run_id)
    notes += _mark(pairs, marked, marked)
    no_label = [c for c in configs if by not in c["labels"]]
    if no_label:
        notes.append(f"{len(no_label)} configuration(s) have no label {by!r} and were left out")
    info = _run_info(store, run_id)
    return ComparisonReport(
        kind="within", title=f"vnetbench compare {run_id} --by {by} --ref {ref}", a=run_id, b=run_id,
        alpha=alpha, seed=seed, noise_default=noise_default, noise_overrides=noise_overrides, metrics=chosen,
        pairs=pairs, only_b=unpaired, by=by, ref=ref, a_info=info, b_info=info, notes=notes)


def _check_alpha(alpha: float) -> None:
    if not (0 < alpha < 1):
        raise VnetbenchError(f"--alpha {alpha!r}: must lie between 0 and 1 (e.g. 0.05)")


# ---------------------------------------------------------------- baselines


def default_baseline_name(store: Store, run_id: str) -> str:
    """A baseline is named after its scenario unless told otherwise: one per scenario."""
    return store.run(run_id)["scenario_name"]


def set_baseline(store: Store, run_ref: str, name: str | None = None) -> tuple[str, str]:
    run_id = store.resolve_run(run_ref)
    name = name or default_baseline_name(store, run_id)
    if not name.strip():
        raise VnetbenchError("--name: a baseline needs a non-empty name")
    store.set_baseline(name, run_id)
    return name, run_id


def baselines(store: Store) -> list[dict[str, Any]]:
    """Every baseline: name, run, its scenario and status, when it was set."""
    rows = store.conn.execute(
        "SELECT b.name, b.run_id, b.created, r.scenario_name, r.started, r.status FROM baselines b"
        " JOIN runs r ON r.id = b.run_id ORDER BY b.name").fetchall()
    return [{"name": r["name"], "run_id": r["run_id"], "set": _when(r["created"]), "scenario": r["scenario_name"],
             "run_started": _when(r["started"]), "status": r["status"]} for r in rows]


def baseline_for(store: Store, run_id: str, name: str | None) -> str:
    """The baseline's run id: the named one, else the one named after the run's scenario."""
    if name:
        return store.baseline(name)
    default = default_baseline_name(store, run_id)
    try:
        return store.baseline(default)
    except VnetbenchError:
        known = [b["name"] for b in baselines(store)]
        hint = f"; baselines here: {', '.join(known)} (compare RUN --baseline NAME)" if known else ""
        raise VnetbenchError(
            f"no baseline for scenario {default!r} in {store.path}: set one with "
            f"`vnetbench baseline set RUN` (or name one: --baseline NAME){hint}") from None


# ---------------------------------------------------------------- history


@dataclass
class HistoryLine:
    key: str
    labels: dict[str, Any]
    config: str
    points: list[dict[str, Any]]  # {run_id, started, time, status, n, median, ci, cv}
    change_points: list[dict[str, Any]]  # {index, run_id, time, mean_before, mean_after, rel_change, pvalue}

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "labels": self.labels, "config": self.config, "points": self.points,
                "change_points": self.change_points}


@dataclass
class History:
    scenario: str
    metric: str
    unit: str
    direction: str
    where: dict[str, str]
    min_magnitude: float
    window: int
    pvalue: float
    runs: list[dict[str, Any]]  # every run of the scenario considered, oldest first
    lines: list[HistoryLine]
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "metric": self.metric, "unit": self.unit, "direction": self.direction,
                "where": self.where, "change_point_method": {
                    "name": "e-divisive means (Hunter)", "window": self.window, "pvalue": self.pvalue,
                    "min_magnitude": self.min_magnitude},
                "runs": self.runs, "lines": [l.to_dict() for l in self.lines], "notes": self.notes}

    def write_csv(self, f: IO[str]) -> int:
        """``time,<metric columns>``: one row per run, oldest first; returns the rows written.

        The plain layout change-point tools (Hunter/Apache Otava, ...) read
        without being told more: a time column (ISO 8601, UTC), then one numeric
        column per series, and nothing else (such tools take every other column
        for a metric; the run ids are in ``--json``). With one configuration the
        column is the metric's name; with several it is
        ``metric[label=value;...]``. A run without a value for a configuration
        leaves its cell empty.
        """
        columns = [self.metric] if len(self.lines) == 1 else [
            f"{self.metric}[{';'.join(f'{k}={v}' for k, v in l.labels.items())}]" for l in self.lines]
        by_run: dict[str, list[str]] = {}
        for i, line in enumerate(self.lines):
            for p in line.points:
                by_run.setdefault(p["run_id"], [""] * len(self.lines))[i] = repr(float(p["median"]))
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["time", *columns])
        rows = 0
        for run in self.runs:
            if run["id"] in by_run:
                w.writerow([run["time"], *by_run[run["id"]]])
                rows += 1
        return rows

    def csv_text(self) -> str:
        buf = io.StringIO()
        self.write_csv(buf)
        return buf.getvalue()


def history(
    store: Store,
    metric: str,
    *,
    where: dict[str, str] | None = None,
    scenario: str | None = None,
    min_magnitude: float | None = None,
    noise_default: float = DEFAULT_NOISE,
    window: int = HISTORY_WINDOW,
    pvalue: float = HISTORY_PVALUE,
) -> History:
    """A metric's per-run median across the stored runs of one scenario, with change points.

    ``scenario``: the scenario name; by default the only one in the store, or
    the latest run's (a note says so). ``where``: label filters; every
    configuration that passes gets its own line. ``min_magnitude``: the
    smallest change worth reporting, by default the metric's noise threshold.
    """
    where = dict(where or {})
    all_runs = store.runs()
    if not all_runs:
        raise VnetbenchError(f"{store.path} holds no runs yet; start one with `vnetbench run SCENARIO`")
    names = list(dict.fromkeys(r["scenario_name"] for r in all_runs))
    notes: list[str] = []
    if scenario is None:
        scenario = all_runs[-1]["scenario_name"] if len(names) > 1 else names[0]
        if len(names) > 1:
            notes.append(f"scenario {scenario!r} (the latest run's); others stored: "
                         f"{', '.join(n for n in names if n != scenario)} (--scenario NAME)")
    elif scenario not in names:
        raise VnetbenchError(f"--scenario {scenario}: no run of it in {store.path}; scenarios stored: {', '.join(names)}")
    runs = [r for r in all_runs if r["scenario_name"] == scenario]

    recorded: dict[str, tuple[str, str]] = {}
    lines: dict[str, HistoryLine] = {}
    seen_metrics: set[str] = set()
    seen_labels: dict[str, set[str]] = {}
    for run in runs:
        configs = store.configurations(run["id"])
        values = store.values(run["id"])
        for c in configs:
            for k, v in c["labels"].items():
                seen_labels.setdefault(k, set()).add(str(v))
            seen_metrics |= set(values.get(c["key"], {}))
            if not all(k in c["labels"] and label_matches(c["labels"][k], v) for k, v in where.items()):
                continue
            vals = values.get(c["key"], {}).get(metric)
            if vals is None or len(vals) == 0:
                continue
            if metric not in recorded:
                recorded.update(store.metric_meta(run["id"]))
            s = summarize(vals)
            line = lines.setdefault(c["key"], HistoryLine(c["key"], c["labels"], label_text(c["labels"]), [], []))
            line.points.append({"run_id": run["id"], "started": run["started"], "time": _when(run["started"]),
                                "status": run["status"], "n": s.n, "median": s.median,
                                "ci": list(s.ci) if s.ci else None, "cv": s.cv})
    for k in where:
        if k not in seen_labels:
            raise VnetbenchError(f"--where {k}=...: runs of {scenario!r} have no label {k!r}; labels: "
                                 f"{', '.join(sorted(seen_labels)) or '(none)'}")
    if metric not in seen_metrics:
        raise VnetbenchError(f"--metric {metric}: not stored in any run of {scenario!r}; stored metrics: "
                             f"{', '.join(_metric_order(seen_metrics)) or '(none)'}")
    if not lines:
        wanted = ", ".join(f"{k}={v}" for k, v in where.items())
        values_txt = "; ".join(f"{k}: {', '.join(sorted(seen_labels[k]))}" for k in where)
        raise VnetbenchError(f"no configuration of {scenario!r} with {wanted} has {metric}; label values: {values_txt}")

    unit, direction = metric_unit_direction(metric, recorded)
    magnitude = noise_for(metric, None, noise_default) if min_magnitude is None else min_magnitude
    for line in lines.values():
        medians = [p["median"] for p in line.points]
        for cp in detect_change_points(medians, window=window, pvalue=pvalue, min_magnitude=magnitude):
            p = line.points[cp.index]
            line.change_points.append({"index": cp.index, "run_id": p["run_id"], "time": p["time"],
                                       "mean_before": cp.mean_before, "mean_after": cp.mean_after,
                                       "rel_change": cp.rel_change, "pvalue": cp.pvalue})
    shortest = min(len(l.points) for l in lines.values())
    if shortest < 6:
        notes.append(f"change points need at least 6 runs per configuration (E-divisive keeps 3 on each side); "
                     f"{'some lines have' if len(lines) > 1 else 'this line has'} {shortest}")
    run_list = [{"id": r["id"], "started": r["started"], "time": _when(r["started"]), "status": r["status"]}
                for r in runs]
    return History(scenario=scenario, metric=metric, unit=unit, direction=direction, where=where,
                   min_magnitude=magnitude, window=window, pvalue=pvalue, runs=run_list,
                   lines=list(lines.values()), notes=notes)


__all__ = [
    "DEFAULT_METRICS",
    "PairResult",
    "ComparisonReport",
    "History",
    "HistoryLine",
    "compare_runs",
    "compare_within",
    "history",
    "set_baseline",
    "baselines",
    "baseline_for",
    "parse_fraction",
    "parse_noise_overrides",
    "parse_where",
    "label_matches",
    "noise_for",
]
