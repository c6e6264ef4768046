"""doctor --fidelity keeps going when a tool fails: the one iperf3 server still busy with the test before is
waited for, and a check whose tool fails anyway is a failed row, not a traceback that loses every result."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from vnetbench.impair import fidelity
from vnetbench.workloads.base import ToolFailed

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
BUSY = json.dumps({"start": {}, "intervals": [], "end": {}, "error": "the server is busy running a test. try again later"})


def _lab(answers: list[str]) -> SimpleNamespace:
    calls = []

    def run(argv, timeout, pin):
        calls.append(argv)
        return SimpleNamespace(stdout=answers[len(calls) - 1])

    return SimpleNamespace(s1=SimpleNamespace(run=run), r=SimpleNamespace(ipv4="198.18.0.2"), calls=calls)


def test_a_busy_server_is_waited_for(monkeypatch):
    monkeypatch.setattr(fidelity.time, "sleep", lambda s: None)
    good = (FIXTURES / "iperf3_tcp_cubic_omit.json").read_text()
    lab = _lab([BUSY, good])
    assert fidelity.FidelityLab.tcp(lab, 5) > 0
    assert len(lab.calls) == 2


def test_a_server_busy_every_time_and_other_failures_are_the_tools_reason(monkeypatch):
    monkeypatch.setattr(fidelity.time, "sleep", lambda s: None)
    lab = _lab([BUSY] * fidelity.SERVER_BUSY_ATTEMPTS)
    with pytest.raises(ToolFailed, match="server is busy"):
        fidelity.FidelityLab.tcp(lab, 5)
    refused = (FIXTURES / "iperf3_connect_refused.json").read_text()
    lab = _lab([refused, refused])
    with pytest.raises(ToolFailed):
        fidelity.FidelityLab.tcp(lab, 5)
    assert len(lab.calls) == 1  # not a busy server: no retry


def test_a_failing_check_is_a_failed_row_and_the_next_still_runs():
    checks = fidelity._Checks()

    def fails():
        raise ToolFailed("iperf3: unable to receive control message: Connection reset by peer")

    checks.add("TCP goodput at 500 Mbit/s, buffer 1 BDP", "userspace", fails)
    checks.add("queue", "userspace", lambda: [fidelity.Check("queue: x", "userspace", "g", "a", True)])
    assert [c.ok for c in checks] == [False, True]
    assert checks[0].row() == ["TCP goodput at 500 Mbit/s, buffer 1 BDP", "userspace", "a measurement",
                               "the tool failed: iperf3: unable to receive control message: Connection reset by peer",
                               "FAIL"]
