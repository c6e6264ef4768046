"""What every command module of the CLI shares: the consoles, the default database and opening it.

``cli`` (run, report, show, ...) and ``cli_analysis`` (compare, baseline, history) both import
this module and not each other's, so neither needs the other at import time.
"""

from __future__ import annotations

import argparse
import sys

from vnetbench.console import SafeConsole

DEFAULT_DB = "vnetbench.db"
EXIT_CLOSED_PIPE = 141  # 128 + SIGPIPE, as the shell reports a process a closed pipe ended


class _Console(SafeConsole):
    def on_broken_pipe(self) -> None:
        # rich would exit 1 without a word; main() says what happened, once, with the pipe's exit status
        self.quiet = True
        raise BrokenPipeError


# Logs and pipes get a wide table rather than rich's 80-column default.
out = _Console(highlight=False, soft_wrap=False, width=None if sys.stdout.isatty() else 160)
# Messages are never wrapped: an error is one line a script or a log can grep.
err = _Console(stderr=True, highlight=False, soft_wrap=True)


def open_store(args: argparse.Namespace, create: bool = False):
    """The results database the command's ``--db`` names (imported here: the store pulls in numpy). Only
    `run` makes one: a command that reads results never leaves an empty database where none was."""
    import shlex
    from pathlib import Path

    from vnetbench.errors import StoreError
    from vnetbench.store.db import Store

    if not create and not Path(args.db).exists():
        raise StoreError(f"{args.db}: no such results database; `vnetbench run SCENARIO --db {shlex.quote(args.db)}` makes one, "
                         "or give the --db of an existing one")
    return Store(args.db, create=create)
