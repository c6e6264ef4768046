"""Teardown you can trust: everything is registered the moment it exists and
undone in reverse order, on success, on error and on SIGINT/SIGTERM.

Signals: the first Ctrl-C (or SIGTERM) raises :class:`Interrupted` in the main
thread so the run unwinds through its ``finally`` blocks. While teardown runs,
further signals only print that cleaning is in progress: a second Ctrl-C must
not leave half a lab behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator


class Interrupted(BaseException):
    """Raised in the main thread when the user (or a supervisor) asks the run to stop."""

    def __init__(self, signame: str):
        super().__init__(signame)
        self.signame = signame


@contextmanager
def interruptible() -> Iterator[None]:
    """Turn SIGINT/SIGTERM into Interrupted for the duration of the body."""

    def handler(signum: int, _frame: object) -> None:
        raise Interrupted(signal.Signals(signum).name)

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextmanager
def shielded() -> Iterator[list[str]]:
    """Hold SIGINT/SIGTERM off while cleaning up; report what arrived afterwards."""
    received: list[str] = []

    def handler(signum: int, _frame: object) -> None:
        received.append(signal.Signals(signum).name)
        print("\nvnetbench: still tearing the lab down, please wait...", file=sys.stderr, flush=True)

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextmanager
def atomic() -> Iterator[None]:
    """Hold signals off across create-and-register, so an interruption can never
    fall between a thing existing and teardown knowing about it (or leave this
    thread inside another namespace). Pending signals arrive at the end."""
    blocked = {signal.SIGINT, signal.SIGTERM}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


@dataclass
class Registry:
    """What a lab created, with how to undo each piece (LIFO)."""

    undo: list[tuple[str, Callable[[], None]]] = field(default_factory=list)
    processes: list[subprocess.Popen] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def add(self, what: str, undo: Callable[[], None]) -> None:
        self.undo.append((what, undo))

    def add_process(self, proc: subprocess.Popen) -> None:
        self.processes.append(proc)

    def stop_processes(self, grace: float = 1.0) -> None:
        live = [p for p in self.processes if p.poll() is None]
        for p in live:
            _signal_group(p, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for p in live:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(p, signal.SIGKILL)
                try:
                    p.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    self.errors.append(f"process {p.pid} ({' '.join(map(str, p.args))[:80]}) would not die")
        self.processes = [p for p in self.processes if p.poll() is None]

    def teardown(self) -> list[str]:
        with shielded():
            self.stop_processes()
            while self.undo:
                what, undo = self.undo.pop()
                try:
                    undo()
                except Exception as e:  # keep going: one failure must not strand the rest
                    self.errors.append(f"removing {what}: {e}")
        return self.errors


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    # Children run in their own session (start_new_session=True), so the group
    # id is their pid and the whole tree (ip netns exec -> taskset -> tool) goes.
    try:
        os.killpg(p.pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        p.send_signal(sig)
