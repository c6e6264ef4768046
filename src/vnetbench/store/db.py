"""The results store: one SQLite file, no server.

Each trial is written in its own transaction the moment it ends, so killing a
run loses at most the trial in flight; ``run --resume`` finds what is missing by
comparing the planned (configuration, repetition) pairs with the stored ones.

Raw tool outputs are kept (zlib-compressed: a 20 s ping at 1 ms is 1.4 MB of
text and 150 kB compressed) so any number can be traced back to what the tool
printed.

Series (per-second throughput, per-packet RTT) are stored as little-endian
float64 blobs: a 15 000-point RTT series is 240 kB instead of a JSON text twice
that size, and reads straight into numpy.
"""

from __future__ import annotations

import json
import os
import shlex
import sqlite3
import time
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np

from vnetbench import runlock
from vnetbench.errors import StoreError

# The version of the tables below. A database of an older version is migrated when it is opened
# (MIGRATIONS, after a backup copy); one of a newer version is refused.
SCHEMA_VERSION = 2

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    scenario_name TEXT NOT NULL,
    scenario_source TEXT NOT NULL,
    scenario_text TEXT NOT NULL,
    scenario_hash TEXT NOT NULL,
    overrides TEXT NOT NULL,          -- JSON list of --set items
    started REAL NOT NULL,
    ended REAL,
    status TEXT NOT NULL,             -- running | completed | failed | interrupted
    status_reason TEXT,
    seed INTEGER,
    fingerprint TEXT NOT NULL,        -- JSON
    pid INTEGER,                      -- the process that runs it (schema 2)
    boot_id TEXT                      -- the boot it runs in: a stored "running" from another boot is not running
);
CREATE TABLE IF NOT EXISTS configurations (
    run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    key TEXT NOT NULL,
    labels TEXT NOT NULL,             -- JSON object, flat
    params TEXT NOT NULL,             -- JSON object, every parameter as run
    expected TEXT NOT NULL,           -- JSON object: theoretical values where known
    lab_state TEXT,                   -- JSON: impairments as read back from the kernel
    stop_reason TEXT,
    PRIMARY KEY (run_id, key)
);
CREATE TABLE IF NOT EXISTS trials (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    config_key TEXT NOT NULL,
    repetition INTEGER NOT NULL,
    position INTEGER NOT NULL,
    started REAL NOT NULL,
    ended REAL NOT NULL,
    status TEXT NOT NULL,             -- ok | failed | timeout
    reason TEXT,
    raw BLOB NOT NULL                 -- zlib-compressed JSON: tool outputs, by workload and host
);
CREATE INDEX IF NOT EXISTS trials_run ON trials(run_id, config_key);
CREATE TABLE IF NOT EXISTS samples (
    trial_id INTEGER NOT NULL REFERENCES trials(id) ON DELETE CASCADE,
    metric TEXT NOT NULL,
    value REAL NOT NULL,
    unit TEXT NOT NULL,
    direction TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS samples_trial ON samples(trial_id);
CREATE TABLE IF NOT EXISTS series (
    trial_id INTEGER NOT NULL REFERENCES trials(id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    unit TEXT NOT NULL,
    t BLOB NOT NULL,                  -- seconds since trial start, float64 LE
    v BLOB NOT NULL                   -- values, float64 LE
);
CREATE INDEX IF NOT EXISTS series_trial ON series(trial_id);
CREATE TABLE IF NOT EXISTS baselines (
    name TEXT PRIMARY KEY,
    run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    created REAL NOT NULL
);
"""


# Schema version -> the statements that bring a database of the version before it up to it. Each is run,
# with the version's own number, in one transaction; a database older than the first entry's version has
# every migration applied in order.
MIGRATIONS: dict[int, list[str]] = {
    2: ["ALTER TABLE runs ADD COLUMN pid INTEGER",
        "ALTER TABLE runs ADD COLUMN boot_id TEXT"],
}

#: A column each schema added, by which a file that lacks its version row shows what it is. Before the tables
#: and the version row were written in one transaction, a run killed between them left such a file; reading it
#: as schema 1 made the upgrade add columns it already had ("duplicate column name").
SCHEMA_MARKS: dict[int, tuple[str, str]] = {
    2: ("runs", "pid"),
}


@dataclass
class SampleRecord:
    metric: str
    value: float
    unit: str
    direction: str


@dataclass
class SeriesRecord:
    name: str
    unit: str
    t: np.ndarray
    v: np.ndarray


@dataclass
class TrialRecord:
    config_key: str
    repetition: int
    position: int
    started: float
    ended: float
    status: str
    reason: str | None
    raw: dict[str, Any]
    samples: list[SampleRecord]
    series: list[SeriesRecord]


def _our_version() -> str:
    from vnetbench import __version__

    return __version__


def _blob(a: Iterable[float]) -> bytes:
    return np.asarray(a, dtype="<f8").tobytes()


def _unblob(b: bytes) -> np.ndarray:
    return np.frombuffer(b, dtype="<f8")


class Store:
    def __init__(self, path: str | Path, create: bool = True):
        """The results database at `path`, made when it is not there. With create=False (the commands that
        read results) it must be one already: anything else there, an empty file included, is refused and
        left as it was, never turned into a database or switched to WAL."""
        self.path = Path(path)
        if self.path.exists() and self.path.is_dir():
            raise StoreError(f"{self.path} is a directory; --db takes a file name, e.g. {self.path}/vnetbench.db")
        if not create:
            from vnetbench.output import is_sqlite_file

            if not is_sqlite_file(self.path):
                what = "an empty file" if self.path.is_file() and self.path.stat().st_size == 0 else \
                    "not an SQLite file"
                raise StoreError(f"{self.path}: not a vnetbench results database ({what}); it was left as it was: "
                                 "give the --db of a results database (`vnetbench run` makes one)")
        try:
            if self.path.parent and not self.path.parent.exists():
                self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"cannot create the directory of {self.path}: {e.strerror or e}") from None
        try:
            if self.path.exists() and not (os.access(self.path, os.W_OK) and os.access(self.path.parent, os.W_OK)):
                # A read-only file or file system (results on a share, a CD, a locked-down CI cache) can be read:
                # nothing can change it, so SQLite need not look for a writer's journal it could not create.
                from urllib.parse import quote

                self.conn = sqlite3.connect(f"file:{quote(str(self.path.resolve()))}?mode=ro&immutable=1", uri=True)
            else:
                self.conn = sqlite3.connect(str(self.path), timeout=30)
            self.conn.row_factory = sqlite3.Row
            self.conn.execute("PRAGMA foreign_keys = ON")
            tables = {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        except sqlite3.DatabaseError as e:
            raise StoreError(f"{self.path}: not a vnetbench results database ({e}); choose another file with --db") \
                from None
        if not tables and not create:
            self.conn.close()
            raise StoreError(f"{self.path}: an SQLite database without vnetbench's tables; it was left as it was: "
                             "give the --db of a results database (`vnetbench run` makes one)")
        if tables and not {"meta", "runs"} <= tables:
            names = ", ".join(sorted(tables)[:6]) + (" ..." if len(tables) > 6 else "")
            raise StoreError(f"{self.path} is an SQLite database of another program (tables: {names}); "
                             "vnetbench leaves it alone: choose another file with --db")
        version = self._schema_version() if tables else None
        if version is not None and version > SCHEMA_VERSION:
            raise StoreError(f"{self.path} was written by a newer vnetbench (database schema {version}; this "
                             f"vnetbench {_our_version()} reads schema {SCHEMA_VERSION} and older): upgrade vnetbench")
        if version is not None and version < SCHEMA_VERSION:
            self._migrate(version)
        if version != SCHEMA_VERSION:  # a new file (or one just migrated): tables and indexes of this version
            with self._writing("create the results tables"):
                # Tables and version row in one transaction (SQLite's DDL is transactional): a process killed
                # here leaves no tables without a version, which would read as schema 1 and fail to migrate.
                stamp = (f"INSERT OR IGNORE INTO meta VALUES ('schema_version', '{SCHEMA_VERSION}');"
                         if version is None else "")
                self.conn.executescript(f"BEGIN IMMEDIATE;\n{SCHEMA}\n{stamp}\nCOMMIT;")
        if create:  # a command that reads results leaves the journal mode as the file has it
            try:
                self.conn.execute("PRAGMA journal_mode = WAL")  # readers never wait for a run's writes
            except sqlite3.OperationalError:
                pass  # a read-only file keeps its journal mode; reading works either way

    def _schema_version(self) -> int:
        try:
            row = self.conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            if row is not None:
                return int(row["value"])
            version = max((v for v, (table, column) in SCHEMA_MARKS.items()
                           if column in {c["name"] for c in self.conn.execute(f"PRAGMA table_info({table})")}),
                          default=1)
            if version > 1:  # written at `version`, its row lost: put it back, so that the file reads as it is
                try:
                    with self.conn:
                        self.conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(version),))
                except sqlite3.OperationalError:
                    pass  # read-only: the columns say the same next time
            return version
        except (sqlite3.DatabaseError, ValueError) as e:
            raise StoreError(f"{self.path}: its schema version cannot be read ({e}); choose another file with --db") \
                from None

    def _migrate(self, version: int) -> None:
        """Bring a database of an older schema up to this one: a backup copy first, then every step in one
        transaction, so an interrupted or failed migration leaves the file exactly as it was."""
        backup = self.path.with_name(f"{self.path.name}.schema{version}.bak")
        if not (os.access(self.path, os.W_OK) and os.access(self.path.parent, os.W_OK)):
            raise StoreError(f"{self.path} was written by an older vnetbench (database schema {version}) and must be "
                             f"upgraded to schema {SCHEMA_VERSION} to be read, but it is read-only: copy it to a "
                             "writable place and open the copy")
        try:
            if not backup.exists():
                with sqlite3.connect(str(backup)) as copy:
                    self.conn.backup(copy)  # consistent even with a run writing (SQLite's online backup)
                copy.close()
        except sqlite3.Error as e:
            raise StoreError(f"{self.path} needs upgrading from schema {version} to {SCHEMA_VERSION}, but its backup "
                             f"copy {backup} could not be written ({e}); nothing was changed") from None
        steps = [sql for v in sorted(MIGRATIONS) if v > version for sql in MIGRATIONS[v]]
        try:
            self.conn.execute("BEGIN IMMEDIATE")
            for sql in steps:
                self.conn.execute(sql)
            self.conn.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            self.conn.execute("COMMIT")
        except sqlite3.Error as e:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            raise StoreError(f"{self.path}: upgrading from schema {version} to {SCHEMA_VERSION} failed ({e}); the "
                             f"file is unchanged and a copy is in {backup}") from None

    @contextmanager
    def _writing(self, what: str):
        """One transaction; SQLite's failures as what they mean for the user, with the file named."""
        try:
            with self.conn:
                yield
        except sqlite3.OperationalError as e:
            text = str(e).lower()
            if "readonly" in text or "read-only" in text:
                why = "the file (or its directory, where SQLite writes its journal) is read-only"
            elif "locked" in text or "busy" in text:
                why = "another program has held it locked for 30 s"
            elif "full" in text:
                why = "the disk is full"
            else:
                why = str(e)
            raise StoreError(f"{self.path}: cannot {what}: {why}. What was stored before is intact (each trial "
                             "is committed as it ends)") from None
        except sqlite3.DatabaseError as e:
            raise StoreError(f"{self.path}: cannot {what}: {e}") from None

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------ writing

    def create_run(self, run_id: str, scenario_name: str, source: str, text: str, text_hash: str,
                   overrides: list[str], seed: int, fingerprint: dict[str, Any]) -> None:
        with self._writing("store the new run"):
            self.conn.execute(
                "INSERT INTO runs (id, scenario_name, scenario_source, scenario_text, scenario_hash, overrides,"
                " started, status, seed, fingerprint, pid, boot_id) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (run_id, scenario_name, source, text, text_hash, json.dumps(overrides), time.time(), "running",
                 seed, json.dumps(fingerprint), os.getpid(), runlock.boot_id()),
            )

    def add_configuration(self, run_id: str, key: str, labels: dict[str, Any], params: dict[str, Any],
                          expected: dict[str, float]) -> None:
        with self._writing("store a configuration"):
            self.conn.execute(
                "INSERT OR IGNORE INTO configurations (run_id, key, labels, params, expected) VALUES (?,?,?,?,?)",
                (run_id, key, json.dumps(labels), json.dumps(params, default=str), json.dumps(expected)),
            )

    def set_lab_state(self, run_id: str, key: str, state: dict[str, Any]) -> None:
        with self._writing("store the lab state"):
            self.conn.execute("UPDATE configurations SET lab_state=? WHERE run_id=? AND key=?",
                              (json.dumps(state), run_id, key))

    def set_stop_reason(self, run_id: str, key: str, reason: str) -> None:
        with self._writing("store why a configuration stopped"):
            self.conn.execute("UPDATE configurations SET stop_reason=? WHERE run_id=? AND key=?", (reason, run_id, key))

    def update_fingerprint(self, run_id: str, fingerprint: dict[str, Any]) -> None:
        with self._writing("store the fingerprint"):
            self.conn.execute("UPDATE runs SET fingerprint=? WHERE id=?", (json.dumps(fingerprint), run_id))

    def record_trial(self, run_id: str, trial: TrialRecord) -> int:
        """Write one trial with its samples and series in a single transaction."""
        with self._writing("store a trial"):
            cur = self.conn.execute(
                "INSERT INTO trials (run_id, config_key, repetition, position, started, ended, status, reason, raw)"
                " VALUES (?,?,?,?,?,?,?,?,?)",
                (run_id, trial.config_key, trial.repetition, trial.position, trial.started, trial.ended,
                 trial.status, trial.reason, zlib.compress(json.dumps(trial.raw).encode(), 6)),
            )
            trial_id = cur.lastrowid
            self.conn.executemany(
                "INSERT INTO samples (trial_id, metric, value, unit, direction) VALUES (?,?,?,?,?)",
                [(trial_id, s.metric, float(s.value), s.unit, s.direction) for s in trial.samples],
            )
            self.conn.executemany(
                "INSERT INTO series (trial_id, name, unit, t, v) VALUES (?,?,?,?,?)",
                [(trial_id, s.name, s.unit, _blob(s.t), _blob(s.v)) for s in trial.series],
            )
        return trial_id

    def finish_run(self, run_id: str, status: str, reason: str | None = None) -> None:
        with self._writing("store the run's end"):
            self.conn.execute("UPDATE runs SET ended=?, status=?, status_reason=? WHERE id=?",
                              (time.time(), status, reason, run_id))

    def reopen_run(self, run_id: str) -> None:
        with self._writing("reopen the run"):
            self.conn.execute("UPDATE runs SET status='running', ended=NULL, status_reason=NULL, pid=?, boot_id=?"
                              " WHERE id=?", (os.getpid(), runlock.boot_id(), run_id))

    def set_baseline(self, name: str, run_id: str) -> None:
        with self._writing("store the baseline"):
            self.conn.execute("INSERT OR REPLACE INTO baselines (name, run_id, created) VALUES (?,?,?)",
                              (name, run_id, time.time()))

    # ------------------------------------------------------------ reading

    def resolve_run(self, ref: str) -> str:
        """A run id from a full id, a unique prefix, or 'last'."""
        if ref in ("last", "latest"):
            row = self.conn.execute("SELECT id FROM runs ORDER BY started DESC LIMIT 1").fetchone()
            if row is None:
                raise StoreError(f"{self.path} holds no runs yet; start one with `vnetbench run SCENARIO`")
            return row["id"]
        rows = self.conn.execute("SELECT id FROM runs WHERE id LIKE ? || '%'", (ref,)).fetchall()
        if len(rows) == 1:
            return rows[0]["id"]
        if not rows:
            raise StoreError(f"no run {ref!r} in {self.path}; `vnetbench runs --db {shlex.quote(str(self.path))}` lists them")
        raise StoreError(f"{ref!r} matches {len(rows)} runs in {self.path}; give more characters of the id")

    def run(self, run_id: str) -> dict[str, Any]:
        row = self.conn.execute("SELECT * FROM runs WHERE id=?", (run_id,)).fetchone()
        if row is None:
            raise StoreError(f"no run {run_id!r} in {self.path}")
        out = self._with_status(dict(row))
        out["fingerprint"] = json.loads(out["fingerprint"])
        out["overrides"] = json.loads(out["overrides"])
        return out

    def _with_status(self, run: dict[str, Any]) -> dict[str, Any]:
        """A run as it is now: one stored as ``running`` whose process is gone (killed, or the machine
        rebooted) is ``interrupted``, with what is stored and the command that finishes it."""
        run["stored_status"] = run["status"]
        run["status"] = runlock.effective_status(run["status"], run["id"], run.get("boot_id"))
        if run["status"] == "interrupted" and run["stored_status"] == "running":
            stored = self.conn.execute("SELECT COUNT(*) FROM trials WHERE run_id=?", (run["id"],)).fetchone()[0]
            who = f" (pid {run['pid']})" if run.get("pid") else ""
            run["status_reason"] = (f"its process{who} ended without finishing it; {stored} trials are stored; "
                                    f"finish it with `vnetbench run --resume {shlex.quote(str(run['id']))} "
                                    f"--db {shlex.quote(str(self.path))}`")
        return run

    def runs(self) -> list[dict[str, Any]]:
        rows = self.conn.execute(
            "SELECT r.id, r.scenario_name, r.started, r.ended, r.status, r.status_reason, r.pid, r.boot_id,"
            " (SELECT COUNT(*) FROM configurations c WHERE c.run_id=r.id) AS configurations,"
            " (SELECT COUNT(*) FROM trials t WHERE t.run_id=r.id AND t.status='ok') AS trials_ok,"
            " (SELECT COUNT(*) FROM trials t WHERE t.run_id=r.id AND t.status!='ok') AS trials_failed"
            " FROM runs r ORDER BY r.started"
        ).fetchall()
        return [self._with_status(dict(r)) for r in rows]

    def configurations(self, run_id: str) -> list[dict[str, Any]]:
        rows = self.conn.execute("SELECT * FROM configurations WHERE run_id=? ORDER BY rowid", (run_id,)).fetchall()
        out = []
        for r in rows:
            d = dict(r)
            for k in ("labels", "params", "expected"):
                d[k] = json.loads(d[k])
            d["lab_state"] = json.loads(d["lab_state"]) if d["lab_state"] else None
            out.append(d)
        return out

    def trials(self, run_id: str, with_raw: bool = False) -> list[dict[str, Any]]:
        cols = "*" if with_raw else "id, run_id, config_key, repetition, position, started, ended, status, reason"
        rows = self.conn.execute(f"SELECT {cols} FROM trials WHERE run_id=? ORDER BY position, id", (run_id,)).fetchall()
        out = [dict(r) for r in rows]
        if with_raw:
            for d in out:
                d["raw"] = json.loads(zlib.decompress(d["raw"]))
        return out

    def done_slots(self, run_id: str) -> set[tuple[str, int]]:
        """(configuration key, repetition) pairs that already have a stored trial."""
        rows = self.conn.execute("SELECT config_key, repetition FROM trials WHERE run_id=?", (run_id,)).fetchall()
        return {(r["config_key"], r["repetition"]) for r in rows}

    def samples(self, run_id: str) -> Iterator[dict[str, Any]]:
        """One row per sample of ok trials: run, configuration key, labels, trial, metric, value, unit, direction."""
        labels = {c["key"]: c["labels"] for c in self.configurations(run_id)}
        cur = self.conn.execute(
            "SELECT t.id AS trial_id, t.config_key, t.repetition, s.metric, s.value, s.unit, s.direction"
            " FROM samples s JOIN trials t ON t.id = s.trial_id"
            " WHERE t.run_id=? AND t.status='ok' ORDER BY t.config_key, s.metric, t.repetition",
            (run_id,),
        )
        for r in cur:
            d = dict(r)
            d["run_id"] = run_id
            d["labels"] = labels.get(d["config_key"], {})
            yield d

    def values(self, run_id: str) -> dict[str, dict[str, np.ndarray]]:
        """{configuration key: {metric: per-trial values}} for ok trials."""
        out: dict[str, dict[str, list[float]]] = {}
        for r in self.conn.execute(
            "SELECT t.config_key, s.metric, s.value FROM samples s JOIN trials t ON t.id=s.trial_id"
            " WHERE t.run_id=? AND t.status='ok' ORDER BY t.position", (run_id,)
        ):
            out.setdefault(r["config_key"], {}).setdefault(r["metric"], []).append(r["value"])
        return {k: {m: np.asarray(v) for m, v in ms.items()} for k, ms in out.items()}

    def marked_trials(self, run_id: str) -> dict[str, list[tuple[int, list[str]]]]:
        """{configuration key: [(repetition, why), ...]}: the ok trials the machine's own noise marked (steal or
        other processes above metrics.NOISE_MARKS), in the run's order."""
        from vnetbench.metrics import NOISE_MARKS, noise_marks

        names = [m for m, _, _ in NOISE_MARKS]
        per: dict[int, tuple[str, int, dict[str, float]]] = {}
        for r in self.conn.execute(
            "SELECT t.id, t.config_key, t.repetition, s.metric, s.value FROM samples s JOIN trials t ON t.id=s.trial_id"
            f" WHERE t.run_id=? AND t.status='ok' AND s.metric IN ({','.join('?' * len(names))}) ORDER BY t.position",
            (run_id, *names),
        ):
            per.setdefault(r["id"], (r["config_key"], r["repetition"], {}))[2][r["metric"]] = r["value"]
        out: dict[str, list[tuple[int, list[str]]]] = {}
        for key, repetition, values in per.values():
            why = noise_marks(values)
            if why:
                out.setdefault(key, []).append((repetition, why))
        return out

    def metric_meta(self, run_id: str) -> dict[str, tuple[str, str]]:
        """{metric: (unit, direction)} as recorded in this run."""
        rows = self.conn.execute(
            "SELECT DISTINCT s.metric, s.unit, s.direction FROM samples s JOIN trials t ON t.id=s.trial_id"
            " WHERE t.run_id=?", (run_id,)
        ).fetchall()
        return {r["metric"]: (r["unit"], r["direction"]) for r in rows}

    def run_series(self, run_id: str) -> Iterator[dict[str, Any]]:
        """Every series of the run's ok trials, one row per point: run, configuration key, labels, trial,
        repetition, series name, unit, t (seconds from the trial's start) and v, in the run's order."""
        labels = {c["key"]: c["labels"] for c in self.configurations(run_id)}
        cur = self.conn.execute(
            "SELECT t.id AS trial_id, t.config_key, t.repetition, s.name, s.unit, s.t, s.v"
            " FROM series s JOIN trials t ON t.id = s.trial_id"
            " WHERE t.run_id=? AND t.status='ok' ORDER BY t.position, s.rowid", (run_id,))
        for r in cur:
            base = {"run_id": run_id, "config_key": r["config_key"], "labels": labels.get(r["config_key"], {}),
                    "trial_id": r["trial_id"], "repetition": r["repetition"], "series": r["name"],
                    "unit": r["unit"]}
            for t, v in zip(_unblob(r["t"]).tolist(), _unblob(r["v"]).tolist()):
                yield {**base, "t": t, "v": v}

    def series(self, trial_id: int) -> list[SeriesRecord]:
        rows = self.conn.execute("SELECT name, unit, t, v FROM series WHERE trial_id=? ORDER BY rowid", (trial_id,))
        return [SeriesRecord(r["name"], r["unit"], _unblob(r["t"]), _unblob(r["v"])) for r in rows]

    def baseline(self, name: str) -> str:
        row = self.conn.execute("SELECT run_id FROM baselines WHERE name=?", (name,)).fetchone()
        if row is None:
            names = [r["name"] for r in self.conn.execute("SELECT name FROM baselines")]
            have = f"; baselines here: {', '.join(names)}" if names else ""
            raise StoreError(f"no baseline {name!r} in {self.path}; set one with `vnetbench baseline set RUN`{have}")
        return row["run_id"]
