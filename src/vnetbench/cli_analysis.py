"""Command line for analysis: ``compare``, ``baseline set|list``, ``history``.

Thin like :mod:`vnetbench.cli`: parse, call :mod:`vnetbench.analysis`, print
with :mod:`vnetbench.report.terminal`. Exit status: 0 ok, 1 a regression with
``--fail-on regression``, 2 usage errors (a :class:`VnetbenchError`, turned
into a message and status 2 by ``cli.main``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.markup import escape

from vnetbench.cli_common import DEFAULT_DB, err, open_store, out
from vnetbench.errors import VnetbenchError
from vnetbench.metrics import HEADLINE
from vnetbench.output import check_target, output_file, write_text

FAIL_ON = ("regression",)
# Literals rather than imports: building the parser must not load scipy (a second at every `vnetbench --help`).
# tests/unit/test_analysis.py checks they agree with vnetbench.analysis and vnetbench.stats.
DEFAULT_ALPHA = 0.05
DEFAULT_METRICS_HELP = HEADLINE  # vnetbench.metrics is light: no scipy behind it


def _json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    sys.stdout.flush()


# ---------------------------------------------------------------- compare


def _compare_mode(args: argparse.Namespace) -> str:
    n = len(args.runs)
    if n > 2:
        raise VnetbenchError(f"compare takes one or two runs, got {n}: `compare A B`, `compare RUN --baseline`, "
                             "or `compare RUN --by LABEL --ref VALUE`")
    if args.ref is not None and args.by is None:
        raise VnetbenchError("--ref VALUE goes with --by LABEL (e.g. --by env --ref bare)")
    if n == 2:
        if args.baseline is not None or args.by is not None:
            raise VnetbenchError("with two runs, compare needs neither --baseline nor --by: "
                                 "the first run is the reference (A), the second is judged (B)")
        return "runs"
    if args.baseline is not None and args.by is not None:
        raise VnetbenchError("--baseline compares a run with another, --by compares within one run: choose one")
    if args.baseline is not None:
        return "baseline"
    if args.by is not None:
        return "within"
    raise VnetbenchError(f"compare {args.runs[0]}: compare with what? Give a second run (compare A B), "
                         "--baseline [NAME], or --by LABEL --ref VALUE")


def comparison_from_args(args: argparse.Namespace, store) -> tuple[Any, list[str]]:
    """The comparison `args` ask for (two runs, a run and its baseline, or label values within a run) and the
    runs it involves, reference first. `compare` and `report` share it, so the page and the terminal give the
    same verdicts for the same options; options a parser lacks take compare's defaults."""
    from vnetbench import analysis

    mode = _compare_mode(args)
    seed = getattr(args, "seed", 0)
    if seed < 0:
        raise VnetbenchError(f"--seed {seed}: give a non-negative integer")
    options = dict(
        metrics=getattr(args, "metric", None), all_metrics=getattr(args, "all_metrics", False),
        alpha=getattr(args, "alpha", DEFAULT_ALPHA), seed=seed,
        noise_overrides=analysis.parse_noise_overrides(getattr(args, "noise", None)),
        noise_default=(analysis.parse_fraction(args.noise_default, "--noise-default")
                       if hasattr(args, "noise_default") else analysis.DEFAULT_NOISE),
    )
    if mode == "runs":
        a, b = (store.resolve_run(r) for r in args.runs)
        return analysis.compare_runs(store, a, b, **options), [a, b]
    if mode == "baseline":
        b = store.resolve_run(args.runs[0])
        a = analysis.baseline_for(store, b, args.baseline or None)
        name = args.baseline or analysis.default_baseline_name(store, b)
        report = analysis.compare_runs(store, a, b, title=f"vnetbench compare {b} --baseline {name}", **options)
        report.notes.insert(0, f"A is baseline {name!r} (run {a})")
        return report, [a, b]
    run_id = store.resolve_run(args.runs[0])
    if args.ref is None:
        values = sorted({str(c["labels"][args.by]) for c in store.configurations(run_id) if args.by in c["labels"]})
        hint = f": one of {', '.join(values)}" if values else ""
        raise VnetbenchError(f"--by {args.by} needs --ref VALUE, the reference value of {args.by}{hint}")
    return analysis.compare_within(store, run_id, args.by, args.ref, **options), [run_id]


def wants_comparison(args: argparse.Namespace) -> bool:
    return args.baseline is not None or args.by is not None or args.ref is not None


