"""Every bound vnetbench puts on what others give it, in one table.

A scenario file, a trace file, a stored run and a remote host's answer come from people and machines vnetbench
does not control (README, Threat model). Whatever they say, reading them must stay within seconds and a few
hundred megabytes, and a run must not unroll without bound once its lab is up. Each limit below is checked
before the thing it bounds is read, parsed or unrolled (`vnetbench plan` checks the scenario's, without root),
and a refusal names the limit with its value (``str(limit)``: "the key depth limit of 32 parts").

This module imports nothing of vnetbench's, so that every layer can take its numbers from here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limit:
    name: str  # how messages name it
    value: int
    unit: str  # "bytes" are shown in MiB, anything else counted: "32 parts"

    @property
    def shown(self) -> str:
        if self.unit == "bytes":
            return f"{self.value / 2**20:g} MiB"
        return f"{self.value:,} {self.unit}"

    def __str__(self) -> str:
        return f"the {self.name} limit of {self.shown}"


# A scenario is a few kilobytes (the largest built-in is 3.4 kB); a megabyte is a matrix of thousands of values
# written out. tomllib reads 1 MiB in about 0.1 s; the same parser took 14 s for 40 kB of deep dotted keys, so
# the depth is bounded too (below), both before the text is parsed.
SCENARIO_BYTES = Limit("scenario file size", 2**20, "bytes")

# Dot-separated parts in one key (`a.b.c = 1` has 3). tomllib's time grows with the square of a key's depth
# (each part re-checks every prefix): 20,000 parts took 14 s and 1.7 GB. The deepest key a scenario needs has
# 5 (`lab.link.bottleneck.forward.rate`); 32 costs nothing to parse.
KEY_DEPTH = Limit("key depth", 32, "parts")

# The compact schedule form ("100Mbit/5s 20Mbit/5s ..."); longer rate sequences belong in a trace file.
SCHEDULE_TEXT = Limit("schedule text", 100_000, "characters")

# Steps of a link schedule unrolled for one trial (its repeating steps over the trial's seconds and a margin),
# each one a step the link emulator is given when the trial starts. 1 ms steps for a 95 s trial fit; `every =
# "1us"` unrolled 1,000,000 steps per second of trial (7.4 s and 1 GB at trial start).
SCHEDULE_STEPS = Limit("schedule steps per trial", 100_000, "steps")

# A Mahimahi trace: one line per 1500-byte delivery opportunity, so 64 MiB is a period of about 30 s at
# 1 Gbit/s; cellular traces are a few MB. Read once per run whatever the number of configurations.
TRACE_BYTES = Limit("trace file size", 64 * 2**20, "bytes")

# A topology file (containerlab's *.clab.yml): about 100 bytes a node and a link, so 4 MiB is a lab of 20,000
# nodes (topology.templates.MAX_NODES), more than a machine holds; PyYAML's libyaml loader reads it in a second.
TOPOLOGY_FILE_BYTES = Limit("topology file size", 4 * 2**20, "bytes")

# What vnetbench reads from one command on a remote host (stdout and stderr each): its answers are facts,
# versions and `ip`/`tc` JSON of kilobytes; a host answering more is refused rather than held in memory.
REMOTE_OUTPUT_BYTES = Limit("remote output", 16 * 2**20, "bytes")

# What a host's run lock script answers (hosts/lock.py): "locked FILE", or "busy" and the holder's line, or one
# line of why not. Anything longer is not its answer.
LOCK_ANSWER_BYTES = Limit("lock answer", 64 * 2**10, "bytes")

# A matrix of more configurations is refused before it is expanded (`--max-configurations N` raises it): a
# typo such as an axis of 200 values too many would otherwise take minutes and gigabytes, then days to run.
CONFIGURATIONS = Limit("configurations", 10_000, "configurations")

ALL = (SCENARIO_BYTES, KEY_DEPTH, SCHEDULE_TEXT, SCHEDULE_STEPS, TRACE_BYTES, TOPOLOGY_FILE_BYTES,
       REMOTE_OUTPUT_BYTES, LOCK_ANSWER_BYTES, CONFIGURATIONS)
