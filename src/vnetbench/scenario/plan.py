"""From a scenario to configurations and an ordered list of trials.

A configuration is one point of the matrix: the scenario with the matrix
values applied, validated again (a buffer can be fine at one bottleneck and too
small at another). Its key is a hash of its labels (the matrix values), so the
same point matches across runs even when a fixed parameter such as the
bottleneck changed between them: that change is what a comparison measures.
"""

from __future__ import annotations

import ast
import hashlib
import itertools
import json
import math
import operator
import random
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from vnetbench.errors import ScenarioError
from vnetbench.scenario import MAX_CONFIGURATIONS
from vnetbench.scenario.load import LoadedScenario, format_validation_error
from vnetbench.impair.model import SCHEDULE_MARGIN_S, LinkSpec, base_rtt, lab_links
from vnetbench.lab import environments
from vnetbench.scenario.model import KubeSpec, LabSpec, Scenario, StreamWorkload
from vnetbench.metrics import qualified
from vnetbench.topology.fairness import max_min_shares
from vnetbench.topology.spec import TopologySpec
from vnetbench.workloads import registry
from vnetbench import units


@dataclass(frozen=True)
class Configuration:
    key: str
    labels: dict[str, Any]
    scenario: Scenario  # the scenario with this configuration's matrix values applied
    active_senders: int
    offered_bps: float | None  # per sender; None = unlimited
    expected: dict[str, float] = field(default_factory=dict)  # theory, for reports and tests
    # Per sender, of each iperf3 workload besides the scenario's first (whose is offered_bps): a cross flow's
    # own `offered`, with `senders` its own clients. None = unlimited.
    offered_by: dict[str, float | None] = field(default_factory=dict)
    # From a matrix entry marked `if_available = true`: run where this machine can build its environment,
    # otherwise left out of the run, which says so (runner.places.lab.leave_out_unavailable).
    if_available: bool = False

    @property
    def label_text(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.labels.items()) or "(single configuration)"

    @property
    def stream(self) -> StreamWorkload | None:
        """The iperf3 workload, or None in a scenario without one."""
        found = self.scenario.stream
        return found[1] if found else None

    def params(self) -> dict[str, Any]:
        """Every parameter as run, for the store: resolved, in base units."""
        lab = self.scenario.lab
        stream = self.stream
        params: dict[str, Any] = {
            "topology": lab.topology,
            "bottleneck_bps": lab.bottleneck,
            "buffer_bytes": lab.buffer.in_bytes(lab.bottleneck) if lab.bottleneck else None,
            "qdisc": lab.qdisc,
            "shape": lab.shape,
            "ip_version": lab.ip_version,
            "mtu": lab.mtu,
            "pin_cpus": lab.pin_cpus,
            "senders": self.active_senders,
        }
        if stream is not None:  # the stream's parameters flat, as stored since the first version
            params.update({
                "proto": stream.proto,
                "ratio": stream.ratio,
                "offered_bps_per_sender": self.offered_bps,
                "duration_s": stream.duration,
                "omit_s": stream.omit,
                "congestion_control": stream.congestion_control,
                "length": stream.length,
                "parallel": stream.parallel,
                "reverse": stream.reverse,
            })
        params.update({
            "env": lab.env,
            "offload": lab.offload,
            **{k: getattr(lab, k) for k in LabSpec.ENV_OPTIONS if getattr(lab, k) is not None},
            # link conditions as requested, beyond the bottleneck's rate and buffer above (the backend and
            # the settings as applied are in lab_state); only when there are any, like the window
            **({"links": links} if (links := _link_requests(lab)) else {}),
            **({"window_bytes": stream.window} if stream is not None and stream.window else {}),
        })
        others = {name: w.model_dump(mode="json", exclude_defaults=False) for name, w in self.scenario.active.items()
                  if not isinstance(w, StreamWorkload)}
        if others:
            params["workloads"] = others
        return params


def _link_requests(lab: LabSpec) -> dict[str, Any]:
    out = {}
    for name, spec in lab_links(lab).items():
        if spec.needs() - {"rate", "buffer"} or name != "bottleneck" or spec.backend != "auto":
            out[name] = spec.request()
    return out


@dataclass(frozen=True)
class TrialSlot:
    config: Configuration
    repetition: int
    position: int
    warmup: bool = False


