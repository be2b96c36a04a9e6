"""``ipcshare vs-torch``: what a PyTorch user sees, ipcshare's collectives against NCCL
through torch.distributed on the same CUDA tensors (``vs_torch/``); where it cannot run
(host memory, no torch with CUDA and NCCL) one line on every rank says so."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..liveness.consensus import collective_step
from ..runtime.config import format_size, parse_size
from ..runtime.errors import ConfigError, OptionError
from ..runtime.output_files import check_writable
from ..topology.world import World
from ..vs_torch.plan import DTYPES, OPS, Options, SizePlan
from ..vs_torch.rows import failure_kind
from .exit_codes import EXIT_ERROR, EXIT_MEASUREMENT, EXIT_OK, EXIT_WRONG
from .option_origins import OptionOrigins
from .result_file import add_result_flag
from .run_pattern import check_same_run
from .size_flags import add_size_flags

__all__ = ["add_vs_torch_flags", "run_vs_torch_command", "options_from_args",
           "import_torch_with_nccl", "exit_status", "NEEDS"]

NEEDS = "vs-torch needs torch and a GPU per rank"
_FIELDS = ("min_bytes", "max_bytes", "step_factor", "datatype", "ops", "calls", "replays",
           "warmup", "host_calls")


def add_vs_torch_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of ``ipcshare vs-torch``."""
    add_size_flags(parser, smallest="8K", largest="256M", factor=4,
                   counted=" as nccl-tests counts it")
    add = parser.add_argument
    add("-d", "--datatype", "--dtype", dest="datatype", choices=tuple(DTYPES),
        default="bfloat16", help="the tensors' dtype (default bfloat16)")
    add("--ops", default=",".join(OPS),
        help=f"comma-separated, of {', '.join(OPS)} (default all)")
    add("--calls", type=int, default=20, metavar="N",
        help="calls in the graph and in the eager stretch (default 20)")
    add("--replays", type=int, default=10, metavar="N",
        help="timed replays of the graph (default 10)")
    add("-w", "--warmup", type=int, default=5, metavar="N",
        help="eager calls before timing (default 5)")
    add("--host-calls", dest="host_calls", type=int, default=100, metavar="N",
        help="calls timed on the host clock, never waited for in between (default 100: "
             "too few to fill the launch queue)")
    add("--markdown", metavar="FILE.md", help="also write the tables here (rank 0)")
    add("--json", metavar="FILE", help="every figure, fact and check (rank 0)")
    add_result_flag(parser)
    add("--no-progress", dest="progress", action="store_false",
        help="no progress on stderr (a line per row, and a line that counts the rows on "
             "runs longer than 2 s)")


def options_from_args(args: argparse.Namespace) -> Options:
    """The run's options from the flags, checked.

    Raises:
        OptionError: a value that parses but is refused (a size, a count below 1, an
            unknown op, -b above -e), naming the flag as typed.
    """
    with OptionOrigins.of(args, _FIELDS).naming_options():
        min_bytes = parse_size(args.min_bytes, what="min_bytes")
        max_bytes = parse_size(args.max_bytes, what="max_bytes")
        asked = [op.strip() for op in str(args.ops).split(",") if op.strip()]
        if not asked or any(op not in OPS for op in asked):
            raise OptionError(f"{{0}}: choose among {', '.join(OPS)}", ("ops", args.ops))
        for field in ("step_factor", "calls", "replays", "host_calls"):
            if getattr(args, field) < 1:
                raise OptionError("{0}: at least 1", (field, str(getattr(args, field))))
        if args.warmup < 0:
            raise OptionError("{0}: at least 0", ("warmup", str(args.warmup)))
        if min_bytes > max_bytes:
            raise OptionError("{0} is above {1}", ("min_bytes", args.min_bytes),
                              ("max_bytes", args.max_bytes))
    # all-to-all last: a failure there (its GPU kernel is the newest) cannot take the
    # communicator away from the other ops' rows.
    return Options(min_bytes=min_bytes, max_bytes=max_bytes, step_factor=args.step_factor,
                   dtype=args.datatype, ops=tuple(op for op in OPS if op in asked),
                   calls=args.calls, replays=args.replays, warmup=args.warmup,
                   host_calls=args.host_calls)


def import_torch_with_nccl() -> tuple[Any, Any]:
    """``(torch, torch.distributed)``, where this rank has torch with a CUDA device and
    NCCL.

    Raises:
        ConfigError: ``NEEDS``, and what is missing here.
    """
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        why = " ".join(str(exc).split()) or type(exc).__name__
        raise ConfigError(f"{NEEDS}: torch is not importable here ({why})") from None
    if not torch.cuda.is_available():
        raise ConfigError(f"{NEEDS}: this torch sees no CUDA device (host memory only?)")
    if not dist.is_available() or not dist.is_nccl_available():
        raise ConfigError(f"{NEEDS}: this torch has no torch.distributed with NCCL")
    return torch, dist


