"""Executing a plan: checks first, then the lab, the trials in their order, and
teardown on every way out.

Order of business, so that bad input never leaves half a lab behind:
1. everything that can be checked without building is checked (scenario
   validated and expanded, root, tools, congestion control);
2. the run is stored with its fingerprint and configurations;
3. the lab is built, trials run (each committed as it ends): ``repetitions``
   per configuration, or with ``repeat.target_ci`` adaptively, in interleaved
   rounds until each configuration's key metrics are precise enough or
   ``max`` is reached; the reason a configuration stopped is stored with it;
4. the lab is torn down in ``finally``, under a signal shield.
"""

from __future__ import annotations

import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from vnetbench.console import SafeConsole
from vnetbench.errors import PathNotAsDeclared, PlaceGone, ScenarioError, StoreError
from vnetbench.lab.netns import run_prefix
from vnetbench.lab.teardown import interruptible, interruption_behind
from vnetbench.runlock import RunLock
from vnetbench.runner import fingerprint
from vnetbench.runner.bench import DumbbellBench, TrialOutcome
from vnetbench.runner.machine_load import LoadMonitor
from vnetbench.runner.places import Place
from vnetbench.runner.places.lab import LabPlace, check_root, workload_tools
from vnetbench.runner.preview import topology_record
from vnetbench.scenario import MAX_CONFIGURATIONS
from vnetbench.scenario.load import LoadedScenario, load_text
from vnetbench.scenario.model import RepeatSpec
from vnetbench.scenario.plan import Configuration, TrialSlot, expand, order_trials
from vnetbench.stats import adaptive_decision
from vnetbench.store.db import Store, TrialRecord
from vnetbench.tools import IP, TASKSET
from vnetbench.workloads.base import Measurement

__all__ = ["RunSummary", "check_root", "execute", "new_run_id", "resume"]


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


@dataclass
class RunSummary:
    run_id: str
    status: str
    trials_ok: int
    trials_failed: int
    failures: list[str]


