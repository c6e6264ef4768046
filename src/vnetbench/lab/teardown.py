"""Teardown you can trust: everything is registered the moment it exists and
undone in reverse order, on success, on error and on SIGINT/SIGTERM.

Signals: the first Ctrl-C (or SIGTERM) raises :class:`Interrupted` in the main
thread so the run unwinds through its ``finally`` blocks. While teardown runs,
further signals only print that cleaning is in progress: a second Ctrl-C must
not leave half a lab behind. Inside :func:`atomic` the exception waits until the
block ends: a thing that exists is registered before the run unwinds, and no
library is left half-way through a call (pyroute2 runs an asyncio loop for each
netlink request; an exception raised into that loop leaves it waiting forever).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator


class Interrupted(BaseException):
    """Raised in the main thread when the user (or a supervisor) asks the run to stop.

    ``lab_up``: the signal came while a lab existed (it is torn down as this unwinds), or outside one
    (checks before it, bookkeeping after it: nothing to tear down). Not a KeyboardInterrupt: CPython
    remembers a KeyboardInterrupt that passed through certain C calls and, at exit, kills the process with
    SIGINT (exit -2) even when Python code caught it, which would replace the exit status the CLI gives."""

    def __init__(self, signame: str, lab_up: bool = True):
        super().__init__(signame)
        self.signame = signame
        self.lab_up = lab_up


# Main-thread state of atomic(): how deep, and the signals that arrived inside (Python runs signal
# handlers in the main thread only, so this is the only thread they can interrupt).
_atomic_depth = 0
_deferred: list[str] = []
# A process that exits once its run stops (the CLI) keeps later signals harmless from the first stop on:
# a second Ctrl-C after teardown, while the run's end is stored and the message printed, must not turn
# into a KeyboardInterrupt (or SIGINT's exit) half-way through that.
_exit_after_stop = False
_stopping = False
# In such a process, the first Interrupted a signal raised: C code it passed through may hand it back as
# another exception (see interruption_behind). Kept only there: a library or test process goes on after a
# stop, and a later exception of its own is not that stop.
_raised: Interrupted | None = None


def exit_after_stop() -> None:
    """Declare this process one that exits when its run stops (the `vnetbench` command, not libraries or
    tests). Outside a lab, the first SIGINT or SIGTERM raises Interrupted(lab_up=False) (the CLI says so in
    one line and exits 130: nothing is up to tear down) and later ones only say the stop is under way."""
    global _exit_after_stop
    _exit_after_stop = True

    def outside_lab(signum: int, _frame: object) -> None:
        global _stopping
        if _stopping:
            _while_stopping(signum, _frame)
            return
        _stopping = True
        raise _remember(Interrupted(signal.Signals(signum).name, lab_up=False))

    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, outside_lab)
    sys.unraisablehook = _deliver_again(sys.unraisablehook)


def _deliver_again(previous: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """An unraisablehook that does not let a stop be lost. Python runs a signal's handler wherever the main
    thread is; in a weakref callback or a destructor (importlib's module-lock callback, in the first tenth of
    a second) the Interrupted it raises cannot propagate, and Python prints it as "Exception ignored" and goes
    on: the command would finish as if never asked to stop. The signal is sent again instead, to be handled
    where Python can raise (CI's early-signal campaign saw 2 of 300 stops lost so before this)."""

    def hook(unraisable: Any) -> None:
        global _stopping
        stop = unraisable.exc_value
        if not isinstance(stop, Interrupted):
            previous(unraisable)
            return
        _stopping = False  # the stop did not happen: its handler must raise it again, not say it is under way
        # From another thread, a moment later: sent from here, the handler would run at once, still inside
        # this hook, whose exceptions are ignored in turn.
        again = threading.Timer(0.01, os.kill, (os.getpid(), signal.Signals[stop.signame]))
        again.daemon = True
        again.start()

    return hook


def _interrupt(name: str) -> Interrupted:
    global _stopping
    _stopping = _exit_after_stop
    return _remember(Interrupted(name))


def _remember(stop: Interrupted) -> Interrupted:
    global _raised
    if _exit_after_stop and _raised is None:
        _raised = stop
    return stop


def interruption_behind(exc: BaseException) -> Interrupted | None:
    """The stop that `exc` is or comes from, if any. A signal's exception raised while C code runs Python
    (an extension module's initialisation calling back into the import system, a library's callback) can
    come back as another exception: pybind11 turns it into `ImportError: initialization failed` with the
    Interrupted as its cause. Such an exception is the interruption, not a failure to report as a bug. The
    chain is searched first; when the C code dropped it, an exception escaping the `vnetbench` command
    after a signal raised its Interrupted there is still that stop."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        if isinstance(link, Interrupted):
            return link
        seen.add(id(link))
        link = link.__cause__ or link.__context__
    return _raised


def _while_stopping(_signum: int, _frame: object) -> None:
    print("\nvnetbench: stopping, please wait...", file=sys.stderr, flush=True)


def _restore(old: dict) -> None:
    for s, h in old.items():
        signal.signal(s, _while_stopping if _stopping else h)


@contextmanager
def interruptible() -> Iterator[None]:
    """Turn SIGINT/SIGTERM into Interrupted for the duration of the body (at the end of an atomic block
    when one is open)."""

    def handler(signum: int, _frame: object) -> None:
        name = signal.Signals(signum).name
        if _atomic_depth:
            _deferred.append(name)
            return
        raise _interrupt(name)

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        _restore(old)


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
        _restore(old)


@contextmanager
def atomic() -> Iterator[None]:
    """Hold SIGINT/SIGTERM off for the body: across create-and-register, so an interruption can never
    fall between a thing existing and teardown knowing about it (or leave this thread inside another
    namespace), and around calls into libraries that must not be interrupted half-way.

    Two layers: the signals are blocked in this thread (so their default action, before any handler is
    installed, cannot kill the process half-way either), and in the main thread an :class:`Interrupted`
    from :func:`interruptible` is deferred to the end of the outermost block, which covers a signal the
    kernel delivered to another thread.
    """
    global _atomic_depth
    main = threading.current_thread() is threading.main_thread()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    if main:
        _atomic_depth += 1
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)  # a blocked signal's handler runs here, deferred
        if main:
            _atomic_depth -= 1
            if _atomic_depth == 0 and _deferred:
                name = _deferred[0]
                _deferred.clear()
                raise _interrupt(name)


@contextmanager
def children_take_signals() -> Iterator[None]:
    """Inside :func:`atomic`: processes started in the body can be stopped by SIGTERM and SIGINT.

    A child inherits its parent's blocked signals across fork and exec, and atomic() blocks SIGINT/SIGTERM in
    this thread: a process started there would ignore every SIGTERM sent to stop it, and end only by SIGKILL
    after its grace (every link emulator did: 2 s per restart, and never wrote its final counters). The body
    runs with them unblocked; atomic()'s second layer still defers the main thread's Interrupted to the end of
    the block, so a started process is registered before the run unwinds."""
    old = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def start_process(argv: list[str], **popen: Any) -> subprocess.Popen:
    """subprocess.Popen for a process started inside :func:`atomic` (see :func:`children_take_signals`)."""
    with children_take_signals():
        return subprocess.Popen(argv, **popen)


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
        for p in stop_groups(live, grace, kill_wait=2.0):
            self.errors.append(f"process {p.pid} ({' '.join(map(str, p.args))[:80]}) would not die")
        for p in live:
            # The leader may have gone while others of its group linger (a server's workers busy with a
            # connection whose link is gone): nothing of the group may outlive the lab.
            _signal_group(p, signal.SIGKILL)
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


def wait_metered(p: subprocess.Popen, timeout: float | None = None) -> int:
    """``p.wait(timeout)``, reaping with wait4 so that what the process used is kept on it: ``cpu_s``, its
    user + system CPU seconds with its reaped descendants' (getrusage's RUSAGE_CHILDREN share of it; ``ip
    netns exec`` and taskset exec the tool, so it is the tool's), and ``ended_at`` (time.time() when reaped,
    within 50 ms of its end). Subprocess's own wait throws the rusage away."""
    if p.returncode is not None or not isinstance(p, subprocess.Popen):
        return p.wait(timeout=timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = 0.0005
    while True:
        try:
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
        except ChildProcessError:  # reaped meanwhile by another thread's poll(): its status is there
            return p.wait(0)
        if pid:
            p.returncode = os.waitstatus_to_exitcode(status)
            p.cpu_s = usage.ru_utime + usage.ru_stime  # type: ignore[attr-defined]
            p.ended_at = time.time()  # type: ignore[attr-defined]
            return p.returncode
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise subprocess.TimeoutExpired(p.args, timeout or 0.0)
        time.sleep(delay if left is None else min(delay, left))
        delay = min(2 * delay, 0.05)


def poll_metered(p: subprocess.Popen) -> int | None:
    """``p.poll()`` that keeps what the process used, as :func:`wait_metered` does."""
    try:
        return wait_metered(p, timeout=0.0)
    except subprocess.TimeoutExpired:
        return None


def stop_groups(procs: Iterable[subprocess.Popen], grace: float = 2.0,
                kill_wait: float = 5.0) -> list[subprocess.Popen]:
    """Stop started processes the one way vnetbench stops them: SIGTERM to each one's process group (a tool
    writes its final numbers, the emulator its stats), SIGKILL to a group whose leader has not ended `grace`
    seconds later (one deadline for all); returns those that outlived even that (`kill_wait` more seconds)."""
    live = [p for p in procs if poll_metered(p) is None]
    for p in live:
        _signal_group(p, signal.SIGTERM)
    deadline = time.monotonic() + grace
    stubborn = []
    for p in live:
        try:
            wait_metered(p, timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(p, signal.SIGKILL)
            try:
                wait_metered(p, timeout=kill_wait)
            except subprocess.TimeoutExpired:
                stubborn.append(p)
    return stubborn


def kill_group(p: subprocess.Popen) -> None:
    """SIGKILL to a started process and everything in its process group."""
    _signal_group(p, signal.SIGKILL)


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    # Children run in their own session (start_new_session=True), so the group
    # id is their pid and the whole tree (ip netns exec -> taskset -> tool) goes.
    try:
        os.killpg(p.pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        p.send_signal(sig)
