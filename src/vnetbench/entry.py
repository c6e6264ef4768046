"""The `vnetbench` command's entry point: the CLI imported inside a guard, so that a Ctrl-C while Python is
still importing (half a second of numpy, pydantic and rich) ends with one line, not a traceback."""

import sys


def main() -> int:
    try:
        from vnetbench.cli import main as cli_main
    except KeyboardInterrupt:
        sys.stderr.write("vnetbench: interrupted before it started; nothing was done\n")
        return 130
    return cli_main()