def execute(loaded: LoadedScenario, store: Store, *, resume_run_id: str | None = None,
            console: Console | None = None, progress: bool = True,
            on_trial: Callable[[TrialSlot, str], None] | None = None,
            max_configurations: int = MAX_CONFIGURATIONS, allow_concurrent: bool = False,
            place: Place | None = None, calibrate: bool = True) -> RunSummary:
    """Run (or, with `resume_run_id`, finish) a scenario at `place` (default: the local lab); see the module
    docstring for the order of business. Nothing here depends on which place it is (runner/places).
    `calibrate`: measure the place's machine the same way before the lab is built and after it is gone
    (runner/calibration.py), stored in the fingerprint's "calibration", a session a resumed run."""
    console = console or SafeConsole(stderr=True)
    place = place or LabPlace()
    configs = expand(loaded, max_configurations)
    configs, left_out = place.prepare(loaded, configs)
    rep = loaded.scenario.repeat

    run_id = resume_run_id or new_run_id()
    # Before anything is stored or built: one run measures on this machine at a time (runlock.py).
    lock = RunLock(run_id, scenario=loaded.scenario.name, db=str(store.path)).acquire(allow_concurrent)
    try:
        place.hold(run_id, loaded.scenario.name)  # and at the place: one run measures there at a time
        if resume_run_id:
            store.reopen_run(run_id)
            fp = store.run(run_id)["fingerprint"]
            place.check_resume(fp, run_id)
            if allow_concurrent:
                fp["allow_concurrent"] = True
            if allow_concurrent or fp.get("left_out", []) != left_out:  # as this session finds the machine
                fp["left_out"] = left_out
            fp.update(place.facts())  # as this session found the place
            store.update_fingerprint(run_id, fp)
        else:
            fp = fingerprint.collect([t for t in workload_tools(configs) if t not in (TASKSET, IP)])
            if allow_concurrent:
                fp["allow_concurrent"] = True  # stored from the start: a killed run keeps it too
            if left_out:
                fp["left_out"] = left_out
            if loaded.scale_note:
                fp["scale"] = loaded.scale_note
            drawn = topology_record(configs)
            if drawn is not None:  # a declared topology: what `show` and the report draw
                fp["topology"] = drawn
            fp.update(place.facts())
            store.create_run(run_id, loaded.scenario.name, loaded.source, loaded.text, loaded.text_hash,
                             list(loaded.overrides), rep.seed, fp)
        for c in configs:
            store.add_configuration(run_id, c.key, c.labels, c.params(), c.expected)
    except BaseException:
        place.release()
        lock.release()
        raise
    if left_out:
        console.print(f"[yellow]{escape(fingerprint.left_out_note({'left_out': left_out}) or '')}[/]")
    if loaded.scale_note and not resume_run_id:
        console.print(escape(loaded.scale_note), highlight=False, soft_wrap=True)
    if lock.others:
        console.print("[yellow]sharing the machine with " + escape("; ".join(o.describe() for o in lock.others))
                      + " (--allow-concurrent): both runs' numbers are compromised[/]")

    try:  # a bench or monitor that cannot be made ends the run as every other error does: lock and place let go
        bench = place.bench(run_prefix(run_id), configs)
        bench.keep_dir = store.path.parent / "vnetbench-logs" / run_id  # next to the results it explains
        monitor = LoadMonitor(netns_prefix=run_prefix(run_id), run_id=run_id).start()
    except BaseException as e:  # a stop too: the signal's handler raises wherever the main thread is
        _store_end(store, run_id, *_ending(e, run_id, place), fp, console)
        place.release()
        lock.release()
        raise
    tally = _Tally()
    status, reason = "completed", None
    try:
        with interruptible():
            session = place.calibrate(run_prefix(run_id)) if calibrate else None
            if session is not None:
                fp["calibration"] = [*fp.get("calibration", []), {"before": session}]
            bench.setup()
            fp["endpoints"] = bench.endpoints()  # as this session built them (a resumed run's are new ones)
            fp.update(place.facts())  # and the place as building found it (a cluster's devices and MTUs)
            store.update_fingerprint(run_id, fp)
            with _progress(console, progress) as bar:
                trial = _TrialRunner(bench, store, run_id, console, bar, tally, on_trial)
                if rep.adaptive:
                    _run_adaptive(configs, rep, store, run_id, trial, bar, resumed=bool(resume_run_id))
                else:
                    _run_fixed(configs, rep, store, run_id, trial, bar, resumed=bool(resume_run_id))
    except PlaceGone as e:
        status, reason = "interrupted", (f"{e}; when it answers again, finish the run with `vnetbench run --resume "
                                         f"{run_id}{place.resume_args()}`")
        raise type(e)(reason) from None
    except BaseException as e:
        status, reason = _ending(e, run_id, place)
        raise
    finally:
        errors = bench.teardown()
        if errors:
            console.print("[red]teardown problems:[/] "
                          + escape("; ".join(errors) + f" (run `{place.clean_command()}`)"))
        if status == "completed" and fp.get("calibration") and "after" not in fp["calibration"][-1]:
            try:
                with interruptible():  # after the lab: its emulators no longer spin a core
                    fp["calibration"][-1]["after"] = place.calibrate(run_prefix(run_id))
            except BaseException as e:  # a stop meanwhile ends the calibration only: the results are complete
                fp["calibration"][-1]["after"] = {"error": f"{type(e).__name__}: {e}"[:300]}
        fp["machine_load"] = [*fp.get("machine_load", []), monitor.stop()]  # one entry per session (resumes)
        fp["cpu_wake_latency"] = bench.cpu_wake_latency
        if bench.cpu_wake_up is not None:
            fp["cpu_wake_up"] = bench.cpu_wake_up
        _store_end(store, run_id, status, reason, fp, console)
        place.release()
        lock.release()
    return RunSummary(run_id, status, tally.ok, tally.failed, tally.failures)


def _ending(e: BaseException, run_id: str, place: Place) -> tuple[str, str]:
    """The status and reason of a run that `e` ended: interrupted when it is a stop (the stop itself, or as C
    code handed it back, an ImportError), which --resume finishes; failed otherwise."""
    stop = interruption_behind(e)
    if stop is not None:
        return "interrupted", f"stopped by {stop.signame}; finish it with `vnetbench run --resume {run_id}" \
                              f"{place.resume_args()}`"
    return "failed", f"{type(e).__name__}: {e}"


def _store_end(store: Store, run_id: str, status: str, reason: str | None, fp: dict, console: Console) -> None:
    """The run's end and what the machine did meanwhile. A store that cannot take them (disk full) is said, and
    raised only when the run ended well: otherwise the error that ended it is the one the user must see."""
    try:
        store.update_fingerprint(run_id, fp)
        store.finish_run(run_id, status, reason)
    except StoreError as e:
        if status == "completed":
            raise
        console.print(f"[red]{escape(str(e))}[/]")


