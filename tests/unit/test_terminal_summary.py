"""A summary that fits a terminal (outside review, issue 19, item 4).

`vnetbench show` and `run` print one line per configuration, each metric as benchstat does
("95.78 ±0%", marks for a missing CI, instability and outliers, explained once below), split into
stacked tables rather than cut when the terminal is narrow; `show --detail` gives the full cells.
The last tests run `show` in a real terminal (tmux) at 80 and 100 columns.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from rich.cells import cell_len
from rich.console import Console

from helpers import ROOT, cli
from vnetbench.report.html_synthetic import make_run
from vnetbench.report.relative import show_relative
from vnetbench.report.terminal import PREFERRED, _fmt, compact_cell, show
from vnetbench.stats import summarize
from vnetbench.store.db import Store

QUICK = "synthquick01"  # `quick`'s matrix and 3 repetitions: no CI anywhere
ENVS = "synthenvs001"  # environments next to bare, 8 repetitions with failures: CIs, marks, the relative table


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("terminal") / "vnetbench.db"
    with Store(path) as store:
        make_run(store, QUICK, matrix={"ratio": [0.6, 2.0], "proto": ["udp", "tcp"]}, repetitions=3,
                 name="quick", series=False)
        make_run(store, ENVS, matrix={"ratio": [0.6, 2.0], "proto": ["udp", "tcp"], "env": ["bare", "container"]},
                 repetitions=8, name="virt", series=False, fail_every=7, seed=3)
    return path


def _printed(db: Path, run: str, width: int, detail: bool = False) -> str:
    console = Console(width=width, record=True, highlight=False, soft_wrap=False)
    with Store(db) as store:
        show(store, run, console, detail=detail)
        show_relative(store, run, console, detail=detail)
    return console.export_text()


def _expected_medians(db: Path, run: str) -> list[tuple[list[str], int, list[str]]]:
    """Per configuration: its label values, n and the medians `show` must print whole."""
    out = []
    with Store(db) as store:
        values = store.values(run)
        present = {m for per in values.values() for m in per}
        wanted = [m for m in PREFERRED if m in present]
        for c in store.configurations(run):
            per = values.get(c["key"], {})
            n = max(len(v) for v in per.values())
            out.append(([str(v) for v in c["labels"].values()], n,
                        [_fmt(summarize(per[m]).median) for m in wanted if m in per]))
    return out


def _assert_fits_and_whole(text: str, width: int, db: Path, run: str) -> None:
    lines = text.splitlines()
    wide = [line for line in lines if cell_len(line.rstrip()) > width]
    assert not wide, f"lines wider than {width} columns:\n" + "\n".join(wide)
    assert "…" not in text, text
    for labels, n, medians in _expected_medians(db, run):
        row = re.compile(r"^" + r"\s+".join(re.escape(v) for v in labels) + rf"\s+{n}\s")
        mine = " ".join(line for line in lines if row.match(line))
        assert mine, f"no line for {labels} in\n{text}"
        for median in medians:
            # the whole number, then its uncertainty: a cut value ("60.0…") or a folded cell cannot match
            assert re.search(rf"(^|\s){re.escape(median)} ±", mine), (labels, median, text)
    assert text.count("median ±X%") == 1  # the legend, once below every stacked table


# ------------------------------------------------------------------ the compact cell


def test_compact_cell_is_benchstats_median_and_relative_ci():
    # n = 6: the exact 95% CI is [min, max] = [95.70, 95.86]; its larger side 0.08 is 0.08% of 95.78
    assert compact_cell(np.array([95.70, 95.74, 95.77, 95.79, 95.82, 95.86])) == "95.78 ±0%"
    # the larger side of an asymmetric interval: [94, 102] around 100 is ±6%, and 94 is beyond the fences
    assert compact_cell(np.array([94.0, 99.0, 100.0, 100.0, 101.0, 102.0])) == "100.0 ±6% *"
    assert compact_cell(np.array([10.0, 10.5, 11.0, 11.0, 11.5, 12.0])) == "11.00 ±9%"


def test_compact_cell_marks_missing_ci_instability_and_outliers():
    assert compact_cell(np.array([60.0, 60.1, 59.9])) == "60.00 ±?"  # n = 3: no CI, one mark, no words
    assert compact_cell(np.array([50.0, 95.0, 60.0, 90.0, 300.0])) == "90.00 ±? !*"  # CV >= 10%, one outlier
    assert compact_cell(np.array([0.0] * 6)) == "0.000 ±0%"
    assert compact_cell(np.array([0.0, 0.0, 0.0, 0.0, 0.1, 0.2])) == "0.000 ±∞ !*"  # relative to 0: unbounded
    assert compact_cell(np.array([90.0, 92.0, 94.0, 96.0]), row_n=5) == "93.00 ±? n=4"  # the metric's own n
    assert compact_cell(np.array([90.0, 92.0, 94.0, 96.0]), row_n=4) == "93.00 ±?"


# ------------------------------------------------------------------ the table


def test_show_prints_one_line_per_configuration_and_the_legend_once(db):
    text = _printed(db, QUICK, 200)
    assert "n too small" not in text and "theory" in text
    _assert_fits_and_whole(text, 200, db, QUICK)
    rows = [line for line in text.splitlines() if re.match(r"^(0\.6|2\.0)\s+(udp|tcp)\s+3\s", line)]
    assert len(rows) == 4  # one table at 200 columns, one line per configuration
    assert "? no CI: fewer than 6 trials" in text and "! unstable" in text


@pytest.mark.parametrize("width", [60, 80, 100, 160])
@pytest.mark.parametrize("run", [QUICK, ENVS])
def test_narrow_consoles_get_stacked_tables_not_cut_cells(db, run, width):
    text = _printed(db, run, width)
    _assert_fits_and_whole(text, width, db, run)


def test_medians_and_uncertainties_line_up(db):
    text = _printed(db, ENVS, 200)
    rows = [line for line in text.split("relative to env=bare")[0].splitlines()
            if re.match(r"^(0\.6|2\.0)\s+(udp|tcp)\s+(bare|container)\s+\d", line)]
    assert len(rows) == 8
    for proto in ("udp", "tcp"):  # the same metrics on each line of a protocol: "±" in the same places
        at = {tuple(i for i, ch in enumerate(line) if ch == "±") for line in rows if f" {proto} " in line}
        assert len(at) == 1, rows


def test_stacked_tables_repeat_the_labels(db):
    text = _printed(db, QUICK, 60)
    headers = [line for line in text.splitlines() if re.match(r"^ratio\s+proto\s+n\s", line)]
    assert len(headers) >= 2  # several tables, each with the configuration's labels
    assert len([line for line in text.splitlines() if re.match(r"^0\.6\s+udp\s+3\s", line)]) == len(headers)


def test_marks_and_relative_table_of_a_run_with_environments(db):
    text = _printed(db, ENVS, 100)
    assert re.search(r"\d ±\d+%", text)  # 8 repetitions: CIs exist
    assert "* outliers" in text and "relative to env=bare" in text
    relative = text.split("relative to env=bare")[1].splitlines()
    tables = [line for line in relative if re.match(r"^ratio\s+proto\s+environment\s", line)]
    rows = [line for line in relative if re.match(r"^(0\.6|2\.0)\s+(udp|tcp)\s+(bare|container)\s+[-+\d]", line)]
    assert tables and len(rows) == 8 * len(tables)  # one line per configuration in each stacked table


def test_detail_gives_the_full_cells_and_fits_too(db):
    text = _printed(db, QUICK, 80, detail=True)
    assert "n too small" in text and "theory 0.500" in text and "cv " in text
    assert "median below" in _printed(db, ENVS, 80, detail=True)
    assert not [line for line in text.splitlines() if cell_len(line.rstrip()) > 80]
    assert "…" not in text


def test_cli_show_detail_and_json(db, capsys):
    compact = cli("show", QUICK, "--db", str(db)).stdout  # a pipe: 160 columns
    assert "±?" in compact and "n too small" not in compact
    assert max(cell_len(line.rstrip()) for line in compact.splitlines()) <= 160
    detail = cli("show", QUICK, "--detail", "--db", str(db)).stdout
    assert "n too small" in detail and "theory 0.500" in detail
    doc = cli("show", QUICK, "--json", "--db", str(db)).stdout
    assert doc.startswith("{") and '"ci_note": "n too small (need >= 6)"' in doc


# ------------------------------------------------------------------ in a real terminal

TMUX = shutil.which("tmux")


def _in_tmux(args: list[str], width: int, height: int = 50) -> tuple[str, str]:
    """Run `vnetbench ARGS` in a detached tmux terminal of `width` columns; its screen and history, with
    lines tmux wrapped joined (-J) and as displayed."""
    done = "__vnetbench_show_done__"
    command = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "vnetbench", *args])
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "TMUX")}
    home = tempfile.mkdtemp(prefix="vnb-tmux-")  # a server of its own, its socket removed afterwards
    tmux = [TMUX, "-S", os.path.join(home, "socket"), "-f", "/dev/null"]
    try:
        subprocess.run([*tmux, "new-session", "-d", "-x", str(width), "-y", str(height), "-s", "show",
                        f"cd {shlex.quote(str(ROOT))} && {command}; echo {done}; sleep 600"],
                       check=True, env=env, timeout=30)
        subprocess.run([*tmux, "set-option", "-t", "show", "history-limit", "5000"], env=env, timeout=30)
        deadline = time.monotonic() + 60
        while True:
            joined = subprocess.run([*tmux, "capture-pane", "-p", "-J", "-S", "-", "-t", "show"],
                                    capture_output=True, text=True, env=env, timeout=30).stdout
            if done in joined or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        shown = subprocess.run([*tmux, "capture-pane", "-p", "-S", "-", "-t", "show"],
                               capture_output=True, text=True, env=env, timeout=30).stdout
        assert done in joined, joined
        return joined.split(done)[0].rstrip(), shown.split(done)[0].rstrip()
    finally:
        subprocess.run([*tmux, "kill-server"], env=env, timeout=30, capture_output=True)
        shutil.rmtree(home, ignore_errors=True)


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines()]  # -J keeps trailing spaces, a plain capture not


@pytest.mark.skipif(TMUX is None, reason="tmux is not installed (make deps installs it)")
@pytest.mark.parametrize("width", [80, 100])
@pytest.mark.parametrize("run", [QUICK, ENVS])
def test_show_fits_a_real_terminal(db, run, width):
    joined, shown = _in_tmux(["show", run, "--db", str(db)], width)
    # nothing wrapped by the terminal: joining its wrapped lines changes nothing
    assert _lines(joined) == _lines(shown), joined
    _assert_fits_and_whole(joined, width, db, run)
    assert "run " + run in joined  # the command ran in that terminal, not somewhere else


@pytest.mark.skipif(TMUX is None, reason="tmux is not installed (make deps installs it)")
def test_show_detail_fits_a_real_terminal(db):
    joined, shown = _in_tmux(["show", QUICK, "--detail", "--db", str(db)], 80)
    assert _lines(joined) == _lines(shown)
    assert max(cell_len(line.rstrip()) for line in joined.splitlines()) <= 80
    assert "…" not in joined and "n too small" in joined
