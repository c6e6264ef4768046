"""No escape sequence reaches the operator's terminal, and no markup in anyone's text crashes a command (issue 33,
item 6).

A results database is written by whoever ran the run, maybe on another machine: every string in it (the
scenario's name and overrides, a status reason, a trial's reason, a configuration's labels, a stored process
name in the machine-load note, the fingerprint's facts, a baseline's name) is made hostile here, with an escape
sequence, a C1 control, a bell, a bidirectional override and rich markup that does not parse (``[/x]``). Every
command that reads the database runs through the CLI as a user runs it, piped and in a terminal (a pty, where
rich writes its own colours): each ends as usual, and none of the hostile characters reaches its output but as
a visible escape.
"""

from __future__ import annotations

import io
import json
import os
import pty
import select
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.markup import escape

from helpers import ROOT, cli, tree_state
from vnetbench.console import SafeConsole, TerminalText, clean
from vnetbench.report.html_synthetic import make_run
from vnetbench.store.db import Store

# ESC and a C1 CSI each followed by a marker rich never writes after them; BEL; RLO; markup that does not parse
HOSTILE = "[/x]\x1bZQ1\x9bZQ2\x07Z\u202eQ3[bold]"
RAW = ("\x1bZQ", "\x9bZQ", "\x07", "\u202e")
RUNS = ("hostile00001", "hostile00002")


def _hostile(value):
    """`value` with HOSTILE appended to every string in it (keys too)."""
    if isinstance(value, str):
        return value + HOSTILE
    if isinstance(value, list):
        return [_hostile(v) for v in value]
    if isinstance(value, dict):
        return {_hostile(k) if isinstance(k, str) and k != "machine_load" else k: _hostile(v) for k, v in value.items()}
    return value


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("hostile") / "shared.db"
    load = {"monitored_s": 30.0, "load_at_start": [0.1], "load_max": [2.5], "load_at_end": [1.0],
            "other_processes_cores": 1.8, "busy_processes": [{"pid": 4242, "command": "evil" + HOSTILE, "cores": 1.5}],
            "concurrent_runs": [{"run_id": "other" + HOSTILE, "pid": 1, "scenario": HOSTILE}]}
    with Store(path) as store:
        for i, run in enumerate(RUNS):
            make_run(store, run, matrix={"proto": ["udp", "tcp"]}, repetitions=3, duration_s=2, seed=i,
                     series=False, fail_every=4, fingerprint={"machine_load": [load]})
    with sqlite3.connect(path) as conn:
        for run_id, fp in conn.execute("SELECT id, fingerprint FROM runs").fetchall():
            fp = json.loads(fp)
            fp = {**_hostile({k: v for k, v in fp.items() if k != "machine_load"}), "machine_load": fp["machine_load"]}
            conn.execute("UPDATE runs SET scenario_name = ?, scenario_source = ?, overrides = ?, status = 'failed', "
                         "status_reason = ?, fingerprint = ? WHERE id = ?",
                         ("congestion" + HOSTILE, "x.toml" + HOSTILE, json.dumps([f"bottleneck={HOSTILE}"]),
                          HOSTILE, json.dumps(fp), run_id))
        for run_id, key, labels in conn.execute("SELECT run_id, key, labels FROM configurations").fetchall():
            conn.execute("UPDATE configurations SET labels = ?, stop_reason = ? WHERE run_id = ? AND key = ?",
                         (json.dumps({k: v + HOSTILE for k, v in json.loads(labels).items()}), HOSTILE, run_id, key))
        conn.execute("UPDATE trials SET reason = ? WHERE status != 'ok'", (HOSTILE,))
        conn.execute("INSERT INTO baselines VALUES (?, ?, 0)", ("nightly" + HOSTILE, RUNS[0]))
    return path


def _readers(db: Path, tmp: Path) -> list[list[str]]:
    d = ["--db", str(db)]
    return [["runs", *d], ["show", RUNS[0], *d], ["show", RUNS[0], "--detail", *d], ["compare", *RUNS, *d],
            ["history", "--metric", "throughput.rx_mbps", *d], ["baseline", "list", *d],
            ["report", RUNS[0], "-o", str(tmp / "r.html"), *d], ["compare", *RUNS, "--report", str(tmp / "c.html"), *d]]


def _assert_clean(argv, text: str) -> None:
    for raw in RAW:
        assert raw not in text, (argv, raw, text[:3000])


