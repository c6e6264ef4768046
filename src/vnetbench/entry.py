"""The `vnetbench` command's entry point: the CLI imported inside a guard, so that a Ctrl-C while Python is
still importing (half a second of numpy, pydantic and rich) ends with one line, not a traceback."""

import os
import signal
import sys


def _stopped_before_start(signum: int, frame: object) -> None:
    # Nothing has been done yet: no lab, no store, no file. One line and 130, at once (no interpreter teardown,
    # which a second signal could turn into a traceback).
    os.write(2, b"vnetbench: interrupted before it started; nothing was done\n")
    os._exit(130)


def main() -> int:
    # At once, with nothing but `signal` imported: until teardown's handlers replace these, a signal ends the
    # command with one line. (Importing teardown itself takes 20-30 ms, most of it `subprocess`; a loaded
    # machine stretches that past the moment a user's Ctrl-C may come.)
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, _stopped_before_start)
    # Then, before the heavy imports (numpy, pydantic, rich: half a second): a signal from now on stops
    # the command with one line, whatever it is doing.
    from vnetbench.lab.teardown import Interrupted, exit_after_stop, interruption_behind

    exit_after_stop()
    try:
        from vnetbench.cli import interrupted, main as cli_main
    except BaseException as e:  # an extension module's import may hand the stop back as an ImportError
        if interruption_behind(e) is None:
            raise
        sys.stderr.write("vnetbench: interrupted before it started; nothing was done\n")
        return _exiting(130)
    try:
        return _exiting(cli_main())
    except Interrupted as e:  # outside cli.main's own handling (its argument parsing)
        interrupted(e)
        return _exiting(130)
    except BaseException as e:  # a stop during a lazy import can come back wrapped (pydantic's class set-up:
        stop = interruption_behind(e)  # RuntimeError "Error calling __set_name__" with the Interrupted behind)
        if stop is None:
            raise
        interrupted(stop)
        return _exiting(130)


def _exiting(status: int) -> int:
    # Python's finalisation puts SIGINT's default action (death by the signal, exit -2) back for a moment,
    # so a Ctrl-C then would replace the status and message given. Ignored signals stay ignored.
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)
    return status
