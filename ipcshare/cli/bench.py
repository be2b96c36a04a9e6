"""``ipcshare bench``: a suite from YAML, run in one launch, with tables on screen, a
closing summary, and JSON / PNG / Markdown outputs."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from ..liveness.consensus import collective_step
from ..runtime.errors import ConfigError
from ..topology.world import World, describe_disagreement
from .result_file import add_result_flag

__all__ = ["run_bench_command", "add_bench_flags", "check_same_suite"]


def add_bench_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of ``ipcshare bench``."""
    add = parser.add_argument
    add("--config", required=True, metavar="FILE.yaml",
        help="the suite: ops, backends, algorithms, timing modes, sizes, baselines")
    add("--json", metavar="FILE", help="write a JSON list of case documents (rank 0)")
    add("--plot", metavar="FILE.png", help="draw busbw and time against size: .png, .svg or "
        ".pdf (needs matplotlib)")
    add("--markdown", metavar="FILE.md", help="write a report: machine, summary, plot, tables")
    add_result_flag(parser)
    add("--repeat", type=int, metavar="K", help="run the whole suite K times; report medians "
        "and min/max (overrides the suite's repeat)")
    add("--min-bw", dest="min_bw", type=float, metavar="GBPS",
        help="exit with status 4 when any case's average busbw is below GBPS")
    add("--baseline", metavar="NAMES",
        help="none, or some of mpi, nccl, torch, torch-symm, comma-separated (overrides "
             "the suite's baselines)")
    add("--no-progress", dest="progress", action="store_false",
        help="no progress line on stderr (it appears on runs longer than 2 s)")


def run_bench_command(args: argparse.Namespace) -> int:
    """Run ``ipcshare bench``; returns the exit status (errors raise, on every rank)."""
    from ..bench.machine import machine_facts
    from ..bench.progress import ProgressLine
    from ..bench.report import summary_lines
    from ..bench.runner import run_suite
    from ..bench.suite import load_suite
    world = World.from_comm()
    try:
        with collective_step(world, "checking the output files"):
            if world.rank == 0:  # only rank 0 writes, and its folders may be its own
                _check_outputs(args)
        with collective_step(world, "reading the suite"):
            suite = load_suite(args.config, overrides={
                "repeat": args.repeat, "min_bw": args.min_bw, "baselines": args.baseline})
        # Before any window: ranks running other cases would otherwise be named only by
        # the window sizes their cases make.
        facts = world.comm.allgather((_suite_flags(args), _what_runs(suite)))
        with collective_step(world, "comparing suites"):
            check_same_suite(facts)
        facts = machine_facts(world)
        progress = ProgressLine() if world.rank == 0 and args.progress else None

        def emit(line: str) -> None:
            if progress is not None:
                progress.clear()
            print(line, flush=True)

        try:
            result = run_suite(suite, world, emit=emit, progress=progress)
        finally:
            if progress is not None:
                progress.clear()  # an error line must not land on top of it
        if world.rank == 0:
            for line in summary_lines(result):
                print(line, flush=True)
        status, complaint = _exit_verdict(result, suite)
        with collective_step(world, "writing the outputs"):
            if world.rank == 0:
                _write_outputs(args, result, facts)
                if args.result:
                    _write_result(args.result, result, status, world.size,
                                  getattr(args, "typed", None))
    finally:
        world.close()
    if complaint:
        sys.stderr.write(f"ipcshare: error: {complaint}\n")
    return status


def _exit_verdict(result, suite) -> tuple[int, str]:
    """The suite's exit status and, when not 0, the line that says why."""
    from .exit_codes import EXIT_MEASUREMENT, EXIT_OK, EXIT_SLOW, EXIT_WRONG

    if result.wrong_total:
        return EXIT_WRONG, f"{result.wrong_total} wrong elements"
    errors = [error for case in result.cases for error in case.result.measurement_errors]
    if errors:
        return EXIT_MEASUREMENT, (f"{len(errors)} measurement error(s), figures that are not "
                                  f"results; the first: {errors[0]}")
    if suite.min_bw is not None:
        slow = result.below(suite.min_bw)
        if slow:
            names = "; ".join(f"{record.case.label} {record.result.avg_busbw:.2f} GB/s"
                              for record in slow)
            return EXIT_SLOW, f"average busbw below --min-bw {suite.min_bw:g} GB/s: {names}"
    return EXIT_OK, ""


