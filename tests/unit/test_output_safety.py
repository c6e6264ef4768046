"""No output path can lose the results database (outside review, item 1).

Every command that writes a file is run through the CLI, in a subprocess, as a
user would: the database as target is refused with one line and exit 2, the
database still opens with every run in it, and no temporary file is left.
"""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from helpers import ROOT, cli, tree_state
from vnetbench.output import OutputError, output_file, write_text
from vnetbench.report.html_synthetic import make_run
from vnetbench.store.db import Store

RUNS = ("synthsafe001", "synthsafe002")


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("safe") / "vnetbench.db"
    with Store(path) as store:
        for i, run in enumerate(RUNS):
            make_run(store, run, matrix={"proto": ["udp", "tcp"]}, repetitions=4, duration_s=2, seed=i,
                     series=False)
    return path


def _runs_in(path: Path) -> set[str]:
    with sqlite3.connect(path) as conn:
        return {r[0] for r in conn.execute("SELECT id FROM runs")}


def _writers(db: Path, target: str) -> list[list[str]]:
    """Every command that writes a file, aimed at `target`."""
    d = ["--db", str(db)]
    return [
        ["report", RUNS[0], "-o", target, *d],
        ["report", RUNS[0], RUNS[1], "-o", target, *d],
        ["export", RUNS[0], "-o", target, *d],
        ["export", RUNS[0], "--format", "json", "-o", target, *d],
        ["compare", RUNS[0], RUNS[1], "--report", target, *d],
        ["compare", RUNS[0], RUNS[1], "--junit", target, *d],
        ["history", "--metric", "throughput.rx_mbps", "--csv", target, *d],
    ]


def _leftover_temps(directory: Path) -> list[str]:
    return [p.name for p in directory.iterdir() if p.name.endswith(".tmp")]


def test_every_writer_refuses_the_database_in_use(db):
    before = db.read_bytes()
    for argv in _writers(db, str(db)) + [["run", "quick", "--report", str(db), "--db", str(db)]]:
        proc = cli(*argv, check=False)
        assert proc.returncode == 2, (argv, proc.stdout, proc.stderr)
        assert "results database" in proc.stderr, (argv, proc.stderr)
        assert "Traceback" not in proc.stderr
        assert db.read_bytes() == before, argv
    assert _runs_in(db) == set(RUNS)
    assert _leftover_temps(db.parent) == []
    listing = cli("runs", "--db", str(db))
    assert all(r in listing.stdout for r in RUNS)


def test_every_writer_refuses_another_sqlite_file(db, tmp_path):
    other = tmp_path / "other-results.sqlite"
    shutil.copyfile(db, other)
    for argv in _writers(db, str(other)):
        proc = cli(*argv, check=False)
        assert proc.returncode == 2, (argv, proc.stderr)
        assert "SQLite database" in proc.stderr, (argv, proc.stderr)
    assert _runs_in(other) == set(RUNS)


def test_the_database_is_recognised_under_another_name(db, tmp_path):
    link = tmp_path / "results-link.html"
    link.symlink_to(db)
    proc = cli("report", RUNS[0], "-o", str(link), "--db", str(db), check=False)
    assert proc.returncode == 2 and "results database" in proc.stderr
    relative = os.path.relpath(db, ROOT)  # the CLI runs in ROOT: the same file by a relative path
    proc = cli("export", RUNS[0], "-o", relative, "--db", str(db), check=False)
    assert proc.returncode == 2 and "results database" in proc.stderr
    assert _runs_in(db) == set(RUNS)


def test_writers_write_complete_files_and_no_temporaries(db, tmp_path):
    out = tmp_path / "out"
    for i in range(len(_writers(db, "-"))):
        argv = _writers(db, str(out / f"file{i}"))[i]
        proc = cli(*argv, check=False)
        # compare's gate may say 1 (a synthetic regression); the file is written before the verdict
        assert proc.returncode in (0, 1), (argv, proc.stderr)
        assert (out / f"file{i}").stat().st_size > 100, argv
    assert _leftover_temps(out) == []
    html = (out / "file0").read_text()
    assert html.rstrip().endswith("</html>")


