"""What watches a trial besides its workloads.

A trial is its workloads' phases with recorders around them: each recorder is started right before the first
phase, stopped right after the last (every tool has ended or been stopped), and then asked for what it saw:
what goes with the trial's raw record, and the metrics it measured. A recorder reads counters the trial's
traffic moves; it starts nothing the workloads would see.

- :class:`LinkRecorder`: the link backends (the emulator restarts with the trial's seed and schedule; what
  each link's model and queue counted);
- :class:`QdiscRecorder`: the lab's bottleneck port qdisc counters, where the links' backend counts no drops;
- :class:`EnvironmentRecorder`: an environment's own counters (an overlay's VXLAN devices).

A bench gives the trial its recorders (``DumbbellBench.recorders``); a new kind of counter is one class here.
"""

from __future__ import annotations

from typing import Any

from vnetbench.impair import tc
from vnetbench.impair.links import LinkManager, bottleneck_drops, link_metrics
from vnetbench.runner import pathcheck
from vnetbench.workloads.base import Measurement


class Recorder:
    """start(span_s) before the trial's first phase, stop() after its last, then collect(measurement, raw):
    the metrics it measured go into `measurement` (kept only when the trial is ok), its raw record into `raw`
    (kept always: a failed trial's counters say why it failed)."""

    def start(self, span_s: float) -> None:
        """Right before the first phase; `span_s` is how long the phases take together."""

    def stop(self) -> None:
        """Right after the last phase."""

    def collect(self, measurement: Measurement, raw: dict[str, Any]) -> None:
        """What was seen between start and stop."""

    def dropped(self) -> float:
        """Packets the declared conditions' own models and queues dropped in the trial: what can explain a
        trial that received nothing (runner/pathcheck.nothing_received)."""
        return 0.0


class LinkRecorder(Recorder):
    """The links: emulators restart with the trial's seed and schedule (a schedule's time 0 is the trial's
    start); what each link's backend counted, per direction, and the bottleneck's drops and the emulator's
    own measurements of it."""

    def __init__(self, links: LinkManager):
        self.links = links
        self.counters: dict[str, Any] = {}

    def start(self, span_s: float) -> None:
        self.links.start_trial(span_s)

    def stop(self) -> None:
        self.counters = self.links.end_trial()

    def collect(self, measurement: Measurement, raw: dict[str, Any]) -> None:
        raw["links"] = {name: c.per_direction for name, c in self.counters.items()}
        drops = bottleneck_drops(self.counters)
        if drops is not None:
            measurement.add("bottleneck.drops", drops)
        for metric, value in link_metrics(self.counters):
            measurement.add(metric, value)

    def dropped(self) -> float:
        return pathcheck.link_drops(self.counters)


class QdiscRecorder(Recorder):
    """The root qdisc of the lab's bottleneck port (the switch side of the receiver's link): its packets, drops
    and overlimits before and after. Its drops are the trial's ``bottleneck.drops`` when the links' backend
    counted none of its own (collect the links first)."""

    def __init__(self, iface: Any):
        self.iface = iface
        self.before: dict[str, int] = {}
        self.after: dict[str, int] = {}

    def start(self, span_s: float) -> None:
        self.before = tc.counters(self.iface)

    def stop(self) -> None:
        self.after = tc.counters(self.iface)

    def collect(self, measurement: Measurement, raw: dict[str, Any]) -> None:
        raw["bottleneck_counters"] = {"before": self.before, "after": self.after}
        if not measurement.has("bottleneck.drops"):
            measurement.add("bottleneck.drops", self.after["drops"] - self.before["drops"])


class EnvironmentRecorder(Recorder):
    """An environment's own counters before and after (``counters()``; None where it keeps none)."""

    def __init__(self, env: Any):
        self.env = env
        self.before: Any = None
        self.after: Any = None

    def start(self, span_s: float) -> None:
        self.before = self.env.counters()

    def stop(self) -> None:
        self.after = self.env.counters()

    def collect(self, measurement: Measurement, raw: dict[str, Any]) -> None:
        if self.before is not None:
            raw["environment_counters"] = {"before": self.before, "after": self.after}
