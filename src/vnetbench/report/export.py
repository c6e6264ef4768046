"""Tidy exports for notebooks and spreadsheets: one record per sample, per point of a per-second series, or per
trial with everything its tools printed."""

from __future__ import annotations

import csv
import json
import math
from typing import IO, Any, Iterable

from vnetbench.store.db import Store

COLUMNS = ["run_id", "config_key", "labels", "trial_id", "repetition", "metric", "value", "unit", "direction"]
# A series (throughput per flow per interval, RTT per probe, cwnd, ...): one row per point, t in seconds from the
# trial's start.
SERIES_COLUMNS = ["run_id", "config_key", "labels", "trial_id", "repetition", "series", "unit", "t", "v"]
TRIAL_COLUMNS = ["run_id", "config_key", "labels", "trial_id", "repetition", "position", "started", "ended",
                 "status", "reason", "raw"]
WHAT = {"samples": COLUMNS, "series": SERIES_COLUMNS, "trials": TRIAL_COLUMNS}


def _rows(store: Store, run_id: str, what: str) -> Iterable[dict[str, Any]]:
    if what == "samples":
        return store.samples(run_id)
    if what == "series":
        return store.run_series(run_id)
    labels = {c["key"]: c["labels"] for c in store.configurations(run_id)}
    return ({**t, "trial_id": t["id"], "labels": labels.get(t["config_key"], {})}
            for t in store.trials(run_id, with_raw=True))


def _json_safe(x: Any) -> Any:
    """NaN and infinities as null: JSON has no such numbers (and json.dump would write invalid JSON)."""
    return None if isinstance(x, float) and not math.isfinite(x) else x


def export(store: Store, run_id: str, fmt: str, out: IO[str], what: str = "samples") -> int:
    """Write the run's samples (or series points, or trials) as CSV (labels as one JSON column plus one column
    per label; a trial's raw record as one JSON column) or as a JSON array. Returns how many records."""
    columns = WHAT[what]
    if fmt == "json":
        n = 0
        out.write("[")
        for r in _rows(store, run_id, what):
            out.write(("," if n else "") + "\n" + json.dumps({c: _json_safe(r[c]) for c in columns}))
            n += 1
        out.write("\n]\n")
        return n
    if fmt != "csv":
        raise ValueError(f"unknown export format {fmt!r}; expected csv or json")
    rows = list(_rows(store, run_id, what))
    label_keys = sorted({k for r in rows for k in r["labels"]})
    writer = csv.writer(out)
    writer.writerow(columns + [f"label.{k}" for k in label_keys])
    for r in rows:
        writer.writerow([json.dumps(r[c], sort_keys=True) if c in ("labels", "raw") else r[c] for c in columns]
                        + [r["labels"].get(k, "") for k in label_keys])
    return len(rows)