def cmd_compare(args: argparse.Namespace) -> int:
    from vnetbench.report.terminal import comparison_view

    for target, what in ((args.report, "report"), (args.junit, "JUnit XML")):
        if target:
            check_target(target, args.db, what)  # before the work, and before the other file is written
    with open_store(args) as store:
        report, run_ids = comparison_from_args(args, store)
        if args.report:
            from vnetbench.report.html import write_report

            path = write_report(store, run_ids, args.report, comparison=report.to_dict())
            err.print(f"report: {path}", soft_wrap=True, highlight=False)

    if args.json:
        _json(report.to_dict())
    else:
        comparison_view(report, out)
    if args.junit:
        path = write_text(args.junit, report.junit(), args.db, what="JUnit XML")
        err.print(f"JUnit XML written to {path}")
    if not report.pairs:
        raise VnetbenchError("no configuration was compared: the runs have no configuration (labels) in common")
    if args.fail_on == "regression":
        gate = err if args.json else out
        if report.regressed:
            names = "; ".join(f"{r.metric} ({p.config if report.kind == 'runs' else p.pair + ', ' + p.config})"
                              for p, r in report.regressions)
            gate.print(f"[bold red]FAIL[/] (--fail-on regression): {len(report.regressions)} regressed: {names}")
            return 1
        gate.print("[green]PASS[/] (--fail-on regression): no metric regressed")
    return 0


# ---------------------------------------------------------------- baselines


def cmd_baseline_set(args: argparse.Namespace) -> int:
    from vnetbench import analysis

    with open_store(args) as store:
        name, run_id = analysis.set_baseline(store, args.run, args.name)
        run = store.run(run_id)
    out.print(f"baseline [bold]{escape(name)}[/] = run {escape(run_id)} ({escape(run['scenario_name'])}, "
              f"{escape(run['status'])}); compare with it: vnetbench compare RUN --baseline"
              + ("" if name == run["scenario_name"] else f" {escape(name)}"))
    if run["status"] != "completed":
        err.print(f"[yellow]note:[/] run {run_id} is {run['status']}, not completed: some trials are missing")
    return 0


def cmd_baseline_list(args: argparse.Namespace) -> int:
    from vnetbench import analysis
    from vnetbench.report.terminal import baselines_table

    with open_store(args) as store:
        rows = analysis.baselines(store)
        if args.json:
            _json(rows)
        elif not rows:
            out.print(f"no baselines in {store.path}; set one with `vnetbench baseline set RUN`")
        else:
            out.print(baselines_table(rows, store.path))
    return 0


# ---------------------------------------------------------------- history


def cmd_history(args: argparse.Namespace) -> int:
    from vnetbench import analysis
    from vnetbench.report.terminal import history_view

    magnitude = analysis.parse_fraction(args.min_magnitude, "--min-magnitude") if args.min_magnitude else None
    if args.csv and args.csv != "-":
        check_target(args.csv, args.db, "CSV")
    with open_store(args) as store:
        hist = analysis.history(store, args.metric, where=analysis.parse_where(args.where), scenario=args.scenario,
                                min_magnitude=magnitude)
    if args.csv == "-":
        hist.write_csv(sys.stdout)
        return 0
    if args.csv:
        path = Path(args.csv)
        with output_file(path, args.db, what="CSV", newline="") as f:
            rows = hist.write_csv(f)
        err.print(f"{rows} runs written to {path} (columns: time, {hist.metric}"
                  f"{'' if len(hist.lines) == 1 else ' per configuration'})")
    if args.json:
        _json(hist.to_dict())
    else:
        history_view(hist, out)
    return 0


# ---------------------------------------------------------------- parsers