def config_key(labels: dict[str, Any]) -> str:
    canonical = json.dumps(labels, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def thesis_senders(ratio: float | None) -> int:
    """Seed 001, algorithms 1 and 2: 2 senders up to ratio 2, 3 up to 3, 4 above."""
    if ratio is None or ratio <= 2:
        return 2
    return 3 if ratio <= 3 else 4


# ----------------------------------------------------- offered-load expressions

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def evaluate_offered(expr: str, variables: dict[str, float]) -> float | None:
    """Per-sender target rate in bit/s from `offered`: a rate, 'unlimited' or arithmetic.

    Arithmetic uses + - * / and parentheses over numbers, rates ("50Mbit") and
    the variables (ratio, bottleneck, senders). Written by hand because it is
    twenty lines and a general expression library would also evaluate much more
    than we want users to put in a scenario file.
    """
    text = expr.strip()
    if text == "unlimited":
        return None
    try:
        value = units.parse_rate(text)
    except units.UnitError:
        pass
    else:
        if value <= 0:  # iperf3 would read 0 as "as fast as it can": say 'unlimited' for that
            raise ValueError(f"offered = {units.brief(expr)}: a rate must be more than 0; for no limit write 'unlimited'")
        return value

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return float(node.value)
        if isinstance(node, ast.Name):
            if node.id not in variables or variables[node.id] is None:
                raise ValueError(f"unknown name {units.brief(node.id)} (known: {', '.join(k for k, v in variables.items() if v is not None)})")
            return float(variables[node.id])
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        raise ValueError("only numbers, names and + - * / ( ) are allowed")

    try:
        value = ev(ast.parse(text, mode="eval"))
    except (SyntaxError, ValueError, ZeroDivisionError) as e:
        raise ValueError(f"offered = {units.brief(expr)}: {e}; write a rate ('50Mbit'), 'unlimited', or e.g. 'ratio * bottleneck / senders'") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"offered = {units.brief(expr)} gives {value:g} bit/s: it must be a finite rate above 0 "
                         "(for no limit write 'unlimited')")
    return value


# ------------------------------------------------------------------ matrix


#: The key of a matrix entry that is not a parameter: `{env = "docker", if_available = true}`.
IF_AVAILABLE = "if_available"


def _axis_targets(scenario: Scenario, axis: str) -> list[tuple[str, ...]]:
    """Where a matrix axis (or a key of an axis' inline table) puts its value: a lab field, or the
    option of that name in every workload that has it (``proto`` sweeps the stream's and the RR
    test's together), or one workload's option by its path (``workload.rr.payload``)."""
    if (key := axis.removeprefix("lab.")) in LabSpec.RUN_WIDE:
        raise ValueError(f"matrix.{axis} is not a parameter that can differ between configurations: {key} holds "
                         f"for the whole run (its lab is built and held with it); set lab.{key} once, and run the "
                         "scenario once per value")
    if axis in LabSpec.model_fields:
        return [("lab", axis)]
    if axis.startswith("topology.") and axis.split(".", 1)[1] in TopologySpec.model_fields:
        return [("topology", axis.split(".", 1)[1])]
    if axis == "workloads":  # which workloads a configuration runs
        return [("workloads",)]
    if axis.startswith("kube.") and axis.split(".", 1)[1] in KubeSpec.model_fields:
        if scenario.kube is None:
            raise ValueError(f"matrix.{axis} sweeps a key of the [kube] table, which this scenario does not have: "
                             "add one (receiver = \"NODE\", ...)")
        return [("kube", axis.split(".", 1)[1])]
    parts = axis.split(".")
    if parts[0] == "link":  # a link's own key: link.NAME.DIRECTION.KEY, short for lab.link.NAME.DIRECTION.KEY
        parts = ["lab", *parts]
    if parts[0] == "lab" and len(parts) > 1 and parts[1] in LabSpec.model_fields:
        if parts[1] == "link":
            if len(parts) < 4 or parts[3] not in LinkSpec.model_fields and parts[3] != "both":
                raise ValueError(f"matrix.{axis}: a link's key path is link.NAME.KEY, KEY one of "
                                 f"{', '.join(sorted([*LinkSpec.model_fields, 'both']))} "
                                 "(e.g. link.bottleneck.forward.delay)")
            if parts[3] == "both":  # merged under each direction when a file is read: here, set each
                return [(*parts[:3], direction, *parts[4:]) for direction in ("forward", "reverse")]
            return [tuple(parts)]
        if len(parts) == 2:
            return [tuple(parts)]
    if len(parts) == 3 and parts[0] == "workload" and parts[1] in scenario.workload:
        if parts[2] in type(scenario.workload[parts[1]]).model_fields and parts[2] not in ("tool", "during"):
            return [tuple(parts)]
    found = [("workload", name, axis) for name, w in scenario.workload.items()
             if axis in type(w).model_fields and axis not in ("tool", "during")]
    if found:
        return found
    sweepable = sorted(set(LabSpec.model_fields) | {f for w in scenario.workload.values()
                                                     for f in type(w).model_fields} - {"tool", "during"})
    raise ValueError(f"matrix.{axis} is not a parameter that can be swept; sweepable: {', '.join(sweepable)} "
                     "(or workload.NAME.OPTION for one workload's, link.NAME.DIRECTION.KEY for one link's, "
                     "topology.KEY, kube.KEY)")


