"""Executing a plan: checks first, then the lab, the trials in their order, and
teardown on every way out.

Order of business, so that bad input never leaves half a lab behind:
1. everything that can be checked without building is checked (scenario
   validated and expanded, root, tools, congestion control);
2. the run is stored with its fingerprint and configurations;
3. the lab is built, trials run (each committed as it ends);
4. the lab is torn down in ``finally``, under a signal shield.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from vnetbench.errors import EnvironmentProblem, ScenarioError
from vnetbench.lab.teardown import Interrupted, interruptible
from vnetbench.runner import fingerprint
from vnetbench.runner.bench import DumbbellBench
from vnetbench.scenario.load import LoadedScenario, load_text
from vnetbench.scenario.plan import Configuration, TrialSlot, expand, order_trials
from vnetbench.store.db import Store, TrialRecord
from vnetbench.workloads.base import IP, IPERF3, PING, SS, TASKSET, require

RUN_PREFIX = "vnb"


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def run_prefix(run_id: str) -> str:
    return f"{RUN_PREFIX}-{run_id[:6]}"


def check_root() -> None:
    if os.geteuid() != 0:
        raise EnvironmentProblem(
            "vnetbench builds its lab from network namespaces, which needs root: run it with sudo (nothing was built)"
        )


def check_congestion_controls(configs: list[Configuration]) -> None:
    wanted = sorted({c.stream.congestion_control for c in configs if c.stream.proto == "tcp"})
    available = set((fingerprint.read_sysctl("net.ipv4.tcp_available_congestion_control") or "").split())
    for cc in wanted:
        if cc in available:
            continue
        # Most algorithms are modules (tcp_bbr, tcp_htcp...): try loading before giving up.
        os.system(f"modprobe tcp_{cc} >/dev/null 2>&1")
        available = set((fingerprint.read_sysctl("net.ipv4.tcp_available_congestion_control") or "").split())
        if cc not in available:
            raise EnvironmentProblem(
                f"TCP congestion control {cc!r} is not available on this kernel (available: "
                f"{', '.join(sorted(available))}); choose one with --set congestion_control=NAME"
            )


def preflight(configs: list[Configuration]) -> None:
    check_root()
    require([IPERF3, PING, TASKSET, IP, SS])
    check_congestion_controls(configs)


@dataclass
class RunSummary:
    run_id: str
    status: str
    trials_ok: int
    trials_failed: int
    failures: list[str]


def execute(loaded: LoadedScenario, store: Store, *, resume_run_id: str | None = None,
            console: Console | None = None, progress: bool = True,
            on_trial: Callable[[TrialSlot, str], None] | None = None) -> RunSummary:
    console = console or Console(stderr=True)
    configs = expand(loaded)
    preflight(configs)
    rep = loaded.scenario.repeat
    slots = order_trials(configs, rep.repetitions, rep.order, rep.seed, rep.warmup)

    if resume_run_id:
        run_id = resume_run_id
        done = store.done_slots(run_id)
        slots = [s for s in slots if not s.warmup and (s.config.key, s.repetition) not in done]
        if rep.warmup and slots:
            slots.insert(0, TrialSlot(config=slots[0].config, repetition=-1, position=-1, warmup=True))
        store.reopen_run(run_id)
    else:
        run_id = new_run_id()
        store.create_run(run_id, loaded.scenario.name, loaded.source, loaded.text, loaded.text_hash,
                         list(loaded.overrides), rep.seed, fingerprint.collect())
    for c in configs:
        store.add_configuration(run_id, c.key, c.labels, c.params(), c.expected)

    lab_spec = loaded.scenario.lab
    bench = DumbbellBench(run_prefix(run_id), senders=max(c.active_senders for c in configs), mtu=lab_spec.mtu,
                          pin_cpus=lab_spec.pin_cpus)
    ok = failed = 0
    failures: list[str] = []
    status, reason = "completed", None
    measured = [s for s in slots if not s.warmup]
    try:
        with interruptible():
            bench.setup()
            with _progress(console, progress) as bar:
                task = bar.add_task("starting", total=len(measured))
                for slot in slots:
                    state = bench.prepare(slot.config)
                    label = ("warm-up: " if slot.warmup else "") + slot.config.label_text
                    bar.update(task, description=label)
                    outcome = bench.run_trial(slot.config, f"p{slot.position}-r{slot.repetition}")
                    if slot.warmup:
                        continue  # not stored: it only brings caches, ARP and TCP metrics to a steady state
                    store.set_lab_state(run_id, slot.config.key, {"qdiscs": state})
                    store.record_trial(run_id, TrialRecord(
                        config_key=slot.config.key, repetition=slot.repetition, position=slot.position,
                        started=outcome.started, ended=outcome.ended, status=outcome.status, reason=outcome.reason,
                        raw=outcome.raw, samples=outcome.measurement.samples, series=outcome.measurement.series))
                    if outcome.status == "ok":
                        ok += 1
                    else:
                        failed += 1
                        failures.append(f"{slot.config.label_text} #{slot.repetition}: {outcome.status}: {outcome.reason}")
                        console.print(f"[yellow]trial {slot.config.label_text} #{slot.repetition} {outcome.status}:[/] "
                                      f"{outcome.reason}")
                    if on_trial:
                        on_trial(slot, outcome.status)
                    bar.advance(task)
    except Interrupted as e:
        status, reason = "interrupted", f"stopped by {e.signame}; finish it with `vnetbench run --resume {run_id}`"
        raise
    except BaseException as e:
        status, reason = "failed", f"{type(e).__name__}: {e}"
        raise
    finally:
        errors = bench.teardown()
        if errors:
            console.print("[red]teardown problems:[/] " + "; ".join(errors) + " (run `vnetbench clean`)")
        store.finish_run(run_id, status, reason)
    return RunSummary(run_id, status, ok, failed, failures)


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
    return execute(loaded, store, resume_run_id=run_id, **kwargs)
