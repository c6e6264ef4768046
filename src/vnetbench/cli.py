"""Command line: parse arguments, call the stages, print. Nothing else lives here.

Exit status: 0 success, 1 a gate failed (e.g. a regression with --fail-on),
2 usage errors and problems the message explains, 130 interrupted, 141 the
reader of standard output closed it (``| head``).
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
from pathlib import Path

from rich.markup import escape

from vnetbench import __version__
from vnetbench.cli_analysis import register as register_analysis
from vnetbench.cli_common import DEFAULT_DB, EXIT_CLOSED_PIPE, err, open_store, out
from vnetbench.errors import VnetbenchError
from vnetbench.lab.teardown import Interrupted, interruption_behind
from vnetbench.output import check_target, output_file
from vnetbench.scenario import MAX_CONFIGURATIONS

def cmd_doctor(args: argparse.Namespace) -> int:
    from vnetbench.runner import places

    place = places.from_args(args)
    if args.fidelity and place.name != "lab":
        raise VnetbenchError(f"doctor --fidelity measures this machine's link emulation; run it without the "
                             f"{place.name} options")
    status = place.doctor(args)
    if args.fidelity:
        return max(status, _doctor_fidelity())
    return status


def _doctor_fidelity() -> int:
    """Measure the link backends against issue 5's targets (impair/fidelity.py, as bench/emulator.py)."""
    import os

    from vnetbench import units
    from vnetbench.impair import capacity, fidelity

    if os.geteuid() != 0:
        raise VnetbenchError("doctor --fidelity builds a lab of network namespaces: run it with sudo")
    out.print("\n[bold]link emulation fidelity[/] (about four minutes; userspace backend judged, "
              "kernel backends side by side)")
    checks = fidelity.run_all(progress=lambda m: err.print(f"  measuring {m} ...", highlight=False))
    out.print(escape(fidelity.table(checks)), highlight=False, soft_wrap=True)
    passed, total = fidelity.summary(checks)
    out.print(f"userspace backend (vnb-link): {passed} of {total} targets met (load average "
              f"{os.getloadavg()[0]:.2f})")
    rows = capacity.rows_of(checks)
    if rows:  # for the scenarios that scale their rates to this machine ([scale] to = "measured")
        try:
            where = capacity.save(rows)
        except OSError as e:
            err.print(f"[yellow]the capacity was not stored ({escape(str(e))}): scenarios with [scale] "
                      "to = \"measured\" run at their fallback rate[/]")
        else:
            rate, _ = capacity.line_rate()
            line = f"a line rate of at most {units.format_rate(rate)}" if rate else "their fallback rate"
            out.print(f"capacity stored in {escape(str(where))}: scenarios that scale to it (static-congestion) "
                      f"run at {line}")
    return 0 if passed == total else 1


def cmd_run(args: argparse.Namespace) -> int:
    from vnetbench.runner import places, run as runner
    from vnetbench.scenario.load import load

    if args.resume:
        if args.scenario or args.set:
            raise VnetbenchError("--resume RUN continues a stored run as it was planned; give no SCENARIO or --set")
        if args.report:
            check_target(args.report, args.db, what="report")
        runner.check_root()
        with open_store(args) as store:
            summary = runner.resume(store, args.resume, console=err, progress=not args.no_progress,
                                    allow_concurrent=args.allow_concurrent, place=places.from_args(args),
                                    calibrate=not args.no_calibration)
            return _after_run(args, store, summary)
    if not args.scenario:
        raise VnetbenchError("vnetbench run: give a SCENARIO (a built-in name or a .toml file), or --resume RUN")
    loaded = load(args.scenario, args.set or [])
    if args.report:
        check_target(args.report, args.db, what="report")  # not after an hour of trials
    runner.check_root()  # before the database is touched: not root means nothing at all happens
    with open_store(args, create=True) as store:
        summary = runner.execute(loaded, store, console=err, progress=not args.no_progress,
                                 max_configurations=args.max_configurations, allow_concurrent=args.allow_concurrent,
                                 place=places.from_args(args), calibrate=not args.no_calibration)
        return _after_run(args, store, summary)


def cmd_plan(args: argparse.Namespace) -> int:
    from vnetbench.report.terminal import plan_view
    from vnetbench.runner.preview import make_plan
    from vnetbench.scenario.load import load

    plan = make_plan(load(args.scenario, args.set or []), args.max_configurations)
    if args.json:
        print(json.dumps(plan.as_json(), indent=1, default=str))
    else:
        plan_view(plan, out)
    return 0