@dataclass
class _Tally:
    ok: int = 0
    failed: int = 0
    failures: list[str] = field(default_factory=list)


class _TrialRunner:
    """Runs one slot on the bench and stores it: the part fixed and adaptive repetition share."""

    def __init__(self, bench: DumbbellBench, store: Store, run_id: str, console: Console, bar, tally: _Tally,
                 on_trial: Callable[[TrialSlot, str], None] | None):
        self.bench, self.store, self.run_id, self.console = bench, store, run_id, console
        self.bar, self.task, self.tally, self.on_trial = bar, None, tally, on_trial
        self.done = 0  # trials stored by this process

    def __call__(self, slot: TrialSlot, note: str = "") -> str | None:
        label = ("warm-up: " if slot.warmup else note) + slot.config.label_text
        self.bar.update(self.task, description=escape(label))  # the bar's column reads markup
        unavailable = self.bench.unavailable(slot.config)
        if unavailable is not None:
            # Its environment never came up (a guest that did not boot): the trial fails, with the evidence.
            if slot.warmup:
                return None
            now = time.time()
            reason, raw = unavailable
            outcome = TrialOutcome(status="failed", reason=reason, started=now, ended=now,
                                   measurement=Measurement(), raw=raw)
        else:
            try:
                state = self.bench.prepare(slot.config)
            except PathNotAsDeclared as e:
                # Not the network it declares: nothing it would measure may enter the statistics.
                if slot.warmup:
                    return None
                now = time.time()
                outcome = TrialOutcome(status="failed", reason=str(e), started=now, ended=now,
                                       measurement=Measurement(), raw={"path_check": e.problems})
                state = None
            else:
                outcome = self.bench.run_trial(slot.config, f"p{slot.position}-r{slot.repetition}")
            if slot.warmup:
                return None  # not stored: it only brings caches, ARP and TCP metrics to a steady state
            if state is not None:
                self.store.set_lab_state(self.run_id, slot.config.key,
                                         {"qdiscs": state, **self.bench.environment_state(slot.config),
                                          **self.bench.link_state(slot.config)})
        self.store.record_trial(self.run_id, TrialRecord(
            config_key=slot.config.key, repetition=slot.repetition, position=slot.position,
            started=outcome.started, ended=outcome.ended, status=outcome.status, reason=outcome.reason,
            raw=outcome.raw, samples=outcome.measurement.samples, series=outcome.measurement.series))
        if outcome.status == "ok":
            self.tally.ok += 1
        else:
            self.tally.failed += 1
            self.tally.failures.append(f"{slot.config.label_text} #{slot.repetition}: {outcome.status}: {outcome.reason}")
            self.console.print(f"[yellow]trial {escape(slot.config.label_text)} #{slot.repetition} "
                               f"{outcome.status}:[/] {escape(str(outcome.reason))}")
        if self.on_trial:
            self.on_trial(slot, outcome.status)
        self.done += 1
        self.bar.advance(self.task)
        self.bench.after_trial(outcome)  # part of the place dropped out: wait for it, or stop (PlaceGone)
        return outcome.status


def _run_fixed(configs: list[Configuration], rep: RepeatSpec, store: Store, run_id: str, trial: _TrialRunner,
               bar, *, resumed: bool) -> None:
    """``repetitions`` trials per configuration, in the planned (seeded, interleaved) order."""
    slots = order_trials(configs, rep.repetitions, rep.order, rep.seed, rep.warmup)
    if resumed:
        done = store.done_slots(run_id)
        slots = [s for s in slots if not s.warmup and (s.config.key, s.repetition) not in done]
        if rep.warmup and slots:
            slots.insert(0, TrialSlot(config=slots[0].config, repetition=-1, position=-1, warmup=True))
    trial.task = bar.add_task("starting", total=len([s for s in slots if not s.warmup]))
    for slot in slots:
        trial(slot)
    for c in configs:
        store.set_stop_reason(run_id, c.key, f"fixed: {rep.repetitions} repetitions")


