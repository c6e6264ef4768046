"""Kernel netem (+ a tbf or htb child for rate and buffer), from tc-netem(8).

Untested on the machine this was written on: its kernel has no sch_netem. The
commands are built from tc-netem(8) and tc-tbf(8)/tc-htb(8) semantics and the
unit tests check them (tests/unit/test_impair_backends.py); `vnetbench doctor`
says whether this kernel has netem, and ``backend = "auto"`` only picks it
where the probe installed one.

Why the ``tc`` binary and not netlink through pyroute2 (which lab/ uses
elsewhere): jitter distributions are tables that tc loads from
/usr/lib/tc/*.dist, and pyroute2's netem codec has no distribution tables and
no Gilbert-Elliott model.

Layout on the egress of each direction::

    root 1: netem  limit L delay D J distribution X loss ... duplicate ... corrupt ... reorder ...
      └─ 1:1 → 10: tbf rate R burst B limit BUFFER            (rate_qdisc = tbf)
             or 10: htb → class 10:1 rate R → 11: bfifo limit BUFFER   (rate_qdisc = htb)

So a packet is lost/duplicated/corrupted and delayed by netem, then queued and
serialised by the rate qdisc (vnb-link queues before it delays: the steady-state
RTT, queueing delay and drop behaviour are the same).

Order when jitter must not reorder: netem keeps FIFO order only when its own
``rate`` is set (each packet's time then counts from the previous packet's), so
``rate 100gbit`` is added; it costs nothing at real rates.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from typing import Any

from vnetbench.errors import LabError
from vnetbench.impair.backend import RATE_QDISC_NEEDS, Backend, LabLink, TrialCounters, register
from vnetbench.impair.model import LinkConditions, LinkSpec, default_buffer_bytes
from vnetbench.impair.tc import burst_bytes, installed_roots

# What a netem qdisc (with a tbf/htb child for rate and buffer) expresses; the rest needs the emulator.
NETEM_CAN = RATE_QDISC_NEEDS | {"overhead", "delay", "jitter", "jitter:pareto", "jitter:paretonormal", "loss",
                            "loss:gilbert_elliott", "loss:correlation", "reorder", "reorder:correlation",
                            "duplicate", "corrupt"}

ORDERING_RATE = "100gbit"
ASSUMED_LINE_BPS = 10e9  # delay-line sizing when a direction has no rate
MIN_AVG_FRAME = 100  # bytes: sizes the delay line for small frames too


def _time(seconds: float) -> str:
    us = seconds * 1e6
    return f"{round(us, 3):g}us"


def _pct(p: float) -> str:
    return f"{round(p * 100, 6):g}%"




def delay_line_limit(cond: LinkConditions, mtu: int) -> int:
    """netem's `limit` (packets) must hold everything in the delay line plus the
    queue behind it, or netem itself drops: 1000 (its default) at least."""
    rate = cond.rate or ASSUMED_LINE_BPS
    in_flight = rate / 8 * (cond.delay + 4 * cond.jitter) / MIN_AVG_FRAME
    queue = (cond.buffer_bytes() or default_buffer_bytes(mtu)) / MIN_AVG_FRAME
    return int(min(2**31 - 1, max(1000, math.ceil(in_flight + queue))))


def netem_args(cond: LinkConditions, mtu: int = 1500, seed: int | None = None) -> list[str]:
    """`netem ...` options for one direction (tc-netem(8) syntax)."""
    args = ["netem", "limit", str(delay_line_limit(cond, mtu))]
    if cond.delay > 0 or cond.jitter > 0:
        args += ["delay", _time(cond.delay)]
        if cond.jitter > 0:
            args.append(_time(cond.jitter))
            # Without a table netem's jitter is uniform on [-J, +J]; tc loads the others.
            if cond.distribution != "uniform":
                args += ["distribution", cond.distribution]
    loss = cond.loss
    if loss.model == "bernoulli" and loss.p > 0:
        args += ["loss", "random", _pct(loss.p)] + ([_pct(loss.correlation)] if loss.correlation > 0 else [])
    elif loss.model == "gilbert_elliott":
        args += ["loss", "gemodel", _pct(loss.p), _pct(loss.r or 0.0), _pct(loss.loss_bad), _pct(loss.loss_good)]
    if cond.duplicate > 0:
        args += ["duplicate", _pct(cond.duplicate)]
    if cond.corrupt > 0:
        args += ["corrupt", _pct(cond.corrupt)]
    if cond.reorder > 0:
        args += ["reorder", _pct(cond.reorder)] + ([_pct(cond.reorder_correlation)] if cond.reorder_correlation > 0
                                                   else [])
    if cond.jitter > 0 and not cond.jitter_reorders:
        args += ["rate", ORDERING_RATE]
    if seed is not None:
        args += ["seed", str(seed)]
    return args


def tc_prefix(ns: str) -> list[str]:
    """`tc` in namespace `ns`; "" for the namespace the command runs in (a real host's own)."""
    return ["tc", "-n", ns] if ns else ["tc"]


def commands(ns: str, dev: str, cond: LinkConditions, rate_qdisc: str = "tbf", mtu: int = 1500,
             seed: int | None = None) -> list[list[str]]:
    """Every tc command that puts `cond` on the egress of `dev` in namespace `ns`
    (after clear_command). A plain direction gets none."""
    if cond.is_plain():
        return []
    tc = tc_prefix(ns)
    out = [tc + ["qdisc", "add", "dev", dev, "root", "handle", "1:", *netem_args(cond, mtu, seed)]]
    if cond.rate:
        out += rate_qdisc_commands(ns, dev, cond, rate_qdisc, mtu, parent=["parent", "1:1"], handle="10:")
    return out


def rate_qdisc_commands(ns: str, dev: str, cond: LinkConditions, rate_qdisc: str = "tbf", mtu: int = 1500,
                    parent: list[str] | None = None, handle: str = "1:") -> list[list[str]]:
    """The tc commands of a rate and drop-tail buffer on `dev` (tbf, or htb with a bfifo), at `parent`
    (default: the root), from tc-tbf(8) and tc-htb(8): the same qdiscs lab/ installs through netlink
    (impair/tc.py), for where only a tc binary can reach (under netem, on a real host)."""
    if not cond.rate:
        return []
    tc = tc_prefix(ns)
    at = parent or ["root"]
    rate = f"{int(cond.rate)}bit"
    burst = str(burst_bytes(cond.rate, mtu))
    limit = str(int(cond.buffer_bytes() or default_buffer_bytes(mtu)))
    overhead = ["overhead", str(cond.overhead)] if cond.overhead else []
    if rate_qdisc == "tbf":
        return [tc + ["qdisc", "add", "dev", dev, *at, "handle", handle, "tbf", "rate", rate, "burst", burst,
                      "limit", limit, *overhead]]
    if rate_qdisc == "htb":
        major = handle.rstrip(":")
        child = f"{int(major, 16) + 1:x}:"
        return [tc + ["qdisc", "add", "dev", dev, *at, "handle", handle, "htb", "default", "1"],
                tc + ["class", "add", "dev", dev, "parent", handle, "classid", f"{major}:1", "htb", "rate", rate,
                      "ceil", rate, "burst", burst, "cburst", burst, *overhead],
                tc + ["qdisc", "add", "dev", dev, "parent", f"{major}:1", "handle", child, "bfifo", "limit", limit]]
    raise ValueError(f"unknown rate qdisc {rate_qdisc!r}; expected tbf or htb")


def clear_command(ns: str, dev: str) -> list[str]:
    return [*tc_prefix(ns), "qdisc", "del", "dev", dev, "root"]


def tc_supports_seed(version_text: str) -> bool:
    """netem's `seed` came with iproute2 6.5 (kernel 6.6)."""
    m = re.search(r"iproute2-(?:ss)?(\d+)\.(\d+)", version_text)
    return bool(m) and (int(m[1]), int(m[2])) >= (6, 5)


def parse_show(text: str) -> list[dict[str, Any]]:
    """`tc -j -s qdisc show` output, less the noqueue placeholders."""
    try:
        items = json.loads(text or "[]")
    except json.JSONDecodeError:
        return [{"unparsed": text[:500]}]
    return [q for q in items if q.get("kind") != "noqueue"]


def layout_problem(shown: list[dict[str, Any]], cond: LinkConditions, rate_qdisc: str) -> str | None:
    """Whether the qdiscs `tc -j qdisc show` lists on an egress (parse_show) have the layout `commands` makes
    for `cond`: nothing for a plain direction, netem at the root, and the rate qdisc under it when a rate is set."""
    kinds = [q.get("kind") for q in installed_roots(shown)]
    below = [q.get("kind") for q in shown if not q.get("root")]
    if cond.is_plain():
        wanted_root, wanted_below = [], []
    else:
        wanted_root = ["netem"]
        wanted_below = ({"tbf": ["tbf"], "htb": ["htb", "bfifo"]}[rate_qdisc]) if cond.rate else []
    if kinds != wanted_root or sorted(below) != sorted(wanted_below):
        have = ", ".join(str(k) for k in kinds + below) or "none"
        want = ", ".join(wanted_root + wanted_below) or "none"
        return f"the kernel has {have}, {want} declared"
    return None


# netem ships as the module sch_netem: in Debian's and Ubuntu's kernel images (linux-image-*, linux-modules-extra-*
# on Ubuntu cloud kernels), Fedora/RHEL's kernel-modules-extra.
@register("netem", "'netem' (kernel network emulator)", NETEM_CAN, probe_qdisc="netem delay 1ms",
          fix="modprobe sch_netem (Debian/Ubuntu: linux-image-amd64 / linux-modules-extra-$(uname -r); "
              "Fedora/RHEL: kernel-modules-extra)")
class NetemBackend(Backend):
    name = "netem"

    def __init__(self, link: LabLink, mtu: int = 1500, rate_qdisc: str = "tbf"):
        super().__init__(link, mtu, rate_qdisc)
        self._seed_ok: bool | None = None
        self._before: dict[str, float] = {}

    def _run(self, argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        if check and r.returncode != 0:
            raise LabError(f"`{' '.join(argv)}` failed: {r.stderr.strip() or r.stdout.strip()}")
        return r

    def _seed(self, spec: LinkSpec) -> int | None:
        if self._seed_ok is None:
            v = subprocess.run(["tc", "-V"], capture_output=True, text=True).stdout
            self._seed_ok = tc_supports_seed(v)
        return spec.seed if self._seed_ok else None

    def apply(self, spec: LinkSpec) -> dict:
        out: dict[str, Any] = {"backend": "netem", "directions": {}}
        seed = self._seed(spec)
        for d in ("forward", "reverse"):
            iface = self.link.egress(d)
            self._run(clear_command(iface.ns.name, iface.name), check=False)
            cmds = commands(iface.ns.name, iface.name, spec.direction(d), self.rate_qdisc, self.mtu, seed)
            for argv in cmds:
                self._run(argv)
            out["directions"][d] = {"commands": [" ".join(c[3:]) for c in cmds],
                                    "qdiscs": self._show(iface)}
        if seed is None:
            out["note"] = "this tc has no netem seed option (iproute2 < 6.5): loss patterns are not reproducible"
        return out

    def _show(self, iface) -> list[dict]:
        r = self._run(["tc", "-n", iface.ns.name, "-j", "-s", "qdisc", "show", "dev", iface.name], check=False)
        return parse_show(r.stdout)

    def check(self, spec: LinkSpec) -> list[str]:
        out = []
        for d in ("forward", "reverse"):
            iface = self.link.egress(d)
            problem = layout_problem(self._show(iface), spec.direction(d), self.rate_qdisc)
            if problem:
                out.append(f"{d} on {iface.name}: {problem}")
        return out

    def qdiscs(self) -> list[dict]:
        return [dict(q, netns=i.ns.name, dev=i.name) for i in (self.link.switch_end, self.link.host_end)
                for q in self._show(i)]

    def _drops(self, direction: str) -> float:
        return float(sum(q.get("drops", 0) for q in self._show(self.link.egress(direction))))

    def start_trial(self, spec: LinkSpec, seconds: float) -> None:
        self._before = {d: self._drops(d) for d in ("forward", "reverse")}

    def end_trial(self) -> TrialCounters:
        # netem counts its loss-model drops with the queue's: one number, "drops".
        return TrialCounters({d: {"drops": self._drops(d) - b} for d, b in self._before.items()})

    def clear(self) -> None:
        for iface in (self.link.switch_end, self.link.host_end):
            self._run(clear_command(iface.ns.name, iface.name), check=False)