def _axis_entries(scenario: Scenario, axis: str, values: list[Any]) -> list[dict[str, Any]]:
    """The values of one matrix axis as parameter settings.

    A plain value sets the parameter the axis is named after. An inline table
    sets several parameters together, so variants that only make sense as a
    whole (``{env="vm", nic="e1000"}``) need no cross product; its keys are
    parameters, and every one of them becomes a label. The one key that is not
    a parameter, ``if_available = true``, stays in the entry for `expand`:
    its configurations run only where the machine can build their environment.
    """
    entries = []
    for value in values:
        if isinstance(value, dict):
            if not value or set(value) == {IF_AVAILABLE}:
                raise ValueError(f"matrix.{axis} has a table without parameters: give at least one in it")
            if not isinstance(value.get(IF_AVAILABLE, False), bool):
                raise ValueError(f"matrix.{axis}: {IF_AVAILABLE} = {units.brief(value[IF_AVAILABLE])} must be true or false "
                                 "(true: run these configurations where this machine can, leave them out elsewhere)")
            entries.append(dict(value))
            continue
        try:
            _axis_targets(scenario, axis)
        except ValueError:
            if any(isinstance(v, dict) for v in values):
                raise ValueError(f"matrix.{axis} = {units.brief(value)}: {axis} is not a parameter, so each value of this "
                                 f"axis must be an inline table of parameters, e.g. {{env = \"bare\"}}") from None
            raise
        entries.append({axis: value})
    for entry in entries:
        for key in entry.keys() - {IF_AVAILABLE}:
            try:
                _axis_targets(scenario, key)
            except ValueError as e:
                raise ValueError(str(e).replace(f"matrix.{key} is not", f"matrix.{axis}: key {units.brief(key)} in a table is "
                                                                        "not", 1)) from None
    return entries


def matrix_size(scenario: Scenario) -> int:
    """How many configurations the matrix makes (the product of its axes' lengths, times the cases), without
    making them."""
    return math.prod(len(values) for values in scenario.matrix.values()) * max(1, len(scenario.case))


#: The label of a named case's configurations: ``case = NAME`` (a [[case]] table's keys are not labels).
CASE = "case"
CASES_AXIS = "[[case]]"  # the axis the cases make: no matrix axis can have this name (it is no name)