def _adaptive_decision(rep: RepeatSpec, per_metric: dict, attempts: int) -> tuple[bool, str]:
    """Stop or go on for one configuration, from its stored successful trials and its trial count."""
    keys = [m for m in rep.key_metrics if m in per_metric]
    skipped = [m for m in rep.key_metrics if m not in per_metric]
    if not keys:
        why = f"no successful trial measured {', '.join(rep.key_metrics)}"
        if attempts >= rep.n_max:
            return True, f"max reached ({attempts} trials): {why}"
        return False, why
    stop, why = adaptive_decision({m: per_metric[m] for m in keys}, rep.target_ci, rep.n_min, rep.n_max)
    if not stop and attempts >= rep.n_max:
        # failed trials count against max, or a run with a failing tool would never end
        ok = min(len(per_metric[m]) for m in keys)
        stop, why = True, f"max reached ({attempts} trials, {ok} successful): {why}"
    if skipped:
        why += f" ({', '.join(skipped)} not measured in this configuration)"
    return stop, why


def _run_adaptive(configs: list[Configuration], rep: RepeatSpec, store: Store, run_id: str, trial: _TrialRunner,
                  bar, *, resumed: bool) -> None:
    """Rounds of every still-active configuration once, each round in a fresh seeded random order, until
    each configuration's key metrics are precise enough (``target_ci``) or ``max`` is reached.

    Everything needed to continue is in the store (trials per configuration, stop reasons), so a resumed
    run picks up where it stopped: an unfinished round is completed first, then rounds go on.
    """
    attempts = {c.key: 0 for c in configs}
    position = 0
    stopped: set[str] = set()
    if resumed:
        for key, repetition in store.done_slots(run_id):
            if key in attempts:
                attempts[key] = max(attempts[key], repetition + 1)
        position = max((t["position"] for t in store.trials(run_id)), default=-1) + 1
        stopped = {c["key"] for c in store.configurations(run_id) if c["stop_reason"]}

    active = [c for c in configs if c.key not in stopped]

    def most_left() -> int:
        return sum(rep.n_max - attempts[c.key] for c in active)

    trial.task = bar.add_task("adaptive", total=most_left())

    def decide(batch: list[Configuration]) -> None:
        values = store.values(run_id)
        for c in batch:
            stop, why = _adaptive_decision(rep, values.get(c.key, {}), attempts[c.key])
            if stop:
                store.set_stop_reason(run_id, c.key, why)
                active.remove(c)
        # the bar's total stays "the most trials this run can still take", so it shrinks as configurations stop
        bar.update(trial.task, total=trial.done + most_left())

    decide([c for c in active if attempts[c.key] > 0])  # a resumed run: some may be done already
    if rep.warmup and active:
        first = _round(active, attempts, rep)[0]
        trial(TrialSlot(config=first, repetition=-1, position=-1, warmup=True))
    while active:
        batch = _round(active, attempts, rep)
        r = attempts[batch[0].key]
        for c in batch:
            trial(TrialSlot(config=c, repetition=attempts[c.key], position=position),
                  note=f"adaptive {'round' if rep.order == 'interleaved' else 'trial'} {r + 1}: ")
            attempts[c.key] += 1
            position += 1
        decide(batch)


def _round(active: list[Configuration], attempts: dict[str, int], rep: RepeatSpec) -> list[Configuration]:
    """The next configurations to run once each: interleaved, every active configuration that is one
    round behind, in a random order seeded by (seed, round); sequential, the first active one."""
    if rep.order == "sequential":
        return [active[0]]
    r = min(attempts[c.key] for c in active)
    batch = [c for c in active if attempts[c.key] == r]
    random.Random(f"{rep.seed}:round:{r}").shuffle(batch)
    return batch


class _NoProgress:
    def __enter__(self) -> "_NoProgress":
        return self

    def __exit__(self, *a: object) -> None:
        pass

    def add_task(self, *a: object, **k: object) -> int:
        return 0

    def update(self, *a: object, **k: object) -> None:
        pass

    def advance(self, *a: object, **k: object) -> None:
        pass


def _progress(console: Console, enabled: bool):
    if not enabled:
        return _NoProgress()
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=console, transient=False)


def resume(store: Store, run_ref: str, **kwargs: object) -> RunSummary:
    run_id = store.resolve_run(run_ref)
    run = store.run(run_id)
    if run["status"] == "completed":
        raise ScenarioError(f"run {run_id} is already complete; nothing to resume")
    loaded = load_text(run["scenario_text"], run["scenario_source"], run["overrides"])
    # the run was accepted when it was planned, whatever limit it was given then
    return execute(loaded, store, resume_run_id=run_id, max_configurations=2**63, **kwargs)