def _write_result(path: str, result, status: int, world_size: int,
                  argv: list[str] | None = None) -> None:
    """The suite's result document: every case's rows, one launch (the suite ran in one
    job, each case's baselines beside it)."""
    from ..patterns.result_rows import rows_from_run_json
    from ..runtime.result_document import new_launch_id
    from .result_file import write_result

    launch, rows, errors = new_launch_id(), [], []
    for document in result.documents():
        if document.get("skipped"):
            continue
        case_rows = rows_from_run_json(
            document, launch=launch, dtype=document.get("datatype"),
            algorithm=document.get("algorithm"), extra_baselines=document["baselines"][1:])
        for row in case_rows:
            row.setdefault("details", {})["case"] = document["case"]
        rows += case_rows
        errors += document.get("measurement_errors", [])
    write_result(path, tool="ipcshare bench", world_size=world_size, rows=rows,
                 exit_status=status, measurement_errors=errors,
                 extra={"suite": result.suite.name}, argv=argv)


def _suite_flags(args: argparse.Namespace) -> str:
    """The flags that make this rank's suite, as given."""
    flags = [f"--config {args.config}"]
    flags += [f"--{flag} {getattr(args, flag)}" for flag in ("repeat", "baseline")
              if getattr(args, flag) is not None]
    return " ".join(flags)


def _what_runs(suite) -> tuple:
    """What must be the same on every rank: the cases and how they run (not where the
    suite came from, nor the bandwidth floor each rank checks by itself)."""
    return (suite.cases, suite.exchange, suite.handle, suite.repeat, suite.rotate_buffers)


def check_same_suite(facts: list[tuple[str, tuple]]) -> None:
    """Raise unless every rank's suite (``(flags, what runs)``, by rank) runs the same
    cases, naming each rank's flags, or its cases where the flags read alike.

    Raises:
        ConfigError: the ranks would run different cases.
    """
    if all(runs == facts[0][1] for _flags, runs in facts):
        return
    flags = [given for given, _runs in facts]
    if any(given != flags[0] for given in flags):
        raise ConfigError("ranks disagree on the suite: " + describe_disagreement(
            flags, verb=("asks for", "ask for"), then="for"))
    suites = [runs for _flags, runs in facts]
    firsts = sorted({suites.index(runs) for runs in suites})  # first rank of each suite
    numbers = [1 + firsts.index(suites.index(runs)) for runs in suites]
    raise ConfigError(
        f"ranks read different suites from the same flags ({flags[0]}): "
        + describe_disagreement(numbers, verb=("reads", "read"), spell=lambda n: f"suite {n}")
        + ": does the file, or the backend 'auto' finds, differ between nodes?")


def _check_outputs(args: argparse.Namespace) -> None:
    """Refuse before a long run what would fail after it: no matplotlib for --plot, or a
    figure name that says no format; an output whose folder is missing or not writable."""
    if args.plot:
        from ..bench.plot import plot_format, require_matplotlib

        plot_format(args.plot)
        require_matplotlib()
    for flag in ("json", "plot", "markdown", "result"):
        path = getattr(args, flag)
        if not path:
            continue
        folder = Path(path).resolve().parent
        if Path(path).is_dir():
            raise ConfigError(f"--{flag} {path!r} is a directory; give a file name")
        if not folder.is_dir():
            raise ConfigError(f"cannot write --{flag} {path!r}: folder {str(folder)!r} "
                              "does not exist")
        if not os.access(folder, os.W_OK):
            raise ConfigError(f"cannot write --{flag} {path!r}: folder {str(folder)!r} "
                              "is not writable")


def _write_outputs(args: argparse.Namespace, result, facts: dict) -> None:
    if args.json:
        try:
            with open(args.json, "w") as out:
                json.dump(result.documents(), out, indent=1)
                out.write("\n")
        except OSError as exc:
            raise ConfigError(f"cannot write {args.json!r}: {exc.strerror}") from None
    if args.plot:
        from ..bench.plot import write_plot

        write_plot(result, facts, args.plot)
    if args.markdown:
        from ..bench.report import write_markdown

        write_markdown(result, facts, args.markdown, plot_path=args.plot or None)
