"""The `vnetbench` command's entry point: the CLI imported inside a guard, so that a Ctrl-C while Python is
still importing (half a second of numpy, pydantic and rich) ends with one line, not a traceback."""

import signal
import sys


def _stop_while_importing(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main() -> int:
    signal.signal(signal.SIGTERM, _stop_while_importing)  # SIGINT already raises KeyboardInterrupt
    try:
        from vnetbench.cli import main as cli_main
        from vnetbench.lab.teardown import exit_after_stop
    except KeyboardInterrupt:
        sys.stderr.write("vnetbench: interrupted before it started; nothing was done\n")
        return 130
    exit_after_stop()  # this process ends when a run stops: a second Ctrl-C must not cut its ending short
    try:
        return cli_main()
    finally:
        # Exiting now: Python's finalisation puts SIGINT's default action (death by the signal, exit -2) back
        # for a moment, so a Ctrl-C then would replace the status and message given. Ignored signals stay so.
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, signal.SIG_IGN)
