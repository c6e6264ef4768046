"""Signals and atomic(): an interruption never lands inside a block, and is never lost."""

import os
import signal
import subprocess
import threading

import pytest

from vnetbench.lab.teardown import Interrupted, atomic, interruptible, start_process


def test_signal_inside_atomic_is_raised_when_the_outermost_block_ends():
    # Directed at this thread, which blocks it: a process-directed kill may go to any other thread (numpy's
    # OpenBLAS workers are such threads), whose handler can run after the block on a busy machine, which is
    # correct but another test's subject (the next one).
    reached = []
    with pytest.raises(Interrupted) as caught, interruptible():
        with atomic():
            with atomic():
                signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)
                reached.append("inner body finished")
            reached.append("outer body finished")  # the inner block's end must not raise yet
        reached.append("after the block")  # never: Interrupted comes at the outermost end
    assert reached == ["inner body finished", "outer body finished"]
    assert caught.value.signame == "SIGTERM"


def test_signal_delivered_to_another_thread_still_waits_for_the_main_threads_block():
    # The kernel may hand a process-directed signal to any thread that does not block it; Python then
    # runs the handler in the main thread at once. The deferral must hold there too.
    ready, go = threading.Event(), threading.Event()

    def other():
        ready.set()
        go.wait(5)
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)  # to this thread, which does not block it

    t = threading.Thread(target=other)
    t.start()
    steps = []
    with pytest.raises(Interrupted) as caught, interruptible():
        with atomic():
            ready.wait(5)
            go.set()
            t.join(5)
            for _ in range(1000):  # give the handler every chance to run inside the block
                steps.append(1)
            steps.append("done")
    assert steps[-1] == "done" and caught.value.signame == "SIGINT"


def test_without_a_signal_atomic_raises_nothing_and_leaves_no_state():
    with interruptible():
        with atomic():
            pass
        with atomic():
            pass
    # A later signal outside any block is raised immediately.
    with pytest.raises(Interrupted), interruptible():
        os.kill(os.getpid(), signal.SIGINT)
        signal.pthread_sigmask(signal.SIG_SETMASK, set())  # delivery point
        for _ in range(1000):
            pass