def test_a_directory_an_unwritable_place_and_a_full_disk_are_one_line(db, tmp_path):
    cases = {
        str(tmp_path): "is a directory",
        "/proc/vnetbench-report.html": "cannot write report",
        "/dev/full": "is a device",
    }
    for target, expected in cases.items():
        proc = cli("report", RUNS[0], "-o", target, "--db", str(db), check=False)
        assert proc.returncode == 2, (target, proc.stderr)
        assert expected in proc.stderr, (target, proc.stderr)
        assert "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    ro, full = tmp_path / "ro", tmp_path / "full"
    ro.mkdir()
    full.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)], check=False,
                   capture_output=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(full)], check=False, capture_output=True)
    try:
        if os.path.ismount(ro):  # root: a real read-only file system
            proc = cli("export", RUNS[0], "-o", str(ro / "x.csv"), "--db", str(db), check=False)
            assert proc.returncode == 2 and "read-only" in proc.stderr, proc.stderr
        if os.path.ismount(full):  # and a full one
            subprocess.run(["dd", "if=/dev/zero", f"of={full / 'filler'}", "bs=4k"], capture_output=True)
            proc = cli("export", RUNS[0], "-o", str(full / "x.csv"), "--db", str(db), check=False)
            assert proc.returncode == 2 and "the disk is full" in proc.stderr, proc.stderr
            assert sorted(p.name for p in full.iterdir()) == ["filler"]  # no temporary left
    finally:
        subprocess.run(["umount", str(ro)], check=False, capture_output=True)
        subprocess.run(["umount", str(full)], check=False, capture_output=True)


def test_a_closed_pipe_is_one_line_not_a_traceback(db):
    # The reader has gone before vnetbench writes a byte (as `| head` that has read its fill): the
    # pipe's read end is closed in the parent, so every write fails with EPIPE, whatever the timing.
    for argv in (["export", RUNS[0]], ["show", RUNS[0], "--json"], ["export", RUNS[0], "--format", "json"],
                 ["runs"]):
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            proc = subprocess.run([sys.executable, "-m", "vnetbench", *argv, "--db", str(db)], stdout=write_end,
                                  stderr=subprocess.PIPE, text=True, cwd=ROOT, timeout=120)
        finally:
            os.close(write_end)
        assert "Traceback" not in proc.stderr, (argv, proc.stderr)
        assert "Exception ignored" not in proc.stderr, (argv, proc.stderr)
        assert proc.returncode == 141, (argv, proc.returncode, proc.stderr)
        assert proc.stderr.count("\n") == 1 and "closed by its reader" in proc.stderr, proc.stderr


