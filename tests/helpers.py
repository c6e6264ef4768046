"""Helpers for tests: run the CLI as a user would."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str, check: bool = True, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """`vnetbench ARGS` in a subprocess, like a user at a shell."""
    proc = subprocess.run([sys.executable, "-m", "vnetbench", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)
    if check and proc.returncode != 0:
        raise AssertionError(f"vnetbench {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def run_id_of(proc: subprocess.CompletedProcess) -> str:
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("run: "), f"last stdout line is not 'run: ID': {last!r}"
    return last.split()[1]