def cmd_image(args: argparse.Namespace) -> int:
    from vnetbench.kube import image as kube_image

    if args.push:
        try:
            registry = kube_image.registry_address(args.push)
        except ValueError as e:
            raise VnetbenchError(f"--push: {e}") from None
        pushed = kube_image.push(registry, tls_verify=not args.no_tls_verify)
        out.print(f"pushed {escape(pushed.name)} ({pushed.digest})", highlight=False, soft_wrap=True)
        out.print(f"run with it: \\[kube] registry = \"{escape(registry)}\""
                  f"{' and registry_tls_verify = false' if args.no_tls_verify else ''} (the run pushes it again, "
                  "sending only what the registry lacks), or kube.image = the name above with "
                  "kube.image_pull_policy = \"IfNotPresent\"", highlight=False, soft_wrap=True)
        return 0
    image = kube_image.tools_image()
    with output_file(args.oci, what="image", binary=True) as f:
        f.write(image.archive)
    out.print(f"wrote {escape(args.oci)}: {escape(image.name)} ({image.digest}, {len(image.archive) / 2**20:.0f} MiB)",
              highlight=False, soft_wrap=True)
    out.print(f"load it on each node of a cluster: ctr -n k8s.io images import {escape(args.oci)}", highlight=False,
              soft_wrap=True)
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from vnetbench.scenario.schema import schema_text

    text = schema_text()
    if args.output and args.output != "-":
        with output_file(args.output, what="schema") as f:
            f.write(text)
        err.print(f"scenario schema written to {args.output}", highlight=False, soft_wrap=True)
    else:
        sys.stdout.write(text)
    return 0