def expand(loaded: LoadedScenario, max_configurations: int = MAX_CONFIGURATIONS) -> list[Configuration]:
    """Every combination of the matrix, in the order the axes are written."""
    scenario = loaded.scenario
    size = matrix_size(scenario)
    if size > max_configurations:
        axes = " x ".join(f"{len(v)} {axis}" for axis, v in scenario.matrix.items())
        raise ScenarioError(f"{loaded.source}: the matrix makes {size:,} configurations ({axes}), more than the "
                            f"limit of {max_configurations:,}: shrink an axis, or raise the limit with "
                            f"--max-configurations {size}")
    base = scenario.model_dump(mode="python", exclude={"matrix"})
    base["lab"]["buffer"] = scenario.lab.buffer.model_dump()
    base.pop("case", None)
    # Each axis: its entries, each (the parameters it sets, its labels). A matrix entry is labelled by what it
    # sets; a case by its name.
    axes: list[tuple[str, list[tuple[dict[str, Any], dict[str, Any]]]]] = []
    owner: dict[str, str] = {}  # parameter -> the axis that sets it
    try:
        if scenario.case and CASE in scenario.matrix:
            raise ValueError(f"[[case]] tables and matrix.{CASE} both label configurations {CASE!r}: rename the "
                             "matrix axis, or write its entries as cases")
        swept = [(axis, _axis_entries(scenario, axis, values)) for axis, values in scenario.matrix.items()]
        if scenario.case:
            cases = [{k: v for k, v in c.items() if k != "name"} for c in scenario.case]
            swept.append((CASES_AXIS, cases))
        for axis, entries in swept:
            for key in {k for e in entries for k in e} - {IF_AVAILABLE}:
                if key in owner and owner[key] != axis:
                    raise ValueError(f"{_axis_name(axis)} and {_axis_name(owner[key])} both set {key}: "
                                     "set each parameter in one place only")
                owner[key] = axis
                if axis == CASES_AXIS:
                    try:
                        _axis_targets(scenario, key)
                    except ValueError as e:
                        raise ValueError(str(e).replace(f"matrix.{key} is not", f"[[case]] key {key!r} is not", 1)
                                         ) from None
            labelled = [(e, {CASE: c["name"]}) for e, c in zip(entries, scenario.case)] if axis == CASES_AXIS else \
                [(e, {k: v for k, v in e.items() if k != IF_AVAILABLE}) for e in entries]
            axes.append((axis, labelled))
        targets = {key: _axis_targets(scenario, key) for key in owner}
    except ValueError as e:
        raise ScenarioError(f"{loaded.source}: {e}") from None
    configs = []
    for chosen in itertools.product(*(entries for _, entries in axes)) if axes else [()]:
        labels = {key: value for _, label in chosen for key, value in label.items()}
        settings = {key: value for entry, _ in chosen for key, value in entry.items() if key != IF_AVAILABLE}
        if_available = any(entry.get(IF_AVAILABLE) for entry, _ in chosen)
        raw = json.loads(json.dumps(base, default=str))  # a deep copy that pydantic re-parses
        raw["lab"]["buffer"] = scenario.lab.buffer.model_dump()
        for axis, value in settings.items():
            for target in targets[axis]:
                node = raw
                *parents, leaf = target
                for part in parents:  # a key path may lead where the file set nothing (a link of its own)
                    if not isinstance(node.get(part), dict):
                        node[part] = {}
                    node = node[part]
                node[leaf] = value
        try:
            effective = Scenario.model_validate(raw)
        except ValidationError as e:
            raise ScenarioError(format_validation_error(e, raw, f"{loaded.source} [configuration "
                                                                f"{_where(labels)}]")) from None
        configs.append(_configuration(loaded.source, labels, effective, if_available))
    return configs


def _axis_name(axis: str) -> str:
    return "a [[case]]" if axis == CASES_AXIS else f"matrix.{axis}"


def _where(labels: dict[str, Any]) -> str:
    """A configuration's labels for a message, each value shortened."""
    return ", ".join(f"{k}={v if len(str(v)) <= 60 else units.brief(v)}" for k, v in labels.items())


