"""When a UDP sender could not send what the scenario offered.

The plan's theory for a UDP stream through a bottleneck (received = min(offered, bottleneck), loss =
1 - 1/load: seed 001's equation 4.3) assumes the offered rate was sent. A sender can fall short: one iperf3
UDP sender of 1400-byte datagrams sends about 2 Gbit/s on the project's 2-core VM, and seed 001's own
chapter 7 saw its processor fall behind with small messages. The link's physics still predicts what it does
with what *was* sent: received = min(sent, bottleneck), loss = 1 - bottleneck / sent. This names the
configurations where that happened, with both theories, so that a loss far below 1 - 1/ratio reads as the
sender's limit and not the link's. `vnetbench show` prints them and the HTML report lists them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

# Sent below this share of the offered rate (the median over trials): iperf3's pacing keeps within about 1 %
# of its target while the sender keeps up, so 5 % short is the sender, not the pacing.
SHORT = 0.95


@dataclass(frozen=True)
class Shortfall:
    labels: dict[str, Any]
    offered_mbps: float
    sent_mbps: float  # median over the configuration's trials
    loss_offered: float  # the plan's theory: 1 - 1/load, from the offered rate
    loss_given_sent: float  # the same physics from what was sent: 1 - bottleneck / sent
    loss_measured: float | None  # median over trials


def shortfalls(configs: Iterable[tuple[dict[str, Any], dict[str, float], dict[str, np.ndarray]]]) -> list[Shortfall]:
    """The UDP configurations (labels, theory, values per metric) whose sender sent less than `SHORT` of the
    offered rate."""
    out = []
    for labels, expected, values in configs:
        loss_offered = expected.get("udp.loss_ratio")  # set by the plan for UDP streams through a bottleneck only
        offered, link = expected.get("throughput.offered_mbps"), expected.get("throughput.rx_mbps")
        sent_values = values.get("throughput.tx_mbps")
        if loss_offered is None or offered is None or link is None or sent_values is None or not len(sent_values):
            continue
        sent = float(np.median(sent_values))
        if sent >= SHORT * offered:
            continue
        # `link` is min(offered, bottleneck): with the sender below it, what the link carries is what was sent.
        loss_given_sent = max(0.0, 1.0 - link / sent) if sent > 0 else 0.0
        measured = values.get("udp.loss_ratio")
        out.append(Shortfall(labels, offered, sent, loss_offered, loss_given_sent,
                             float(np.median(measured)) if measured is not None and len(measured) else None))
    return out


def note(found: list[Shortfall], udp_configurations: int) -> str | None:
    """One sentence for people, or None when every UDP sender sent what was offered."""
    if not found:
        return None
    worst = min(found, key=lambda s: s.sent_mbps / s.offered_mbps)
    where = " ".join(f"{k}={v}" for k, v in worst.labels.items())
    return (f"The UDP sender sent less than offered in {len(found)} of {udp_configurations} UDP configuration"
            f"{'s' if udp_configurations != 1 else ''} (least: {worst.sent_mbps:.0f} of {worst.offered_mbps:.0f} "
            f"Mbit/s, {where}): the sender's limit, not the link's. The theory columns assume the offered rate; "
            "for what was sent, the link's loss is 1 - bottleneck / sent.")


def udp_count(expected: Iterable[dict[str, float]]) -> int:
    return sum(1 for x in expected if "udp.loss_ratio" in x)


HEADERS = ["offered Mbit/s", "sent Mbit/s", "loss", "theory 1 - 1/load", "1 - bottleneck/sent"]


def row(s: Shortfall) -> list[str]:
    """The numbers of one shortfall, in the order of `HEADERS` (after the configuration's labels)."""
    measured = f"{s.loss_measured:.3f}" if s.loss_measured is not None else "-"
    return [f"{s.offered_mbps:.0f}", f"{s.sent_mbps:.0f}", measured, f"{s.loss_offered:.3f}",
            f"{s.loss_given_sent:.3f}"]