def test_a_signal_at_any_early_moment_of_the_command_is_one_line_and_exit_130():
    """Imports, argument parsing, scenario checks: SIGINT or SIGTERM there ends `vnetbench` with one line
    and status 130; before the fix 7 of 40 ended with -2 (CPython's exit for a KeyboardInterrupt it saw
    pass through C code, even though caught) and one with a traceback."""
    import random
    import subprocess
    import sys
    import time

    from helpers import ROOT

    def interpreter_start() -> float:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import vnetbench"], cwd=ROOT, check=True)
        return time.perf_counter() - t0

    # The interpreter's own start (site-packages, then vnetbench's package) is not ours to answer for: about
    # 15 ms on a quiet machine, 80 ms and more beside other work. Measured here, now, and kept out of reach.
    floor = max(0.05, 3 * max(interpreter_start() for _ in range(3)))
    rng = random.Random(7)
    for i in range(24):
        sig = (signal.SIGINT, signal.SIGTERM)[i % 2]
        proc = subprocess.Popen([sys.executable, "-m", "vnetbench", "plan", "congestion"], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        at = floor + rng.uniform(0, 0.55)
        time.sleep(at)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
        where = f"{sig.name} at {at:.2f} s"
        assert proc.returncode in (0, 130), f"{where}: exit {proc.returncode}\n{err[-1500:]}"
        assert "Traceback" not in err, f"{where}: {err[-1500:]}"
        if proc.returncode == 130:
            assert len(err.strip().splitlines()) == 1 and "interrupted" in err, f"{where}: {err}"


def test_a_stop_handed_back_by_c_code_as_another_exception_is_still_the_stop(monkeypatch, capsys):
    """pybind11 modules (scipy's HiGHS among them) turn an exception raised while their initialisation calls
    back into Python into `ImportError: initialization failed`, caused by it: CI once saw a SIGTERM during
    `scipy.stats`'s first import end in that traceback and exit 1."""
    from vnetbench import cli
    from vnetbench.lab.teardown import interruption_behind

    def wrapped_stop():
        try:
            raise Interrupted("SIGTERM", lab_up=False)
        except Interrupted as stop:
            raise ImportError("initialization failed") from stop

    with pytest.raises(ImportError) as caught:
        wrapped_stop()
    assert interruption_behind(caught.value).signame == "SIGTERM"
    assert interruption_behind(ValueError("a bug")) is None  # this process never called exit_after_stop

    def command(_args):
        wrapped_stop()

    monkeypatch.setattr(cli, "cmd_runs", command)
    assert cli.main(["runs"]) == 130
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "interrupted (SIGTERM)" in lines[0], lines

    def bug(_args):
        raise ValueError("a bug")

    monkeypatch.setattr(cli, "cmd_runs", bug)
    with pytest.raises(ValueError):  # anything else is still a bug with its traceback
        cli.main(["runs"])


# A process started inside atomic() can be stopped by SIGTERM (children_take_signals).
STOP_BITS = (1 << (signal.SIGINT - 1)) | (1 << (signal.SIGTERM - 1))


def _blocked(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("SigBlk:"):
            return int(line.split()[1], 16)
    raise AssertionError("no SigBlk line")


def _started(spawn) -> tuple[subprocess.Popen, int]:
    with atomic():
        proc = spawn(["sleep", "30"], stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        return proc, _blocked(proc.pid)
    except BaseException:
        proc.kill()
        raise


def test_plain_popen_inside_atomic_inherits_the_block():
    """What the fix is for: without it, the child ignores SIGTERM."""
    proc, blocked = _started(subprocess.Popen)
    proc.kill()
    proc.wait()
    assert blocked & STOP_BITS == STOP_BITS


def test_start_process_inside_atomic_takes_sigterm():
    proc, blocked = _started(start_process)
    assert blocked & STOP_BITS == 0
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=5) == -signal.SIGTERM


def test_atomic_still_blocks_the_parent_after_a_start():
    with atomic():
        start_process(["true"]).wait()
        assert signal.pthread_sigmask(signal.SIG_BLOCK, set()) >= {signal.SIGINT, signal.SIGTERM}
    assert not signal.pthread_sigmask(signal.SIG_BLOCK, set()) & {signal.SIGINT, signal.SIGTERM}


def test_a_signal_pending_when_start_process_unblocks_still_waits_for_the_block():
    started = []
    with pytest.raises(Interrupted), interruptible():
        with atomic():
            signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)  # pending: blocked here
            started.append(start_process(["true"]))  # unblocked for the start: the handler defers it
            started[0].wait()
    assert len(started) == 1


def _shell_group(script: str) -> subprocess.Popen:
    return start_process(["sh", "-c", script], start_new_session=True)


def _group_gone(pgid: int, within: float = 5.0) -> bool:
    """No process left in the group (a killed child stays a zombie until init reaps it: waited for)."""
    import time

    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_stop_groups_ends_each_group_by_sigterm_and_kills_one_that_ignores_it():
    """The one way started processes are stopped: a group that takes SIGTERM ends at once (its children with
    it); one that ignores SIGTERM is killed after the grace, and none is reported as stubborn."""
    import time

    from vnetbench.lab.teardown import stop_groups

    polite = _shell_group("sleep 60 & wait")
    deaf = _shell_group("trap '' TERM; sleep 60 & wait")
    time.sleep(0.3)  # both shells have started their child and set their trap
    started = time.monotonic()
    assert stop_groups([polite, deaf], grace=1.0) == []
    took = time.monotonic() - started
    assert polite.returncode == -signal.SIGTERM and deaf.returncode == -signal.SIGKILL
    assert 0.9 <= took < 4.0  # one grace for all, not one each
    assert _group_gone(polite.pid) and _group_gone(deaf.pid)  # the sleeps went with their shells
    assert stop_groups([polite, deaf]) == []  # ended ones: nothing to do