def exit_status(results: dict[str, Any]) -> int:
    """0 when every row passed its checks (refusals included); else as the pattern
    commands: 1 a step raised on some rank, 3 wrong elements, 5 a figure that failed the
    second clock or the links' ceiling."""
    kind = failure_kind(results["rows"])
    return {None: EXIT_OK, "step": EXIT_ERROR, "wrong": EXIT_WRONG,
            "check": EXIT_MEASUREMENT}[kind]


class _Progress:
    """Rank 0's progress on stderr: a line per judged row, and meanwhile a line that
    counts the rows (shown once the run has lasted 2 s)."""

    def __init__(self) -> None:
        from ..bench.progress import ProgressLine

        self.line = ProgressLine()

    def starting(self, index: int, total: int, plan: SizePlan) -> None:
        elapsed = int(self.line.elapsed_s)
        self.line.show(f"vs-torch: row {index}/{total}: {plan.op} {format_size(plan.size)} "
                       f"({elapsed // 60}:{elapsed % 60:02d} so far)")

    def done(self, index: int, total: int, row: dict[str, Any]) -> None:
        from ..vs_torch.table import row_line

        self.line.clear()
        print(f"vs-torch: [{index}/{total}] {row_line(row)}", file=sys.stderr, flush=True)


def _run_facts(options: Options, args: argparse.Namespace) -> list[tuple[str, object, str]]:
    """What every rank must run alike: ``(topic, value compared, the user's spelling)``,
    as ``run_pattern.check_same_run`` compares them."""
    named = (("the datatype", "-d", options.dtype), ("the ops", "--ops", ",".join(options.ops)),
             ("the calls", "--calls", options.calls), ("the replays", "--replays", options.replays),
             ("the warm-up", "-w", options.warmup),
             ("the host calls", "--host-calls", options.host_calls))
    sizes = (options.min_bytes, options.max_bytes, options.step_factor)
    return [("the sizes to run", sizes,
             f"-b {args.min_bytes} -e {args.max_bytes} -f {args.step_factor}"),
            *((topic, value, f"{flag} {value}") for topic, flag, value in named)]


def run_vs_torch_command(args: argparse.Namespace) -> int:
    """Run ``ipcshare vs-torch``; returns the exit status (errors raise, on every rank).

    Raises:
        ConfigError: bad options, an output file that cannot be written, ranks asking for
            different runs, or no torch with a GPU on some rank (``NEEDS``): on every
            rank alike.
    """
    from ..topology.world import mpi
    from ..vs_torch.runner import TorchComparison
    from ..vs_torch.table import render_markdown

    world = World.from_comm()
    try:
        with collective_step(world, "reading options"):
            options = options_from_args(args)
            if world.rank == 0:  # it alone writes: refuse now what would fail after the run
                check_writable(args.markdown)
                check_writable(args.json)
                check_writable(args.result)
        facts = world.comm.allgather(_run_facts(options, args))
        with collective_step(world, "comparing options"):
            check_same_run(facts)
        with collective_step(world, "looking for torch and a GPU"):
            torch, dist = import_torch_with_nccl()
    finally:
        world.close()
    progress = _Progress() if args.progress else None
    results = TorchComparison(options, torch, dist, mpi(), progress=progress).run()
    if mpi().COMM_WORLD.Get_rank() == 0:
        text = render_markdown(results)
        print(text, end="", flush=True)
        if args.markdown:
            Path(args.markdown).write_text(text)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    status = exit_status(results)
    if mpi().COMM_WORLD.Get_rank() == 0 and args.result:
        _write_result(args.result, results, status)
    if status:
        checks = results["checks"]
        first = f"; the first: {checks['errors'][0]}" if checks["errors"] else ""
        sys.stderr.write(f"ipcshare: error: {checks['failed']} row(s) of {checks['rows']} "
                         f"failed their checks (their figures are not results){first}\n")
    return status


def _write_result(path: str, results: dict[str, Any], status: int) -> None:
    """The run's result document: every row in graphs and eager, one launch."""
    from ..runtime.result_document import new_launch_id
    from ..vs_torch.result_rows import vs_torch_rows
    from .result_file import write_result

    write_result(path, tool="ipcshare vs-torch", world_size=results["facts"]["world_size"],
                 rows=vs_torch_rows(results, launch=new_launch_id()), exit_status=status,
                 extra={"options": results["options"], "ceiling": results["ceiling"]})
