"""The metrics vnetbench records: stable dotted names, units, and which way is better.

Definitions follow the RFCs so numbers mean the same thing in every report:
RTT per RFC 2681, loss ratio per RFC 7680 (lost / sent), IPDV per RFC 3393.
iperf3's ``jitter_ms`` is RFC 3550's smoothed interarrival jitter, which is not
IPDV; its metric name says so.

Every sample stored carries its unit and direction from here, so comparisons
never count an improvement as a failure.

When several workloads of a trial run the same tool (a parking lot's long flow
and its cross flows, each an iperf3 workload between hosts of its own), each
one's metrics carry its name after an ``@``: ``throughput.rx_mbps@long``,
``throughput.rx_mbps@cross1``. They are the metric below, measured by that
workload; ``--metric`` and ``repeat.key_metrics`` take them by that name.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

HIGHER = "higher"
LOWER = "lower"


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    direction: str  # HIGHER or LOWER is better
    description: str
    noise: float | None = None  # default noise threshold for comparisons, if not the global one
    # The smallest step the tool reports, in the metric's unit, where it is coarse (ab's connect times are
    # whole ms): medians closer than one step are "unchanged", not a change too small to resolve.
    resolution: float | None = None
    # The value that says the workload received nothing at all (a loss ratio of 1, a rate of 0): a trial that
    # measures it where the configuration's conditions cannot explain it fails (runner/pathcheck.py).
    nothing: float | None = None


# Counts of packets lost in a trial's few congestion episodes (retransmitted segments, tail drops) hang on how
# far each window overshot the queue, which the machine's timing decides: identical TCP trials through a
# tail-drop bottleneck counted 1 to 32 retransmissions (CV about 70%), identical runs' medians of 6 trials
# ranged 7.5 to 12 over 8 runs and 11.5 to 16 in a CI run. A change smaller than half is noise for them.
LOSS_EVENT_COUNT_NOISE = 0.5

# Measured by the lab itself in every trial, whatever the workloads: the bottleneck's kernel counters and the
# link emulator's own (impair/, userspace backend). Each workload's metrics are declared in its module
# (vnetbench.workloads.<tool>.METRICS) and join these on first use.
LAB_METRICS = (
    Metric("bottleneck.drops", "packets", LOWER, "Packets the bottleneck qdisc dropped during the trial (kernel counters)",
           noise=LOSS_EVENT_COUNT_NOISE),
    Metric("link.lost_packets", "packets", LOWER, "Packets the link's loss model dropped (forward direction)"),
    Metric("link.reordered_packets", "packets", LOWER, "Packets the link's reordering model sent ahead of "
                                                       "others (forward direction, the userspace emulator)"),
    Metric("link.duplicated_packets", "packets", LOWER, "Packets the link's model duplicated (forward direction, "
                                                        "the userspace emulator)"),
    Metric("link.max_queue_delay_ms", "ms", LOWER, "Longest time a packet waited in the emulated link's queue "
                                                   "(forward direction)", noise=0.10),
    Metric("start.spread_ms", "ms", LOWER, "On real hosts (run --hosts): how far apart the clients of a trial's "
                                           "first workload started on their hosts, on the controller's clock"),
    # The CPU of the machine the lab runs on, over the first workload's measured window (runner/recorders.py).
    Metric("cpu.util_pct", "%", LOWER, "Busy CPU of the lab's machine, or of the hosts' machines together (user, "
                                       "system, irq, softirq) over the first workload's measured window, in cores x "
                                       "100 (200 = two cores busy): the endpoints, the link emulator and whatever "
                                       "else ran, less the instruments' own processes (cpu.probe_pct)", noise=0.10),
    Metric("cpu.rx_util_pct", "%", LOWER, "On real hosts (run --hosts), where the receiver's machine is not a "
                                          "sender's: its busy CPU over the window, in cores x 100 (netperf's remote "
                                          "side), less the instruments that ran there", noise=0.10),
    Metric("cpu.tx_util_pct", "%", LOWER, "On real hosts, where they are not the receiver's: the senders' machines' "
                                          "busy CPU over the window, together, in cores x 100 (netperf's local side), "
                                          "less the instruments that ran there",
           noise=0.10),
    Metric("cpu.probe_pct", "%", LOWER, "CPU the instruments beside the traffic (ping, irtt, sockperf, ss running "
                                        "during another workload) used in their own processes over the same window, "
                                        "in cores x 100; taken out of cpu.util_pct and of the part or guest that ran "
                                        "them (ping below a 10 ms interval spins a core)", noise=0.25),
    Metric("cpu.softirq_pct", "%", LOWER, "Of cpu.util_pct, the time in softirq (packet processing outside any "
                                          "process), in cores x 100", noise=0.25),
    Metric("cpu.steal_pct", "%", LOWER, "Time the hypervisor gave the lab machine's vCPUs to others over the "
                                        "window, in cores x 100: noise the machine added", noise=0.5),
    Metric("cpu.foreign_pct", "%", LOWER, "CPU time of processes that are not the run's (other users' work on the "
                                          "lab's machine; kernel threads not counted) over the trial, in cores x 100: "
                                          "noise the machine added", noise=0.5),
    Metric("cpu.emulator_pct", "%", LOWER, "Of cpu.util_pct, the link emulators' processes (vnb-link, every "
                                           "thread) over the window, in cores x 100: what the userspace links "
                                           "cost (an emulator spins its core while it waits for packets)",
           noise=0.10),
    Metric("cpu.qemu_pct", "%", LOWER, "Of the machine's busy time, the guests' QEMU processes seen from the "
                                       "host over the window (vCPU threads, which run all of a TCG guest's work, "
                                       "and QEMU's I/O and vhost threads; per kind in the trial's raw record), less "
                                       "the instruments that ran in the guests, in cores x 100: what the guests "
                                       "cost their host", noise=0.10),
    Metric("cpu.guest_util_pct", "%", LOWER, "The guests' busy CPU seen from inside them (their own /proc/stat: "
                                             "user, system, irq, softirq) over the window, less the sampler's "
                                             "own and the instruments that ran there, in cores x 100 of their "
                                             "vCPUs, the guests together",
           noise=0.10),
    Metric("cpu.guest_softirq_pct", "%", LOWER, "Of cpu.guest_util_pct, the guests' softirq time (their "
                                                "kernels' packet processing), in cores x 100", noise=0.25),
    Metric("cpu.guest_steal_pct", "%", LOWER, "Time the host took from the guests' vCPUs as their kernels count it "
                                              "(KVM's steal time; 0 under TCG), in cores x 100", noise=0.5),
    Metric("cpu.container_pct", "%", LOWER, "An engine's containers (docker, podman) over the window: every "
                                            "process in their cgroups (servers, clients, their system time) less "
                                            "the instruments that ran there, as cpu.util_pct; per container in "
                                            "the trial's raw record, instruments included), in cores x 100",
           noise=0.10),
    # A trial's streams between different hosts (a declared topology's workloads): runner/bench.py.
    Metric("flows.maxmin_fairness", "ratio", HIGHER, "Jain's index of the stream workloads' received throughput, "
                                                     "each relative to its max-min fair share of the links' "
                                                     "rates (the theory column): 1 = every flow got the same "
                                                     "part of its share"),
    Metric("cpu.us_per_kb", "us/KB", LOWER, "Service demand of a stream (netperf's): busy CPU microseconds "
                                            "(cpu.util_pct's, the instruments' not counted) per KB (1024 B) "
                                            "received, over the same window", noise=0.10),
    Metric("cpu.us_per_transaction", "us", LOWER, "Service demand of request/response (RR, HTTP): busy CPU "
                                                  "microseconds (cpu.util_pct's) per transaction, over the same "
                                                  "window", noise=0.10),
)


#: What a person asks first, one metric per question ("did throughput, loss, delay, retransmissions, fairness,
#: request/response latency change?"), in this order: the metrics `show`, `compare`, the report's first
#: table and the relative-to-bare table use by default, of those a run measured.
HEADLINE = ("throughput.rx_mbps", "udp.loss_ratio", "rtt.p50_ms", "rtt.p99_ms", "tcp.retransmits",
            "flows.jain_fairness", "flows.maxmin_fairness", "rr.p50_us", "rr.p99_us", "rr.transactions_per_s",
            "irtt.rtt_p50_ms", "irtt.jitter_rfc3550_ms", "irtt.loss_ratio",
            "http.requests_per_s", "http.latency_p99_ms", "http.errors",
            "ab.requests_per_s", "ab.latency_p99_ms", "ab.connect_p99_ms", "ab.failed_requests",
            "cpu.events_per_s", "memory.write_mib_per_s", "memory.mbw_memcpy_mib_per_s")


#: What a trial cost in CPU (runner/recorders.CpuRecorder): shown after the headline by `show`, not judged by
#: compare's default (the machine's other work moves it; `compare --metric cpu.us_per_kb` judges it).
COST = ("cpu.util_pct", "cpu.us_per_kb", "cpu.us_per_transaction", "cpu.rx_util_pct", "cpu.tx_util_pct",
        "cpu.probe_pct", "cpu.emulator_pct", "cpu.qemu_pct", "cpu.container_pct", "cpu.guest_util_pct")

#: The machine's own noise: a trial is marked (kept in the statistics, counted apart by `show`, the report and
#: `compare`) when over it the hypervisor took, or processes that are not the run's used, more than this much
#: CPU, in cores x 100. On this project's 2-core VM an idle machine measured steal 0-1 and other work 1-3; a
#: competing busy loop is 100.
NOISE_MARKS = (("cpu.steal_pct", 5.0, "steal"), ("cpu.foreign_pct", 10.0, "other processes"))


def noise_marks(values: Mapping[str, float]) -> list[str]:
    """Why a trial with these metric values is marked ("other processes 98 % of a core"); empty: not marked."""
    return [f"{what} {v:.0f} % of a core" for metric, limit, what in NOISE_MARKS
            if (v := values.get(metric)) is not None and v > limit]


#: Between a metric's name and the workload that measured it, when several workloads of a trial run the same
#: tool (a parking lot's long flow and its cross flows): ``throughput.rx_mbps@cross1``. The metric is the
#: registered one; the name says whose it is.
QUALIFIER = "@"


def qualified(name: str, workload: str) -> str:
    """`name` as workload `workload` measured it: ``throughput.rx_mbps@long``."""
    return f"{name}{QUALIFIER}{workload}"


def base_name(name: str) -> str:
    """The registered metric a (possibly qualified) name is: ``throughput.rx_mbps@long`` -> ``throughput.rx_mbps``."""
    return name.partition(QUALIFIER)[0]


def in_order(preferred: Iterable[str], present: Iterable[str], workloads: Sequence[str] = ()) -> list[str]:
    """The `present` metrics that `preferred` names, in its order, each followed by its qualified forms (one per
    workload that measured it), in the order of `workloads` (the scenario's; others after, by name): what
    `show`, `compare` and the report take by default."""
    present = set(present)
    rank = {w: i for i, w in enumerate(workloads)}

    def by_workload(m: str) -> tuple[int, str]:
        return rank.get(m.partition(QUALIFIER)[2], len(rank)), m

    out: list[str] = []
    for name in preferred:
        out += [name] if name in present else []
        out += sorted((m for m in present if m != name and base_name(m) == name), key=by_workload)
    return list(dict.fromkeys(out))


class _Registry(Mapping[str, Metric]):
    """Every metric by name: the lab's and those of each registered workload, collected on first use
    (the workload modules import this one, so they cannot be imported here at module level)."""

    def __init__(self) -> None:
        self._by_name: dict[str, Metric] | None = None

    def _all(self) -> dict[str, Metric]:
        if self._by_name is None:
            from vnetbench.workloads.registry import drivers

            by_name = {m.name: m for m in LAB_METRICS}
            for d in drivers().values():
                for m in d.metrics:
                    if m.name in by_name and by_name[m.name] != m:
                        raise RuntimeError(f"metric {m.name} is declared twice, differently ({d.tool})")
                    by_name[m.name] = m
            self._by_name = by_name
        return self._by_name

    def __getitem__(self, name: str) -> Metric:
        base, _, workload = name.partition(QUALIFIER)
        m = self._all()[base]
        if not workload:
            if name != base:
                raise KeyError(name)
            return m
        return replace(m, name=name, description=f"{m.description} (workload {workload})")

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


METRICS: Mapping[str, Metric] = _Registry()


def metric(name: str) -> Metric:
    """Metadata for a metric; unknown names are a programming error, said loudly."""
    try:
        return METRICS[name]
    except KeyError:
        raise KeyError(f"metric {name!r} is not registered in vnetbench.metrics") from None