def register(sub) -> None:
    """Add ``compare``, ``baseline`` and ``history`` to the CLI's subparsers."""
    def with_db(sp: argparse.ArgumentParser) -> argparse.ArgumentParser:
        sp.add_argument("--db", default=DEFAULT_DB, help=f"results database (default ./{DEFAULT_DB})")
        return sp

    sp = with_db(sub.add_parser(
        "compare", help="compare runs (A B), a run with a baseline, or variants within a run; verdict per metric",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Per configuration (matched by its key, never by position) and metric: the two-sided\n"
                    "Mann-Whitney U p-value (Holm-adjusted across the metrics of a configuration), the\n"
                    "relative change of the medians with a seeded bootstrap 95% CI, Cliff's delta, and a\n"
                    "verdict: improved, regressed, unchanged or inconclusive. Changed only when p < alpha\n"
                    "and the whole CI lies beyond the noise threshold; no verdict below 4 trials per side.",
        epilog="examples:\n"
               "  vnetbench compare A B --fail-on regression      # exit 1 if anything regressed\n"
               "  vnetbench baseline set RUN                      # baseline named after RUN's scenario\n"
               "  vnetbench compare RUN --baseline --junit junit.xml\n"
               "  vnetbench compare RUN --by env --ref bare       # every env against bare, within RUN\n"
               "exit status: 0 ok, 1 a regression with --fail-on regression, 2 usage errors"))
    sp.add_argument("runs", nargs="+", metavar="RUN", help="A B (A is the reference), or one run with --baseline/--by")
    sp.add_argument("--baseline", nargs="?", const="", default=None, metavar="NAME",
                    help="compare RUN with a stored baseline (default: the one named after RUN's scenario)")
    sp.add_argument("--by", metavar="LABEL", help="within one run: compare the values of this label ...")
    sp.add_argument("--ref", metavar="VALUE", help="... with this reference value (e.g. --by env --ref bare)")
    sp.add_argument("--metric", action="append", metavar="M",
                    help=f"metric to judge (repeatable; default: those of {', '.join(DEFAULT_METRICS_HELP)} "
                         "that are stored)")
    sp.add_argument("--all-metrics", action="store_true",
                    help="judge every stored metric (a larger Holm family needs more trials)")
    sp.add_argument("--alpha", type=float, default=DEFAULT_ALPHA, help="significance level (default 0.05)")
    sp.add_argument("--noise", action="append", metavar="METRIC=FRACTION",
                    help="noise threshold of one metric, e.g. --noise rtt.p99_ms=10%% (repeatable)")
    sp.add_argument("--noise-default", default="5%", metavar="FRACTION",
                    help="noise threshold of metrics without their own (default 5%%)")
    sp.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0): same data, same intervals")
    sp.add_argument("--json", action="store_true", help="print the comparison as JSON instead of a table")
    sp.add_argument("--junit", metavar="FILE", help="also write JUnit XML: one test case per configuration and metric")
    sp.add_argument("--fail-on", choices=FAIL_ON, help="exit 1 when any metric regressed (for CI gates)")
    sp.add_argument("--report", metavar="FILE",
                    help="also write the HTML report of the runs compared, with this comparison's table")
    sp.set_defaults(func=cmd_compare)

    bp = sub.add_parser("baseline", help="name a run as the baseline that `compare RUN --baseline` uses")
    bsub = bp.add_subparsers(dest="baseline_command", required=True, metavar="ACTION")
    sp = with_db(bsub.add_parser("set", help="make RUN a baseline"))
    sp.add_argument("run", help="run id (or a unique prefix, or 'last')")
    sp.add_argument("--name", help="baseline name (default: the run's scenario name)")
    sp.set_defaults(func=cmd_baseline_set)
    sp = with_db(bsub.add_parser("list", help="list baselines"))
    sp.add_argument("--json", action="store_true", help="as JSON")
    sp.set_defaults(func=cmd_baseline_list)

    sp = with_db(sub.add_parser(
        "history", help="a metric's median per run over time, with change points",
        description="The per-run median of a metric over every stored run of a scenario, oldest first, one line "
                    "per configuration, with change points by E-divisive means (window 50, p 0.001, minimum "
                    "magnitude = the metric's noise threshold).",
        epilog="example: vnetbench history --metric throughput.rx_mbps --where proto=udp --csv rx.csv"))
    sp.add_argument("--metric", required=True, metavar="M", help="e.g. throughput.rx_mbps")
    sp.add_argument("--where", action="append", metavar="LABEL=VALUE",
                    help="only configurations with this label value (repeatable), e.g. --where proto=udp")
    sp.add_argument("--scenario", metavar="NAME", help="scenario name (default: the latest run's)")
    sp.add_argument("--min-magnitude", metavar="FRACTION",
                    help="smallest change point worth reporting (default: the metric's noise threshold)")
    sp.add_argument("--csv", metavar="FILE", help="also write time,metric columns as CSV ('-': stdout only), as change-point tools read them")
    sp.add_argument("--json", action="store_true", help="print as JSON instead of tables")
    sp.set_defaults(func=cmd_history)
