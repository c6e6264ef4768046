"""What the link emulator carries on this machine, as `doctor --fidelity` measured it, kept for the scenarios
that scale their rates to it (a ``[scale]`` table with ``to = "measured"``, as `static-congestion` has).

A measurement belongs to the machine (host name, CPU model and count), its kernel and the vnb-link binary
that was measured: with any of them changed the numbers no longer hold, and a scenario falls back to its
written ``fallback`` rate, saying why. The records live in one JSON file in the state directory
(``$VNETBENCH_STATE_DIR``, else /var/lib/vnetbench), newest last.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vnetbench import machine, units
from vnetbench.impair import backend as B

STATE_DIR_ENV = "VNETBENCH_STATE_DIR"
DEFAULT_STATE_DIR = Path("/var/lib/vnetbench")
FILE_NAME = "link-capacity.json"
KEEP_RECORDS = 20  # a history to look back on, not a log that grows for ever
FORMAT = 1

#: The capacity a scenario scales to: TCP with the endpoints' offloads off, one flow. Every UDP datagram and
#: every fragment reaches the emulator as a packet of its own whatever the offloads, so this per-packet figure
#: bounds all of a scenario's traffic; with offloads on, TCP alone goes several times faster.
PER_PACKET = {"offload": "off", "flows": 1}


def state_file() -> Path:
    return Path(os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR) / FILE_NAME


def emulator_identity() -> str | None:
    """The vnb-link binary as a short content hash (the binary measured is the binary that counts)."""
    path = B.find_binary()
    if path is None:
        return None
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12]
    except OSError:
        return None


def machine_identity() -> dict[str, Any]:
    facts = machine.identity()
    return {**{k: facts[k] for k in ("hostname", "cpu_model", "cpus", "kernel")}, "vnb_link": emulator_identity()}


@dataclass(frozen=True)
class Measured:
    """One stored measurement: where and when, and the capacity rows (bit/s per offload setting and flows)."""

    identity: dict[str, Any]
    measured_at: float
    rows: list[dict[str, Any]]

    def _row(self, offload: str, flows: int) -> dict[str, Any]:
        for row in self.rows:
            if row.get("offload") == offload and row.get("flows") == flows and row.get("where") == "userspace":
                return row
        return {}

    def bps(self, offload: str, flows: int) -> float | None:
        value = self._row(offload, flows).get("bps")
        return float(value) if isinstance(value, (int, float)) and math.isfinite(value) and value > 0 else None

    def runs(self, offload: str, flows: int) -> list[float]:
        """The runs `bps` is the median of (records written before doctor repeated its runs have none)."""
        values = self._row(offload, flows).get("runs_bps")
        return [float(v) for v in values if isinstance(v, (int, float))] if isinstance(values, list) else []

    @property
    def per_packet_bps(self) -> float | None:
        return self.bps(**PER_PACKET)

    def describe(self) -> str:
        return (f"measured by doctor --fidelity on {units.utc_text(self.measured_at, seconds=False)} with kernel "
                f"{self.identity.get('kernel')} and vnb-link {self.identity.get('vnb_link')}")


def _read_records(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError):
        return []  # unreadable or not ours: as if nothing was measured (the fallback says so)
    records = data.get("records") if isinstance(data, dict) and data.get("format") == FORMAT else None
    return [r for r in records if isinstance(r, dict)] if isinstance(records, list) else []


def rows_of(checks: list[Any]) -> list[dict[str, Any]]:
    """The capacity rows of `doctor --fidelity`'s checks (impair/fidelity.py): the emulator's and the bridge's,
    each with the median its scenarios scale to (`bps`) and the runs it is the median of (`runs_bps`)."""
    return [{"where": c.backend, "offload": c.values["offload"], "flows": c.values["flows"],
             "bps": c.values["bps"], "runs_bps": c.values.get("runs_bps", [c.values["bps"]])}
            for c in checks if {"bps", "flows", "offload"} <= set(c.values)]


def save(rows: list[dict[str, Any]], now: float | None = None) -> Path:
    """Keep one measurement's capacity rows (``{"where", "offload", "flows", "bps", "runs_bps"}``) for this machine."""
    path = state_file()
    record = {"identity": machine_identity(), "measured_at": now if now is not None else time.time(), "rows": rows}
    records = (_read_records(path) + [record])[-KEEP_RECORDS:]
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written whole and renamed over the old file: a reader sees the old records or the new ones, never half.
    fd, tmp = tempfile.mkstemp(prefix=f".{FILE_NAME}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"format": FORMAT, "records": records}, f, indent=1)
        os.chmod(tmp, 0o644)  # read by `plan` and `run` whoever runs them
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def latest() -> tuple[Measured | None, str]:
    """The newest measurement of this machine, its kernel and its vnb-link, or None and why there is none."""
    path = state_file()
    records = _read_records(path)
    here = machine_identity()
    if not records:
        return None, (f"no link capacity was measured on this machine (none in {path}); "
                      "`sudo vnetbench doctor --fidelity` measures it")
    for r in reversed(records):
        identity = r.get("identity") if isinstance(r.get("identity"), dict) else {}
        if identity == here and isinstance(r.get("rows"), list) and isinstance(r.get("measured_at"), (int, float)):
            return Measured(identity, float(r["measured_at"]), r["rows"]), ""
    newest = records[-1].get("identity") if isinstance(records[-1].get("identity"), dict) else {}
    changed = [f"{k} {newest.get(k)!s} then, {here[k]!s} now" for k in here if newest.get(k) != here[k]]
    return None, (f"the link capacity in {path} was measured on another setup ({'; '.join(changed)}): "
                  "`sudo vnetbench doctor --fidelity` measures this one")


def line_rate() -> tuple[float | None, str]:
    """The line rate this machine's stored measurement allows (its per-packet capacity read down to two digits)
    and where it comes from, for people; or None and why there is none."""
    measured, why_not = latest()
    per_packet = measured.per_packet_bps if measured else None
    if measured is None or per_packet is None:
        return None, why_not or f"the measurement in {state_file()} has no per-packet capacity"
    runs = measured.runs(**PER_PACKET)
    of_runs = (f" (the median of {len(runs)} runs, {min(runs) / 1e6:.0f}-{max(runs) / 1e6:.0f} Mbit/s)"
               if len(runs) > 1 else "")
    return round_down(per_packet), (f"vnb-link's capacity on this machine is {per_packet / 1e6:.0f} Mbit/s{of_runs} "
                                    f"with one TCP flow, offloads off and 10 ms each way, {measured.describe()}")


def round_down(bps: float, digits: int = 2) -> float:
    """A rate people can read and that does not move with every measurement's noise: 2461 Mbit/s -> 2.4 Gbit/s."""
    if bps <= 0:
        return bps
    step = 10 ** (math.floor(math.log10(bps)) - digits + 1)
    return math.floor(bps / step + 1e-9) * step