def _configuration(source: str, labels: dict[str, Any], scenario: Scenario, if_available: bool = False
                   ) -> Configuration:
    lab = scenario.lab
    where = _where(labels)
    problems = [f"workload.{name} ({w.tool}): {p}" for name, w in scenario.active.items()
                for p in registry.of(w).problems(w, lab)]
    environment = environments.kind(lab.env)
    problems += [f"workload.{name} ({w.tool}): {p}" for name, w in scenario.active.items()
                 if (p := environment.memory_problem(lab, registry.of(w).memory_bytes(w)))]
    problems += schedule_problems(scenario)
    if problems:
        raise ScenarioError(f"{source}{f' [configuration {where}]' if where else ''}: " + "; ".join(problems))
    found = scenario.stream
    stream = found[1] if found else None
    ratio = stream.ratio if stream else None
    pairs: dict[str, tuple[list[str], str]] = {}
    if scenario.topology is not None:  # the declared topology's clients
        pairs = _workload_endpoints(source, where, scenario)
        senders = len(scenario.topology.endpoints(scenario.topology.graph(lab.mtu))[0])
    elif lab.senders != "auto":
        senders = lab.senders
    else:
        # Seed 001's rule for over-subscription; one sender for workloads that need no more.
        senders = thesis_senders(ratio) if stream else 1
    expected: dict[str, float] = {}
    offered = None
    if stream is not None:
        variables = {"ratio": ratio, "bottleneck": lab.bottleneck, "senders": float(senders)}
        try:
            offered = evaluate_offered(stream.offered, variables)
        except ValueError as e:
            raise ScenarioError(f"{source}: workload: {e}") from None
    _one_client_at_a_time(f"{source}{f' [configuration {where}]' if where else ''}", scenario, pairs)
    offered_by: dict[str, float | None] = {}
    for name, w in scenario.active.items():
        if isinstance(w, StreamWorkload) and w is not stream:
            own = len(pairs[name][0]) if name in pairs else senders
            try:
                offered_by[name] = evaluate_offered(w.offered, {"ratio": w.ratio, "bottleneck": lab.bottleneck,
                                                                "senders": float(own)})
            except ValueError as e:
                raise ScenarioError(f"{source}: workload.{name}: {e}") from None
    if offered is not None:
        total = offered * senders * stream.parallel
        expected["throughput.offered_mbps"] = total / 1e6
        if lab.bottleneck is not None:
            load = total / lab.bottleneck
            expected["throughput.rx_mbps"] = min(total, lab.bottleneck) / 1e6
            if stream.proto == "udp":
                # Seed 001, equation 4.3: loss above saturation is 1 - 1/ratio.
                expected["udp.loss_ratio"] = max(0.0, 1.0 - 1.0 / load)
    if lab.bottleneck is not None:
        # A full drop-tail buffer in front of the bottleneck delays every packet by buffer / rate.
        full = expected["queue.full_delay_ms"] = lab.buffer.in_bytes(lab.bottleneck) * 8 / lab.bottleneck * 1e3
        if offered is not None and stream.proto == "udp" and scenario.probes:
            # Unresponsive UDP above the rate keeps that buffer full, below it leaves it (nearly) empty: the
            # probe's median RTT is the links' fixed delay plus one or the other. TCP's standing queue
            # depends on its congestion control: no closed form.
            expected["rtt.p50_ms"] = base_rtt(lab) * 1e3 + (full if load > 1 else 0.0)
    if pairs:
        expected.update(_fair_shares(scenario, pairs, offered, offered_by))
    return Configuration(
        key=config_key(labels), labels=labels, scenario=scenario,
        active_senders=senders, offered_bps=offered, expected=expected, if_available=if_available,
        offered_by=offered_by,
    )


def _workload_endpoints(source: str, where: str, scenario: Scenario) -> dict[str, tuple[list[str], str]]:
    """Each active workload's (clients, server) on the declared topology: its own, else the topology's. Raises
    ScenarioError when they are not hosts of it."""
    topology = scenario.topology
    assert topology is not None
    graph = topology.graph(scenario.lab.mtu)
    at = f"{source}{f' [configuration {where}]' if where else ''}"
    out = {}
    for name, w in scenario.active.items():
        try:
            out[name] = topology.endpoints(graph, clients=w.clients, server=w.server,
                                           where=f"workload.{name}" if w.own_endpoints else "topology")
        except ScenarioError as e:
            raise ScenarioError(f"{at}: {e}") from None
    return out