def test_every_reader_of_a_hostile_database_prints_no_control_character(db, tmp_path):
    seen = ""
    others = lambda: {k: v for k, v in tree_state(db.parent).items() if not k.startswith(("shared.db", "."))}
    before = others()
    for argv in _readers(db, tmp_path):
        proc = cli(*argv, check=False)
        assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, (argv, proc.stderr[-3000:])
        _assert_clean(argv, proc.stdout + proc.stderr)
        seen += proc.stdout + proc.stderr
    # the hostile strings were shown, as text: a process's name in the machine-load note among them
    assert "\\x1bZQ1" in seen and "\\x9bZQ2" in seen and "\\u202eQ3" in seen and "[/x]" in seen
    assert "evil[/x]\\x1bZQ1" in seen
    assert others() == before  # nothing made beside the database


def _in_a_terminal(*args: str) -> tuple[int, str]:
    """`vnetbench ARGS` with its standard output and error on a terminal (a pty), as an operator sees it."""
    main, side = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "vnetbench", *args], stdout=side, stderr=side,
                            stdin=subprocess.DEVNULL, cwd=ROOT, env={**os.environ, "COLUMNS": "200", "TERM": "xterm"})
    os.close(side)
    chunks: list[bytes] = []

    def drain():
        while True:
            ready, _, _ = select.select([main], [], [], 120)
            if not ready:
                return
            try:
                data = os.read(main, 65536)
            except OSError:  # EIO: the other side closed
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain)
    reader.start()
    status = proc.wait(timeout=300)
    reader.join(timeout=30)
    os.close(main)
    return status, b"".join(chunks).decode("utf-8", "replace")


def test_in_a_terminal_rich_keeps_its_colours_and_the_database_none_of_its_escapes(db, tmp_path):
    for argv in (["show", RUNS[0]], ["runs"], ["export", RUNS[0], "--format", "csv"]):
        status, text = _in_a_terminal(*argv, "--db", str(db))
        assert status == 0 and "Traceback" not in text, (argv, text[-3000:])
        _assert_clean(argv, text)
        assert "ZQ1" in text, (argv, text[:2000])
    status, text = _in_a_terminal("show", RUNS[0], "--db", str(db))
    assert "\x1b[" in text  # rich's own styles still reach the terminal


def test_markup_in_a_label_does_not_crash_the_progress_bar_or_the_trial_line(tmp_path):
    """A trial's line and the progress bar's description carry the configuration's labels and the trial's
    reason: rich markup in them (`[/x]`) once ended `run` after `plan` had passed."""
    from vnetbench.runner.run import _progress, _Tally, _TrialRunner

    stream = io.StringIO()
    console = SafeConsole(file=stream, force_terminal=True, width=120)
    with Store(tmp_path / "r.db") as store:
        make_run(store, "markup000001", matrix={"proto": ["udp"]}, repetitions=1, duration_s=2, series=False)
        bench = SimpleNamespace(unavailable=lambda config: (HOSTILE, {}), after_trial=lambda outcome: None)
        with _progress(console, True) as bar:
            runner = _TrialRunner(bench, store, "markup000001", console, bar, _Tally(), None)
            runner.task = bar.add_task("starting", total=1)
            config = SimpleNamespace(label_text="proto=" + HOSTILE, key="k")
            assert runner(SimpleNamespace(config=config, repetition=0, position=0, warmup=False)) == "failed"
            bar.refresh()
    _assert_clean("run", stream.getvalue())
    assert "proto=[/x]\\x1bZQ1" in stream.getvalue()


def test_the_console_cleans_text_from_anywhere_and_keeps_its_own_codes():
    assert clean("a\x1b[2Jb\tc\nd\x7f\x85\u202e") == "a\\x1b[2Jb\tc\nd\\x7f\\x85\\u202e"
    stream = io.StringIO()
    console = SafeConsole(file=stream, force_terminal=True, color_system="standard", highlight=False)
    console.print("[red]" + escape("x\x1b]0;title\x07") + "[/]", "[/unbalanced]", "\x9b2J")
    text = stream.getvalue()
    assert "\x1b[31m" in text and "\x1b]0" not in text and "\x9b" not in text
    assert "x\\x1b]0;title" in text and "\x07" not in text and "[/unbalanced]" in text  # rich drops BEL itself
    fake = io.StringIO()
    fake.isatty = lambda: True  # type: ignore[method-assign]
    TerminalText(fake).write("a\x1bb")
    piped = io.StringIO()
    TerminalText(piped).write("a\x1bb")
    assert fake.getvalue() == "a\\x1bb" and piped.getvalue() == "a\x1bb"  # a file or pipe gets the data as it is
