"""Tidy exports: one record per sample, for notebooks and spreadsheets."""

from __future__ import annotations

import csv
import json
from typing import IO

from vnetbench.store.db import Store

COLUMNS = ["run_id", "config_key", "labels", "trial_id", "repetition", "metric", "value", "unit", "direction"]


def export(store: Store, run_id: str, fmt: str, out: IO[str]) -> int:
    """Write the run's samples as CSV (labels as one JSON column plus one column per label) or JSON lines."""
    rows = list(store.samples(run_id))
    if fmt == "json":
        json.dump([{c: r[c] for c in COLUMNS} for r in rows], out, indent=1)
        out.write("\n")
    elif fmt == "csv":
        label_keys = sorted({k for r in rows for k in r["labels"]})
        writer = csv.writer(out)
        writer.writerow(COLUMNS + [f"label.{k}" for k in label_keys])
        for r in rows:
            writer.writerow([json.dumps(r[c], sort_keys=True) if c == "labels" else r[c] for c in COLUMNS]
                            + [r["labels"].get(k, "") for k in label_keys])
    else:
        raise ValueError(f"unknown export format {fmt!r}; expected csv or json")
    return len(rows)
