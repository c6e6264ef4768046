"""Which modules one trial passes through, and how often control comes back to a module it left.

Runs a one-configuration scenario (an iperf3 stream with ping during it, through the lab's 100 Mbit/s tbf
bottleneck) in this process, with a profile hook on every call and return of vnetbench's code while
`run_trial` runs, and prints, for its first stored trial:

- the modules the trial passes through, in the order it first enters them, with how many times each was
  entered;
- the transitions (control moving from one module to another) and the returns (entries into a module the
  trial had already left).

Run as root, from a clone:  .venv/bin/python bench/datapath.py
Another version's code:     PYTHONPATH=/path/to/other/clone/src .venv/bin/python bench/datapath.py
(the issue-30 "data path before and after": run it on two commits and compare the two tables).
"""

from __future__ import annotations

import sys
import tempfile
from collections import Counter
from pathlib import Path

SCENARIO = """
name = "datapath"
[lab]
senders = 1
[workload.stream]
tool = "iperf3"
duration = "1s"
omit = "0s"
[workload.probe]
tool = "ping"
interval = "100ms"
during = "stream"
[repeat]
repetitions = 1
warmup = false
"""


class Tracer:
    """Module of the running vnetbench frame after every call and return, while a trial runs."""

    def __init__(self) -> None:
        self.inside = 0  # depth of run_trial calls (a bench's run_trial may call its parent's)
        self.trials: list[list[str]] = []

    def __call__(self, frame, event: str, arg) -> None:
        if event not in ("call", "return"):
            return
        module = frame.f_globals.get("__name__", "")
        if not module.startswith("vnetbench."):
            return
        if frame.f_code.co_name == "run_trial" and module.startswith("vnetbench.runner"):
            if event == "call":
                self.inside += 1
                if self.inside == 1:
                    self.trials.append([])
            else:
                self.inside -= 1
                return
        if not self.inside:
            return
        if event == "return":  # control goes back to the caller's module
            caller = frame.f_back
            module = caller.f_globals.get("__name__", "") if caller is not None else ""
            if not module.startswith("vnetbench."):
                return
        path = self.trials[-1]
        if not path or path[-1] != module:
            path.append(module)


def main() -> int:
    from vnetbench import cli

    work = Path(tempfile.mkdtemp(prefix="vnb-datapath-"))
    scenario = work / "datapath.toml"
    scenario.write_text(SCENARIO)
    tracer = Tracer()
    sys.setprofile(tracer)
    try:
        status = cli.main(["run", str(scenario), "--db", str(work / "r.db"), "--no-progress"])
    finally:
        sys.setprofile(None)
    if status != 0 or not tracer.trials:
        print(f"the run did not complete a trial (exit {status})", file=sys.stderr)
        return 1
    path = tracer.trials[0]
    entries = Counter(path)
    print(f"vnetbench from {Path(cli.__file__).resolve().parent}")
    print(f"one trial: {len(entries)} modules, {len(path) - 1} transitions, "
          f"{sum(n - 1 for n in entries.values())} returns to a module it had left")
    for module in dict.fromkeys(path):
        print(f"  {entries[module]:5d}  {module}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
