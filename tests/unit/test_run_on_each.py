"""lab.nodes.run_on_each: one command on several nodes at once, each answer (or what its run() raised) in the
nodes' order. Concurrency is held by a barrier every node's run() must pass together, not by a time bound."""

from __future__ import annotations

import subprocess
import threading

import pytest

from vnetbench.lab.nodes import RunsCommands, run_on_each


class Node(RunsCommands):
    def __init__(self, name: str, barrier: threading.Barrier | None, fails: BaseException | None = None):
        self.name, self.barrier, self.fails = name, barrier, fails

    def run(self, argv, timeout=10.0, pin=False):
        if self.barrier is not None:
            self.barrier.wait(timeout=10)  # BrokenBarrierError unless all the nodes run at once
        if self.fails is not None:
            raise self.fails
        return subprocess.CompletedProcess(list(argv), 0, f"{self.name}: {' '.join(argv)}", "")


def test_every_node_runs_at_once_and_answers_in_order():
    barrier = threading.Barrier(3)
    nodes = [Node(n, barrier) for n in ("r", "s1", "s2")]
    done = run_on_each(nodes, ["ip", "tcp_metrics", "flush", "all"])
    assert [d.stdout for d in done] == [f"{n}: ip tcp_metrics flush all" for n in ("r", "s1", "s2")]


def test_what_a_node_raised_is_its_answer_and_the_others_still_answer():
    barrier = threading.Barrier(2)
    late = subprocess.TimeoutExpired(["x"], 30)
    done = run_on_each([Node("r", barrier), Node("s1", barrier, fails=late)], ["x"])
    assert done[0].returncode == 0 and done[1] is late


@pytest.mark.parametrize("count", [0, 1])
def test_no_thread_for_fewer_than_two_nodes(count):
    nodes = [Node("r", None, fails=OSError("gone"))][:count]
    done = run_on_each(nodes, ["x"])
    assert len(done) == count and all(isinstance(d, OSError) for d in done)
