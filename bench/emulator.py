"""Link emulation fidelity: every target of issue 5 measured on a real lab,
the userspace emulator (vnb-link) with kernel tbf (and netem where the kernel
has it) side by side in the same run, for rate and buffer.

    sudo .venv/bin/python bench/emulator.py [--quick]

Prints target, backend, goal, achieved and pass/fail per target (the same
table as `vnetbench doctor --fidelity`); exits 1 when a userspace target is
missed. Kernel rows are measured with the same goal for comparison; tbf has
no delay, so its rate is measured without one (said in the row). Capacity is
measured for 1 and 8 flows with the endpoints' offloads off and on, next to
the kernel bridge's in the same run: three runs of each cell, taken in turn,
judged by their median (--quick: one run). Takes about four minutes. The
load average is printed: on a busy machine the emulator competes for its
core and the tails show it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from vnetbench.impair import fidelity


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer samples and shorter flows (CI)")
    args = p.parse_args()
    if os.geteuid() != 0:
        print("bench/emulator.py builds a lab of network namespaces: run it as root", file=sys.stderr)
        return 2
    t0 = time.time()
    load0 = os.getloadavg()[0]
    settings = fidelity.Settings.quick() if args.quick else fidelity.Settings()
    checks = fidelity.run_all(settings, progress=lambda m: print(f"  measuring {m} ...", file=sys.stderr,
                                                                  flush=True))
    print(fidelity.table(checks))
    passed, total = fidelity.summary(checks)
    print(f"\nuserspace backend (vnb-link): {passed} of {total} targets met; "
          f"load average {load0:.2f} at start, {os.getloadavg()[0]:.2f} at end; {time.time() - t0:.0f} s")
    return 0 if passed == total else 1


if __name__ == "__main__":
    sys.exit(main())
