"""A trial starts when its servers hold no connection of the trial before (runner/bench.held_connections), read
from `ss -Htan` recorded on an iperf3 server's namespace during two tests (TCP on 5201 over IPv4, UDP on 5202
over IPv6: each test's control connection, TCP's data stream) and just after both had ended."""

from __future__ import annotations

from pathlib import Path

from vnetbench.runner.bench import held_connections

FIXTURES = Path(__file__).parent.parent / "fixtures"
DURING = (FIXTURES / "ss_tan_iperf3_servers_during_tests.txt").read_text()
AFTER = (FIXTURES / "ss_tan_iperf3_servers_after_tests.txt").read_text()


def test_a_server_in_a_test_holds_its_connections():
    held = held_connections(DURING, {5201, 5202})
    assert held == ["ESTAB [::ffff:198.18.200.1]:5201 [::ffff:198.18.200.2]:54456",
                    "ESTAB [::ffff:198.18.200.1]:5201 [::ffff:198.18.200.2]:54462",
                    "ESTAB [2001:2:ff::1]:5202 [2001:2:ff::2]:52028"]
    assert held_connections(DURING, {5202}) == ["ESTAB [2001:2:ff::1]:5202 [2001:2:ff::2]:52028"]


def test_listening_sockets_and_other_ports_are_not_held():
    assert held_connections(DURING, {5203}) == []
    assert held_connections("LISTEN 0 4096 *:5201 *:*\n", {5201}) == []


def test_a_server_that_closed_its_side_is_free():
    # iperf3's server closes the control connection first: its side waits in TIME-WAIT, free for the next test.
    assert "TIME-WAIT" in AFTER
    assert held_connections(AFTER, {5201, 5202}) == []
    # A client that closed while the server still reads (CLOSE-WAIT), or one being accepted, is held.
    assert held_connections("CLOSE-WAIT 0 0 198.18.0.2:5201 198.18.0.3:40000\n"
                            "SYN-RECV 0 0 [2001:2::1]:5201 [2001:2::2]:40002\n", {5201}) == [
        "CLOSE-WAIT 198.18.0.2:5201 198.18.0.3:40000", "SYN-RECV [2001:2::1]:5201 [2001:2::2]:40002"]