def _max_configurations(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def _after_run(args: argparse.Namespace, store, summary) -> int:
    from vnetbench.report.relative import show_relative
    from vnetbench.report.terminal import show

    show(store, summary.run_id, out)
    show_relative(store, summary.run_id, out)
    if summary.trials_failed:
        out.print(f"[yellow]{summary.trials_failed} of {summary.trials_ok + summary.trials_failed} trials failed[/]; "
                  f"reasons are stored with each trial (vnetbench show {summary.run_id})")
    if args.report:
        path = _write_report(store, [summary.run_id], args.report)
        out.print(f"report: {path}", soft_wrap=True, highlight=False)
    print(f"run: {summary.run_id}", flush=True)
    return 0


def _write_report(store, run_ids: list[str], path: str) -> Path:
    from vnetbench.report.html import write_report

    return write_report(store, run_ids, path)


def cmd_runs(args: argparse.Namespace) -> int:
    from vnetbench.report.terminal import runs_table

    with open_store(args) as store:
        out.print(runs_table(store))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from vnetbench.report.terminal import show

    from vnetbench.report.relative import show_relative

    with open_store(args) as store:
        run_id = store.resolve_run(args.run)
        if args.json:
            from vnetbench.report.terminal import summary_rows

            rows = [r for r in summary_rows(store, run_id) if not args.metric or r["metric"] in args.metric]
            print(json.dumps({"run_id": run_id, "summaries": rows}, indent=1, default=str))
            return 0
        show(store, run_id, out, metrics=args.metric, detail=args.detail)
        show_relative(store, run_id, out, detail=args.detail)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from vnetbench.report.export import export

    with open_store(args) as store:
        run_id = store.resolve_run(args.run)
        if args.output and args.output != "-":
            with output_file(args.output, store.path, what="export", newline="") as f:
                n = export(store, run_id, args.format, f, what=args.what)
            err.print(f"{n} {'points of series' if args.what == 'series' else args.what} written to {args.output}")
        else:
            from vnetbench.console import TerminalText

            # cleaned only when it is a terminal
            export(store, run_id, args.format, TerminalText(sys.stdout), what=args.what)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from vnetbench.cli_analysis import comparison_from_args, wants_comparison

    with open_store(args) as store:
        if wants_comparison(args):
            from vnetbench.report.html import write_report

            comparison, ids = comparison_from_args(args, store)
            path = write_report(store, ids, args.output, comparison=comparison.to_dict())
        else:
            ids = [store.resolve_run(r) for r in args.runs]
            path = _write_report(store, ids, args.output)
    out.print(f"report: {path}", soft_wrap=True, highlight=False)
    return 0


def cmd_clean(args: argparse.Namespace) -> int:
    from vnetbench.runner import places

    return places.from_args(args).clean(args)


def build_parser() -> argparse.ArgumentParser:
    from vnetbench.runner import places

    p = argparse.ArgumentParser(
        prog="vnetbench", description="Reproducible network performance experiments.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit status: 0 success; 1 a gate failed (compare --fail-on) or doctor found a problem; "
               "2 a problem the message explains\n(bad scenario, missing tool, unwritable output, ...); "
               "130 interrupted; 141 standard output closed by its reader (| head)")
    p.add_argument("--version", action="version", version=f"vnetbench {__version__}")
    p.add_argument("--debug", action="store_true",
                   help="on an error, also print the Python traceback (for a bug report)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def with_db(sp: argparse.ArgumentParser) -> argparse.ArgumentParser:
        sp.add_argument("--db", default=DEFAULT_DB, help=f"results database (default ./{DEFAULT_DB})")
        return sp

    sp = sub.add_parser("doctor", help="what this machine can do, and what is missing")
    sp.add_argument("--fidelity", action="store_true",
                    help="also measure how faithfully the link backends emulate delay, rate, queue, loss, "
                         "jitter and schedules (builds a lab; about 90 s)")
    places.add_arguments(sp, "doctor")
    sp.set_defaults(func=cmd_doctor)

    sp = with_db(sub.add_parser("run", help="run a scenario (built-in name or .toml file)"))
    sp.add_argument("scenario", nargs="?", help="built-in name (quick, congestion) or path to a .toml file")
    sp.add_argument("--set", action="append", metavar="KEY=VALUE",
                    help="override a scenario key, e.g. --set bottleneck=50Mbit --set ratios=[0.6,2]")
    sp.add_argument("--resume", metavar="RUN", help="finish the remaining trials of an interrupted run")
    sp.add_argument("--report", metavar="FILE", help="also write the HTML report to FILE")
    sp.add_argument("--no-progress", action="store_true", help="no progress bar (for logs)")
    sp.add_argument("--max-configurations", type=_max_configurations, default=MAX_CONFIGURATIONS, metavar="N",
                    help=f"refuse a matrix of more configurations (default {MAX_CONFIGURATIONS:,})")
    sp.add_argument("--allow-concurrent", action="store_true",
                    help="measure even while another vnetbench run measures on this machine (refused by "
                         "default: both would load the same cores); recorded in the run and its report")
    sp.add_argument("--no-calibration", action="store_true",
                    help="skip the machine's calibration before and after the run (a fixed CPU loop and a bare veth "
                         "stream, about 3 s each time), which `show` and `compare` use to tell a changed machine "
                         "from a changed result")
    places.add_arguments(sp, "run")
    sp.set_defaults(func=cmd_run)

    sp = sub.add_parser("plan", help="check a scenario and say what a run would do, cost and need (no root, "
                                     "builds and writes nothing)")
    sp.add_argument("scenario", help="built-in name (quick, congestion) or path to a .toml file")
    sp.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a scenario key, as for run")
    sp.add_argument("--json", action="store_true", help="the plan as JSON (for CI jobs and scripts)")
    sp.add_argument("--max-configurations", type=_max_configurations, default=MAX_CONFIGURATIONS, metavar="N",
                    help=f"refuse a matrix of more configurations (default {MAX_CONFIGURATIONS:,})")
    sp.set_defaults(func=cmd_plan)

    sp = sub.add_parser("schema", help="print the JSON Schema of scenario files, for editors (a `#:schema` "
                                       "line binds a file to it: docs/reference/schema.md)")
    sp.add_argument("-o", "--output", metavar="FILE", help="write it to FILE (default: standard output)")
    sp.set_defaults(func=cmd_schema)

    sp = with_db(sub.add_parser("runs", help="list stored runs"))
    sp.set_defaults(func=cmd_runs)

    sp = with_db(sub.add_parser("show", help="summary table of a run"))
    sp.add_argument("run", help="run id (or a unique prefix, or 'last')")
    sp.add_argument("--metric", action="append", help="metrics to show (default: the main ones)")
    sp.add_argument("--detail", action="store_true",
                    help="full cells: median, its exact 95%% CI, mean ± sd, min..max, p5-95, CV, outliers, "
                         "theory (default: one line per configuration, median ±CI%% with marks)")
    sp.add_argument("--json", action="store_true",
                    help="every metric's full summary (n, median and CI, mean, sd, CV, min, max, p5, p95, "
                         "quartiles, Tukey fences and outliers) as JSON")
    sp.set_defaults(func=cmd_show)

    sp = with_db(sub.add_parser("export", help="one record per sample (or series point, or trial), as CSV or JSON"))
    sp.add_argument("run")
    sp.add_argument("--format", choices=["csv", "json"], default="csv")
    what = sp.add_mutually_exclusive_group()
    what.add_argument("--series", dest="what", action="store_const", const="series",
                      help="the per-second series instead (throughput per flow, RTT per probe, cwnd, ...): one "
                           "record per point, t in seconds from the trial's start")
    what.add_argument("--trials", dest="what", action="store_const", const="trials",
                      help="one record per trial instead: its status, reason and raw record (what its tools "
                           "printed, the CPU shares per core, the cores its processes ran on, ...)")
    sp.set_defaults(what="samples")
    sp.add_argument("-o", "--output", help="file (default: standard output)")
    sp.set_defaults(func=cmd_export)

    sp = with_db(sub.add_parser("report", help="write a self-contained HTML report"))
    sp.add_argument("runs", nargs="+", metavar="RUN",
                    help="one run, or several (the first is the reference of the comparison table)")
    sp.add_argument("-o", "--output", default="report.html")
    sp.add_argument("--baseline", nargs="?", const="", default=None, metavar="NAME",
                    help="compare RUN with a stored baseline in the report (default: the one named after "
                         "RUN's scenario); `vnetbench compare ... --report FILE` gives every compare option")
    sp.add_argument("--by", metavar="LABEL", help="within one run: compare the values of this label ...")
    sp.add_argument("--ref", metavar="VALUE", help="... with this reference value (e.g. --by env --ref bare)")
    sp.set_defaults(func=cmd_report)

    sp = sub.add_parser("image", help="write vnetbench's tools image (this machine's tools) as an OCI image layout, "
                        "or push it to a registry, for the nodes of a Kubernetes cluster (run --kube)")
    where = sp.add_mutually_exclusive_group(required=True)
    where.add_argument("--oci", metavar="FILE", help="the tar to write (`ctr -n k8s.io images import FILE` loads it "
                       "on a node)")
    where.add_argument("--push", metavar="REGISTRY", help="push it to a registry the nodes pull from "
                       "(host[:port][/path]: REGISTRY/vnetbench/tools:DIGEST), with skopeo and this machine's "
                       "registry credentials")
    sp.add_argument("--no-tls-verify", action="store_true", help="with --push: a registry over plain HTTP or with "
                    "a certificate this machine does not trust")
    sp.set_defaults(func=cmd_image)

    sp = sub.add_parser("clean", help="remove namespaces and processes left by a killed run")
    sp.add_argument("--dry-run", action="store_true", help="only list what would be removed")
    sp.add_argument("--check", action="store_true", help="exit 1 if anything of ours is left (for CI)")
    places.add_arguments(sp, "clean")
    sp.set_defaults(func=cmd_clean)

    register_analysis(sub)  # compare, baseline, history
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status = args.func(args)
        sys.stdout.flush()  # a closed pipe or a full disk is found here, not at interpreter exit
        return status
    except VnetbenchError as e:
        if args.debug:
            err.print_exception()
        err.print(f"[red]vnetbench:[/] {escape(str(e))}", highlight=False)
        return 2
    except (Interrupted, KeyboardInterrupt) as e:
        interrupted(e)
        return 130
    except BrokenPipeError:
        _silence_stdout()
        err.print("vnetbench: standard output was closed by its reader (e.g. `| head`); output stopped there",
                  highlight=False)
        return EXIT_CLOSED_PIPE
    except OSError as e:
        why = _FILE_PROBLEMS.get(e.errno or 0)
        if why is None:
            raise  # not a condition of the machine we can explain: a bug, whose traceback is wanted
        if args.debug:
            err.print_exception()
        if e.filename is None:
            _silence_stdout()
        where = f"cannot write {e.filename}" if e.filename is not None else "cannot write standard output"
        err.print(f"vnetbench: {where}: {why}", highlight=False)
        return 2
    except Exception as e:
        stop = interruption_behind(e)
        if stop is None:
            raise  # a bug: its traceback is wanted
        if args.debug:
            err.print_exception()
        interrupted(stop)
        return 130


# Failures of a file the user named (or of standard output) that say what to do, rather than a traceback.
_FILE_PROBLEMS = {
    errno.ENOSPC: "the disk is full; free space and run the command again",
    errno.EDQUOT: "the disk quota is used up; free space and run the command again",
    errno.EROFS: "the file system is read-only; choose another place",
    errno.EACCES: "permission denied; choose another place or fix its permissions",
}


def interrupted(e: BaseException) -> None:
    """The one line for a stop asked by SIGINT or SIGTERM: what happened to the lab, what to do next."""
    if isinstance(e, Interrupted) and e.lab_up:
        err.print(f"[yellow]vnetbench: interrupted ({e.signame}); the lab was torn down. "
                  "Finished trials are stored; `vnetbench run --resume RUN` completes the run.[/]")
    else:  # before a lab was built (checks, imports) or after it was torn down (storing the run's end)
        name = e.signame if isinstance(e, Interrupted) else "SIGINT"
        err.print(f"[yellow]vnetbench: interrupted ({name}); no lab was up at that moment. A stored run that did "
                  "not finish is listed as interrupted by `vnetbench runs` and completed by `--resume`.[/]")


def _silence_stdout() -> None:
    """Point standard output at /dev/null: what is still buffered cannot fail again at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