def test_stdout_to_a_full_disk_is_one_line(db):
    proc = subprocess.run(f"{sys.executable} -m vnetbench export {RUNS[0]} --db {db} >/dev/full", shell=True,
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "disk is full" in proc.stderr and "Traceback" not in proc.stderr


# ------------------------------------------------------------------ planted links, FIFOs, devices (issue 33, item 5)


def _plant(place: Path, outside: Path, copies: int) -> dict[str, tuple[Path | None, str | None]]:
    """What someone who can write to the output's directory would put at its name, each with what the command
    must say (None: it writes its file, in place of the link); `copies` of each, one per command."""
    os.mkfifo(outside / "fifo")
    (outside / "victim.txt").write_text("not yours")
    (outside / "dir").mkdir()
    kinds = {
        "fifo-link.html": (outside / "fifo", "is a link to a FIFO"),
        "device-link.html": (Path("/dev/null"), "is a link to a device"),  # as /dev/sda would be, harmlessly
        "dir-link.html": (outside / "dir", "is a link to a directory"),
        "file-link.html": (outside / "victim.txt", None),
        "dangling-link.html": (outside / "made-by-root.txt", None),
        "fifo.html": (None, "is a FIFO"),
    }
    planted = {}
    for i in range(copies):
        for name, (to, why) in kinds.items():
            path = place / f"{i}-{name}"
            if to is None:
                os.mkfifo(path)
            else:
                path.symlink_to(to)
            planted[path.name] = (to, why)
    return planted


def test_no_writer_follows_a_planted_link_or_opens_a_fifo_or_device(db, tmp_path):
    place, outside = tmp_path / "place", tmp_path / "outside"
    place.mkdir()
    outside.mkdir()
    writers = len(_writers(db, "x"))
    planted = _plant(place, outside, writers + 1)
    before = tree_state(outside)
    runs = []
    for name, (_, why) in planted.items():
        i = int(name.split("-", 1)[0])
        if i == writers:  # refused before it checks for root, let alone builds a lab
            if why is not None:
                runs.append((["run", "quick", "--report", str(place / name), "--db", str(db)], name, why))
        elif name.endswith("fifo-link.html") or i % 3 == 0:  # every writer on the finding, three on the rest
            runs.append((_writers(db, str(place / name))[i], name, why))

    def one(item):
        argv, name, why = item
        return item, cli(*argv, check=False, timeout=120)  # a FIFO opened for writing would block for ever

    with ThreadPoolExecutor(max_workers=2) as pool:
        for (argv, name, why), proc in pool.map(one, runs):
            assert "Traceback" not in proc.stderr, (argv, proc.stderr)
            if why is None:
                assert proc.returncode in (0, 1), (argv, proc.stderr)  # compare's gate may say 1
                assert (place / name).is_file() and not (place / name).is_symlink(), argv
            else:
                assert proc.returncode == 2 and why in proc.stderr, (argv, proc.stderr)
                assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert tree_state(outside) == before  # nothing behind a link was written, made, or opened and left waiting
    assert not (outside / "made-by-root.txt").exists()
    assert all(stat.S_ISFIFO((place / n).lstat().st_mode) for n in planted if n.endswith("-fifo.html"))
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert _leftover_temps(place) == []


def test_the_journals_of_a_database_are_never_written(db, tmp_path):
    """`export -o x.db-wal` lost a committed row of a killed run: the trials of a run killed before SQLite's
    checkpoint live only in the write-ahead log beside the database."""
    copy = tmp_path / "x.db"
    shutil.copyfile(db, copy)
    killed = subprocess.run([sys.executable, "-c", f"""
import os, signal
from vnetbench.report.html_synthetic import make_run
from vnetbench.store.db import Store
store = Store({str(copy)!r})
store.conn.execute("PRAGMA wal_autocheckpoint = 0")
make_run(store, "killed000001", matrix={{"proto": ["udp"]}}, repetitions=2, duration_s=2, series=False)
os.kill(os.getpid(), signal.SIGKILL)  # before any checkpoint: the run is only in x.db-wal
"""], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    wal = tmp_path / "x.db-wal"
    assert wal.stat().st_size > 0
    saved = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    other = tmp_path / "other.db"
    shutil.copyfile(db, other)
    # another database's journal first: the commands below open x.db, and SQLite's last reader to close it
    # checkpoints the log into it (the rows move, none is lost)
    proc = cli("export", RUNS[0], "-o", str(wal), "--db", str(other), check=False)
    assert proc.returncode == 2 and "SQLite database or its journal" in proc.stderr, proc.stderr
    assert wal.read_bytes() == saved["x.db-wal"]
    for target in (wal, tmp_path / "x.db-journal", tmp_path / "x.db-shm"):
        proc = cli("export", RUNS[0], "-o", str(target), "--db", str(copy), check=False)
        assert proc.returncode == 2 and "a journal of the results database" in proc.stderr, (target, proc.stderr)
    assert not (tmp_path / "x.db-journal").exists()
    assert _runs_in(copy) == {*RUNS, "killed000001"}  # the killed run's committed trials, recovered from the log


def test_commands_that_read_results_never_make_or_change_a_database(db, tmp_path):
    """An empty file given as --db was made a database and switched to WAL by `runs`; another SQLite file
    without vnetbench's tables was given them."""
    empty, foreign = tmp_path / "empty.db", tmp_path / "foreign.db"
    empty.touch()
    with sqlite3.connect(foreign) as conn:
        conn.execute("PRAGMA user_version = 7")  # a database, but no table at all
    before = tree_state(tmp_path)
    for path, why in ((empty, "not a vnetbench results database (an empty file)"),
                      (foreign, "an SQLite database without vnetbench's tables")):
        for argv in (["runs"], ["show", RUNS[0]], ["export", RUNS[0]], ["compare", RUNS[0], RUNS[1]],
                     ["history", "--metric", "throughput.rx_mbps"], ["report", RUNS[0], "-o", str(tmp_path / "r")]):
            proc = cli(*argv, "--db", str(path), check=False)
            assert proc.returncode == 2 and why in proc.stderr and "Traceback" not in proc.stderr, (argv, proc.stderr)
    assert tree_state(tmp_path) == before  # no -wal, -shm or report beside them, and both as they were


# ------------------------------------------------------------------ the module itself


def test_an_error_inside_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "report.html"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with output_file(target) as f:
            f.write("half of the new")
            raise RuntimeError("rendering failed")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]


def test_a_replaced_file_keeps_its_permissions(tmp_path):
    target = tmp_path / "shared.csv"
    target.write_text("a")
    target.chmod(0o640)
    write_text(target, "b")
    assert target.read_text() == "b"
    assert target.stat().st_mode & 0o777 == 0o640


def test_missing_parent_directories_are_made(tmp_path):
    target = tmp_path / "a" / "b" / "report.html"
    write_text(target, "x")
    assert target.read_text() == "x"


def test_the_database_path_is_refused_even_before_it_exists(tmp_path):
    db = tmp_path / "new.db"
    with pytest.raises(OutputError, match="results database"):
        write_text(db, "x", db)
    assert not db.exists()


@pytest.mark.parametrize("argv", [["show", "last"], ["runs"], ["export", "last"], ["report", "last", "-o", "x.html"],
                                  ["compare", "a", "b"], ["history", "--metric", "throughput.rx_mbps"]])
def test_a_command_that_reads_results_never_makes_a_database(tmp_path, argv):
    missing = tmp_path / "typo.db"
    done = cli(*argv, "--db", str(missing), check=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"{missing}: no such results database" in " ".join(done.stderr.split())
    assert not missing.exists()
