"""A UDP sender that sends less than offered: `show` and the report say so, with the link's loss for what was sent.

The numbers of the first test are those of run c24228cb8ae6 (static-congestion at a 3.8 Gbit/s line on the
project's 2-core VM): one iperf3 UDP sender of 1400-byte datagrams sent about 2 Gbit/s of the 3.8 asked.
"""

from __future__ import annotations

import numpy as np
import pytest
from rich.console import Console

from vnetbench.report import sender
from vnetbench.report.html import render_report
from vnetbench.report.html_synthetic import make_run
from vnetbench.report.terminal import show
from vnetbench.store.db import Store

UDP_RATIO_2 = {"throughput.offered_mbps": 3800.0, "throughput.rx_mbps": 1900.0, "udp.loss_ratio": 0.5,
               "queue.full_delay_ms": 10.0}
TCP_RATIO_2 = {"throughput.offered_mbps": 3800.0, "throughput.rx_mbps": 1900.0, "queue.full_delay_ms": 10.0}


def _values(tx: list[float], loss: list[float] | None = None) -> dict[str, np.ndarray]:
    out = {"throughput.tx_mbps": np.array(tx)}
    if loss is not None:
        out["udp.loss_ratio"] = np.array(loss)
    return out


def test_a_short_udp_sender_gets_the_links_loss_for_what_it_sent():
    found = sender.shortfalls([
        ({"delay": "0.3ms", "ratio": 2}, UDP_RATIO_2, _values([2088.0], [0.117])),
        ({"delay": "0.3ms", "ratio": 2, "proto": "tcp"}, TCP_RATIO_2, _values([315.5])),  # TCP: no such theory
        ({"delay": "3ms", "ratio": 2}, UDP_RATIO_2, _values([3700.0, 3650.0, 3790.0])),  # 97 % sent: not short
        ({"delay": "30ms", "ratio": 2}, UDP_RATIO_2, {}),  # no sent rate stored: nothing to judge
    ])
    assert len(found) == 1
    s = found[0]
    assert s.labels == {"delay": "0.3ms", "ratio": 2} and s.sent_mbps == 2088.0 and s.offered_mbps == 3800.0
    assert s.loss_offered == 0.5 and s.loss_given_sent == pytest.approx(1 - 1900 / 2088)  # 0.090
    assert s.loss_measured == 0.117
    assert sender.row(s) == ["3800", "2088", "0.117", "0.500", "0.090"]
    text = sender.note(found, 3)
    assert "1 of 3 UDP configurations" in text and "2088 of 3800 Mbit/s, delay=0.3ms ratio=2" in text
    assert sender.note([], 3) is None


def test_below_the_bottleneck_a_short_sender_loses_nothing_to_the_link():
    below = {"throughput.offered_mbps": 800.0, "throughput.rx_mbps": 800.0, "udp.loss_ratio": 0.0}
    (s,) = sender.shortfalls([({"ratio": 0.8}, below, _values([500.0, 520.0, 510.0]))])
    assert s.sent_mbps == 510.0 and s.loss_given_sent == 0.0 and s.loss_measured is None
    assert sender.row(s)[2] == "-"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    with Store(tmp_path_factory.mktemp("sender") / "vnetbench.db") as st:
        matrix = {"ratio": [0.8, 2.0], "proto": ["udp", "tcp"]}
        make_run(st, "sendshort001", matrix=matrix, repetitions=3, duration_s=3, series=False,
                 scale={"throughput.tx_mbps": 0.6})
        make_run(st, "sendsfull001", matrix=matrix, repetitions=3, duration_s=3, series=False)
        yield st


def _show(store: Store, run_id: str) -> str:
    console = Console(width=200, record=True, highlight=False, soft_wrap=False)
    show(store, run_id, console)
    return console.export_text()


def test_show_names_the_udp_configurations_whose_sender_fell_short(store):
    text = _show(store, "sendshort001")
    assert "The UDP sender sent less than offered in 2 of 2 UDP configurations" in text
    assert "UDP sender short of the offered rate" in text and "1 - bottleneck/sent" in text
    assert "sent less than offered" not in _show(store, "sendsfull001")


def test_the_report_lists_them_next_to_the_other_notes(store):
    page = render_report(store, ["sendshort001"])
    assert 'id="sender-short-sendshor' in page and "UDP sender short of the offered rate" in page
    assert "sent less than offered" not in render_report(store, ["sendsfull001"])