def _fair_shares(scenario: Scenario, pairs: dict[str, tuple[list[str], str]], offered: float | None,
                 offered_by: dict[str, float | None]) -> dict[str, float]:
    """On a declared topology, each stream workload's received throughput in theory (Mbit/s): the sum of its
    flows' max-min fair shares of the links' rates (topology/fairness.py), each flow asking for its offered
    rate. Of a schedule's or a trace's changing rate there is no one number: none then."""
    streams = {n: w for n, w in scenario.active.items() if isinstance(w, StreamWorkload)}
    links = {name: spec for name, spec in lab_links(scenario.lab).items()
             if name in (scenario.lab.link or {}) or name == "bottleneck"}
    if not streams or not any(c.rate for spec in links.values() for c in (spec.forward, spec.reverse)) \
            or any(spec.schedule is not None for spec in links.values()):
        return {}
    graph = scenario.topology.graph(scenario.lab.mtu)  # type: ignore[union-attr]
    plan = graph.plan()
    capacity = {(name, forward): rate for name, spec in links.items() for forward in (True, False)
                if (rate := spec.direction("forward" if forward else "reverse").rate)}
    demands: dict[tuple[str, str, int], float] = {}
    paths: dict[tuple[str, str, int], list[tuple[str, bool]]] = {}
    for name, w in streams.items():
        clients, server = pairs[name]
        rate = offered_by.get(name, offered)
        for client in clients:
            src, dst = (server, client) if w.reverse else (client, server)
            route = graph.path(plan, src, dst, scenario.lab.ip_version)
            for k in range(w.parallel):
                demands[(name, client, k)] = rate / w.parallel if rate else math.inf
                paths[(name, client, k)] = route
    shares = max_min_shares(demands, paths, capacity)
    out = {}
    for name in streams:
        got = [v for (n, _, _), v in shares.items() if n == name]
        if all(v is not None for v in got):
            key = qualified("throughput.rx_mbps", name) if scenario.qualifies(name) else "throughput.rx_mbps"
            out[key] = sum(got) / 1e6  # type: ignore[arg-type]
    return out


def _one_client_at_a_time(at: str, scenario: Scenario, pairs: dict[str, tuple[list[str], str]]) -> None:
    """Raises ScenarioError when two workloads of a tool whose server serves one client at a time (iperf3) run
    at once between the same client and server. `pairs`: each workload's (clients, server) on a declared
    topology; without one, every workload runs from the dumbbell's senders to its receiver."""
    for lead, companions in scenario.phases():
        seen: dict[tuple[str, str, str], str] = {}
        for name in (lead, *companions):
            w = scenario.active[name]
            if not registry.of(w).one_client_at_a_time:
                continue
            clients, server = pairs.get(name, (["the senders"], "the receiver"))
            for client in clients:
                other = seen.setdefault((w.tool, client, server), name)
                if other != name:
                    raise ScenarioError(
                        f"{at}: workload.{other} and workload.{name} both run {w.tool} from {client} to {server} at "
                        f"once, and a {w.tool} server serves one client at a time: give one of them other clients "
                        "or another server (or one workload with parallel = 2)")


def trial_seconds(scenario: Scenario) -> float:
    """How long a trial's workloads run, phase after phase, warm-up included: the span its link schedules are
    unrolled over (the runner's own sum, runner/bench.py)."""
    return sum(sum(registry.of(scenario.workload[lead]).timing(scenario.workload[lead], None))
               for lead, _ in scenario.phases())


def schedule_problems(scenario: Scenario) -> list[str]:
    """Link schedules that would unroll into more steps than a trial may start with (limits.SCHEDULE_STEPS)."""
    lab = scenario.lab
    until = trial_seconds(scenario) + SCHEDULE_MARGIN_S
    out = []
    for name, spec in lab_links(lab).items():
        why = spec.schedule.too_long(until) if spec.schedule is not None else None
        if why:
            explicit = (lab.link.get(name) or LinkSpec()).schedule is not None
            out.append(f"{f'lab.link.{name}.schedule' if explicit else 'lab.bottleneck_schedule'}: {why}")
    return out


def order_trials(configs: list[Configuration], repetitions: int, order: str, seed: int, warmup: bool) -> list[TrialSlot]:
    """Randomised, interleaved order: each round runs every configuration once in a
    fresh random order (seeded), so slow drift of the machine spreads evenly over
    configurations instead of piling onto whichever ran last.
    """
    rng = random.Random(seed)
    slots: list[TrialSlot] = []
    if warmup and configs:
        slots.append(TrialSlot(config=configs[0], repetition=-1, position=-1, warmup=True))
    if order == "sequential":
        sequence = [(c, r) for c in configs for r in range(repetitions)]
    else:
        sequence = []
        for r in range(repetitions):
            round_ = list(configs)
            rng.shuffle(round_)
            sequence.extend((c, r) for c in round_)
    slots.extend(TrialSlot(config=c, repetition=r, position=i) for i, (c, r) in enumerate(sequence))
    return slots
