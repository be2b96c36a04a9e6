"""What a PyTorch user sees (issue 36): ipcshare's collectives against NCCL through
torch.distributed on the user's own CUDA tensors, in one launch: same process, same
tensors, same sizes, one torch stream.

Run under mpiexec on one node, one rank per GPU (torch, mpi4py and ipcshare importable)::

    mpiexec -n 4 python tools/torch_user_table.py [-b 8K] [-e 256M] [-f 4]
        [--dtype bfloat16] [--ops all_reduce,all_gather,reduce_scatter,all_to_all]
        [--calls 20] [--replays 10] [--host-calls 100] [--markdown FILE] [--json FILE]

Sizes as nccl-tests counts them: all-reduce and all-to-all each rank's tensor, all-gather
the gathered output, reduce-scatter each rank's input (rounded down to whole blocks).
Ours against torch's, per op: ``comm.all_reduce(t, stream=s)`` / ``dist.all_reduce(t)``,
``comm.all_gather(out, t, stream=s)`` / ``dist.all_gather_into_tensor(out, t)``,
``comm.reduce_scatter(out, t, stream=s)`` / ``dist.reduce_scatter_tensor(out, t)``,
``comm.all_to_all(out, t, stream=s)`` / ``dist.all_to_all_single(out, t)``. Timings:

- graph: one torch CUDA graph of CALLS calls replayed REPLAYS times between CUDA events;
- eager: CALLS back-to-back calls between CUDA events, after WARMUP calls;
- host: Python's time per call over HOST_CALLS calls enqueued without waiting, ours bound
  (``comm.bind``, the issue's target is 2 us) and plain, and torch's.

Every figure is the slowest rank's (a float64 MPI reduction). Before any is shown: every
kind of call (ours plain, bound and graph-replayed; torch's eager and graph-replayed) is
verified once per size against exact expected values (small integers, exact in every
dtype and summation order); each event figure agrees with the host clock over the same
calls (patterns/clock_check.py: 10% + 50 us after the clock's offset); no busbw passes the
ceiling of the rank's links (topology/link_speed.py). A side with wrong elements shows
``wrong`` and is never divided by; a row failing a check shows its errors and is left out
of the ratios. An all-to-all that ipcshare refuses here is shown as refused, with why.

Exit status: 0 every row passed its checks (refusals included), 1 some row failed one, 2
the run could not start (torch with CUDA and NCCL, or mpi4py, missing; ranks sharing a
GPU; ranks on several nodes; bad options).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ipcshare.patterns.allgather import allgather_busbw_factor
from ipcshare.patterns.allreduce import allreduce_busbw_factor
from ipcshare.patterns.clock_check import ceiling_error, clock_disagreement
from ipcshare.runtime.config import format_size, parse_size
from ipcshare.runtime.errors import OptionError
from ipcshare.topology.link_speed import Ceiling

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
CALLS = {
    "all_reduce": ("comm.all_reduce(t, stream=s)", "dist.all_reduce(t)"),
    "all_gather": ("comm.all_gather(out, t, stream=s)", "dist.all_gather_into_tensor(out, t)"),
    "reduce_scatter": ("comm.reduce_scatter(out, t, stream=s)",
                       "dist.reduce_scatter_tensor(out, t)"),
    "all_to_all": ("comm.all_to_all(out, t, stream=s)", "dist.all_to_all_single(out, t)"),
}
# Ops that move bytes (checked bit for bit) rather than reduce them.
MOVED = ("all_gather", "all_to_all")
SIDES = ("ours", "torch")
MODES = ("graph", "eager")
# itemsize, significand bits (with the implicit one), largest finite value.
DTYPES = {"bfloat16": (2, 8, 3.3895313892515355e38), "float16": (2, 11, 65504.0),
          "float32": (4, 24, 3.4028234663852886e38)}
# Values repeat every PERIOD elements: a prime, so no block of a power-of-two size lines
# up with it and a block delivered to the wrong place holds other values.
PERIOD = 251
# Reductions use values in -8..8 and sums within 16 * 8 + 8 of zero: exact in bfloat16
# (integers to 256) at every partial sum of any order, up to this many ranks.
MAX_RANKS = 16
# The all-reduce's sums per element, repeating: zero or a signed power of two, so that
# in-place all-reduces compounded by a graph stay exact on a power-of-two world.
_TARGETS = (0, 1, -1, 2, -2, 4, -4)
_ROUND_BYTES = 64 << 10  # communicator sizes rounded as tests/sizing.py does
BOUND_TARGET_US = 2.0


# -- sizes ----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class SizePlan:
    """One row: ``size`` bytes as nccl-tests counts them for ``op``, the element counts
    of each rank's input and output, and ``block`` (the elements one rank gives or gets:
    all-gather's input, reduce-scatter's output, an all-to-all block; all-reduce's
    whole tensor)."""

    op: str
    size: int
    in_count: int
    out_count: int
    block: int
    itemsize: int

    @property
    def largest_bytes(self) -> int:
        """Bytes of the larger of the call's two arrays."""
        return max(self.in_count, self.out_count) * self.itemsize


def size_plan(op: str, nbytes: int, world: int, itemsize: int) -> SizePlan | None:
    """The row of ``op`` for ``nbytes`` at ``world`` ranks, counts rounded down to whole
    blocks as nccl-tests does; None where not one element per rank is left.

    Raises:
        ValueError: an op not in OPS, or a world below 1.
    """
    if op not in OPS or world < 1:
        raise ValueError(f"op={op!r}, world={world}: expected one of {OPS} and 1 rank or more")
    elements = nbytes // itemsize
    if op == "all_reduce":
        return SizePlan(op, elements * itemsize, elements, elements, elements,
                        itemsize) if elements else None
    block = elements // world
    if block == 0:
        return None
    whole = block * world
    counts = {"all_gather": (block, whole), "reduce_scatter": (whole, block),
              "all_to_all": (whole, whole)}[op]
    return SizePlan(op, whole * itemsize, *counts, block, itemsize)


def sweep(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """nccl-tests' sizes: min, min*f, ... up to max (one size for a factor below 2)."""
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size)
        if factor < 2:
            break
        size *= factor
    return sizes


def communicator_bytes(plans: Sequence[SizePlan]) -> int:
    """``max_bytes`` for a communicator that takes every call of ``plans``: the largest
    array of any, rounded up to 64 KiB (as tests/sizing.py sizes a test's)."""
    largest = max((plan.largest_bytes for plan in plans), default=0)
    return max(-(-largest // _ROUND_BYTES), 1) * _ROUND_BYTES


def busbw(op: str, size: int, seconds: float, world: int) -> float:
    """nccl-tests' bus bandwidth in GB/s of ``size`` bytes in ``seconds``: algbw times
    2(n-1)/n for all-reduce, (n-1)/n for all-gather, reduce-scatter and all-to-all."""
    factor = allreduce_busbw_factor(world) if op == "all_reduce" else (
        allgather_busbw_factor(world))
    return size / seconds / 1e9 * factor


# -- values and what each call must leave ---------------------------------------------
@dataclasses.dataclass(frozen=True)
class Segment:
    """``length`` elements of ``table`` repeated, starting at its element ``offset``
    (modulo PERIOD)."""

    table: np.ndarray
    offset: int
    length: int


def rolled(segment: Segment) -> np.ndarray:
    """One period of ``segment`` as it starts (float64): its elements are this, tiled."""
    return np.roll(np.asarray(segment.table, dtype=np.float64), -(segment.offset % PERIOD))


def materialize(segments: Sequence[Segment]) -> np.ndarray:
    """The segments' elements one after the other (float64), on the host."""
    parts = [np.tile(rolled(s), -(-s.length // PERIOD))[:s.length] for s in segments]
    return np.concatenate(parts) if parts else np.zeros(0)


def rank_table(op: str, rank: int, world: int) -> np.ndarray:
    """One period of rank ``rank``'s input for ``op`` (int64): element i of its input is
    ``table[i % PERIOD]``. Moved ops: -125..125, a pattern of its own per rank.
    Reduce-scatter: -8..8. All-reduce: -8..8 on every rank but the last, whose values
    make each element's sum zero or a signed power of two (at most 16 * 8 + 4 from zero)."""
    i = np.arange(PERIOD, dtype=np.int64)
    if op in MOVED:
        return (i * 7 + rank * 13) % 251 - 125
    small = (i * 7 + rank * 13) % 17 - 8
    if op != "all_reduce" or rank != world - 1:
        return small
    others = sum((rank_table(op, r, world) for r in range(world - 1)),
                 np.zeros(PERIOD, dtype=np.int64))
    return sum_table(op, world) - others


def sum_table(op: str, world: int) -> np.ndarray:
    """One period of what a reduction of every rank's input leaves per element (int64)."""
    if op == "all_reduce":
        return np.asarray(_TARGETS, dtype=np.int64)[np.arange(PERIOD) * 3 % len(_TARGETS)]
    return sum((rank_table(op, r, world) for r in range(world)),
               np.zeros(PERIOD, dtype=np.int64))


def input_segments(plan: SizePlan, rank: int, world: int) -> list[Segment]:
    """What rank ``rank`` puts in its input before a checked call."""
    return [Segment(rank_table(plan.op, rank, world), 0, plan.in_count)]


def expected_segments(plan: SizePlan, rank: int, world: int) -> list[Segment]:
    """What one call leaves in rank ``rank``'s output."""
    if plan.op == "all_reduce":
        return [Segment(sum_table(plan.op, world), 0, plan.out_count)]
    if plan.op == "reduce_scatter":
        return [Segment(sum_table(plan.op, world), rank * plan.block, plan.block)]
    # Moved: block q comes from rank q; for all-to-all it is rank q's block ``rank``.
    start = 0 if plan.op == "all_gather" else rank * plan.block
    return [Segment(rank_table(plan.op, q, world), start, plan.block) for q in range(world)]


def compounding_tolerance(world: int, calls: int, bits: int) -> float:
    """The relative error allowed after ``calls`` in-place all-reduces in a row: none
    after one, or where the world is a power of two (every partial sum of a signed power
    of two times at most ``world`` is exact); else one unit in the last place per hop of
    every call after the first (NCCL rounds each partial sum)."""
    if calls <= 1 or world & (world - 1) == 0:
        return 0.0
    return (calls - 1) * (world - 1) * 2.0 ** (1 - bits)


def graph_expected(plan: SizePlan, rank: int, world: int, calls: int,
                   dtype: str) -> tuple[list[Segment] | None, float]:
    """What a graph of ``calls`` calls leaves in rank ``rank``'s output (None: what one
    call leaves, ``expected_segments``), and the relative tolerance of the comparison
    (0: bit for bit). Out of place, each call leaves what one does; in-place all-reduces
    compound: each multiplies the sums by the world size (beyond the dtype's range:
    infinity of that sign)."""
    if plan.op != "all_reduce" or calls <= 1:
        return None, 0.0
    _itemsize, bits, largest = DTYPES[dtype]
    values = sum_table(plan.op, world).astype(np.float64) * float(world) ** (calls - 1)
    values = np.where(np.abs(values) > largest, np.copysign(np.inf, values), values)
    return ([Segment(values, 0, plan.out_count)],
            compounding_tolerance(world, calls, bits))


# -- the self-checks and the figures --------------------------------------------------
def max_over_ranks(comm: Any, values: Sequence[float], max_op: Any) -> np.ndarray:
    """Collective: each of ``values`` as the largest any rank of ``comm`` gave, reduced
    as one float64 buffer (``max_op``: ``MPI.MAX``). Never a pickled tuple: mpi4py
    "sums" those by concatenating them."""
    mine = np.ascontiguousarray(values, dtype=np.float64)
    largest = np.empty_like(mine)
    comm.Allreduce(mine, largest, op=max_op)
    return largest


def clock_errors(readings: dict[str, tuple[float, float]], offset_s: float) -> list[str]:
    """This rank's disagreements between each timed stretch's events and the host
    clock: ``readings`` maps a stretch's name to (event seconds, host seconds from before
    its first enqueue to after a full synchronize); ``offset_s`` is what the host clock
    reads over an empty stretch."""
    found = []
    for what, (timer_s, wall_s) in readings.items():
        error = clock_disagreement(timer_s, wall_s, what, offset_s)
        if error:
            found.append(error)
    return found


def new_row(plan: SizePlan) -> dict[str, Any]:
    """A row before it is measured: no figure, no error."""
    return {"op": plan.op, "size": plan.size, "in_count": plan.in_count,
            "out_count": plan.out_count,
            "ours": {"refused": None, "wrong": None, "wrong_by_call": {}},
            "torch": {"wrong": None, "wrong_by_call": {}},
            "errors": [], "ok": None, "ratios": {mode: None for mode in MODES}}


def _usable(figures: dict[str, Any]) -> bool:
    return not figures.get("refused") and not figures.get("wrong")


def judge_row(row: dict[str, Any], *, world: int, ceiling: Ceiling | None) -> dict[str, Any]:
    """Finish ``row`` (in place, and returned): busbw of each figure held against
    ``ceiling``, wrong elements as errors, ``ok``, and ratios ours / torch only where
    the row passed every check and both sides have a right figure."""
    errors = list(row["errors"])
    for side in SIDES:
        figures = row[side]
        if figures.get("refused"):
            continue
        if figures.get("wrong"):
            detail = ", ".join(f"{call} {n}" for call, n in figures["wrong_by_call"].items())
            errors.append(f"{side}: {figures['wrong']} wrong elements over the ranks "
                          f"({detail})")
            continue
        for mode in MODES:
            us = figures.get(f"{mode}_us")
            if us is None or us <= 0:
                continue
            bandwidth = busbw(row["op"], row["size"], us * 1e-6, world)
            figures[f"{mode}_busbw"] = round(bandwidth, 3)
            problem = ceiling_error(bandwidth, ceiling,
                                    f"{side} {mode} {row['op']} {format_size(row['size'])}")
            if problem:
                errors.append(problem)
    row["errors"] = errors
    row["ok"] = not errors
    for mode in MODES:
        ours, theirs = row["ours"].get(f"{mode}_us"), row["torch"].get(f"{mode}_us")
        usable = row["ok"] and _usable(row["ours"]) and _usable(row["torch"])
        row["ratios"][mode] = (round(ours / theirs, 4) if usable and ours is not None
                               and theirs else None)
    return row


def exit_status(results: dict[str, Any]) -> int:
    """0 when every row passed its checks, 1 otherwise."""
    return 0 if all(row["ok"] for row in results["rows"]) else 1


# -- the table --------------------------------------------------------------------------
def _number(value: float | None, digits: int = 2) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.1f}" if value >= 100 else f"{value:.{digits}f}"


def _cell(figures: dict[str, Any], key: str) -> str:
    if figures.get("refused"):
        return "refused"
    if figures.get("wrong"):
        return "wrong"
    return _number(figures.get(key))


def _ratio(row: dict[str, Any], mode: str) -> str:
    value = row["ratios"][mode]
    if value is not None:
        return f"{value:.2f}x"
    return "failed" if not row["ok"] else "—"


def render_markdown(results: dict[str, Any]) -> str:
    """The Markdown tables of a run's ``results`` (rows judged by ``judge_row``): per op
    and size the graph and eager times of both sides with their ratios and busbw, the
    errors and refusals under each op's table, then the host time per call."""
    facts = results.get("facts", {})
    options = results.get("options", {})
    calls, replays = options.get("calls", "?"), options.get("replays", "?")
    lines = ["## What a PyTorch user sees: ipcshare against NCCL through torch.distributed",
             "",
             f"{facts.get('world_size', '?')} ranks, {facts.get('gpu_count', '?')} x "
             f"{facts.get('gpu_name', '?')}, NCCL {facts.get('nccl', '?')} through torch "
             f"{facts.get('torch', '?')}, ipcshare {facts.get('commit') or '?'}, "
             f"{facts.get('date', '?')}; {options.get('dtype', '?')} tensors, sizes as "
             "nccl-tests counts them.",
             f"Graph: one torch CUDA graph of {calls} calls replayed {replays} times; eager: "
             f"{calls} back-to-back calls; µs per call, the slowest rank's; ratio = ours / "
             "torch (below 1: ours faster); busbw of the graph figures, GB/s.", ""]
    rows = results["rows"]
    for op in [op for op in OPS if any(row["op"] == op for row in rows)]:
        ours_call, torch_call = CALLS[op]
        lines += [f"### {op}: `{ours_call}` vs `{torch_call}`", "",
                  "| size | ours graph | torch graph | ratio | ours eager | torch eager | ratio "
                  "| ours busbw | torch busbw | checks |", "|---" * 10 + "|"]
        notes = []
        for row in [row for row in rows if row["op"] == op]:
            ours, theirs = row["ours"], row["torch"]
            verdict = "ok" if row["ok"] else "FAILED"
            lines.append("| " + " | ".join([
                format_size(row["size"]), _cell(ours, "graph_us"), _cell(theirs, "graph_us"),
                _ratio(row, "graph"), _cell(ours, "eager_us"), _cell(theirs, "eager_us"),
                _ratio(row, "eager"), _cell(ours, "graph_busbw"), _cell(theirs, "graph_busbw"),
                verdict]) + " |")
            size = format_size(row["size"])
            if ours.get("refused"):
                notes.append(f"- {size}: ours refused: {ours['refused']}")
            notes += [f"- {size}: {error}" for error in row["errors"]]
        lines += [""] + notes + ([""] if notes else [])
    lines += [f"### Host time per call (µs, Python, the slowest rank's; "
              f"{options.get('host_calls', '?')} calls enqueued without waiting)", "",
              "| op | size | ours bound | ours plain | torch |", "|---" * 5 + "|"]
    bound = []
    for row in rows:
        ours = row["ours"]
        lines.append(f"| {row['op']} | {format_size(row['size'])} | "
                     f"{_cell(ours, 'host_bound_us')} | {_cell(ours, 'host_plain_us')} | "
                     f"{_cell(row['torch'], 'host_us')} |")
        if not ours.get("refused") and ours.get("host_bound_us") is not None:
            bound.append(ours["host_bound_us"])
    lines.append("")
    if bound:
        met = sum(value <= BOUND_TARGET_US for value in bound)
        lines.append(f"Bound call at most {BOUND_TARGET_US:g} µs of host time: {met} of "
                     f"{len(bound)} rows (largest {max(bound):.2f} µs).")
    failed = sum(not row["ok"] for row in rows)
    lines.append(f"Rows failing a check: {failed} of {len(rows)}"
                 + (" (FAILED: their figures are not results)" if failed else "") + ".")
    return "\n".join(lines) + "\n"


# -- options --------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The options, checked (argparse exits 2 with its message on a bad one)."""
    parser = argparse.ArgumentParser(
        prog="torch_user_table.py", description=__doc__.split("\n\n")[0],
        epilog="Run under mpiexec, one rank per GPU of one node.")
    parser.add_argument("-b", "--minbytes", default="8K", help="smallest size (default 8K)")
    parser.add_argument("-e", "--maxbytes", default="256M", help="largest size (default 256M)")
    parser.add_argument("-f", "--stepfactor", type=int, default=4,
                        help="size multiplier between rows (default 4)")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="bfloat16")
    parser.add_argument("--ops", default=",".join(OPS),
                        help=f"comma-separated, of {', '.join(OPS)} (default all)")
    parser.add_argument("--calls", type=int, default=20,
                        help="calls in the graph and in the eager stretch (default 20)")
    parser.add_argument("--replays", type=int, default=10,
                        help="timed replays of the graph (default 10)")
    parser.add_argument("--warmup", type=int, default=5, help="eager calls before timing")
    parser.add_argument("--host-calls", type=int, default=100,
                        help="calls timed on the host clock, never waited for in between "
                             "(default 100: too few to fill the launch queue)")
    parser.add_argument("--markdown", metavar="FILE", help="also write the tables here")
    parser.add_argument("--json", metavar="FILE", help="every figure, fact and check")
    args = parser.parse_args(argv)
    try:
        args.min_bytes = parse_size(args.minbytes, what="-b")
        args.max_bytes = parse_size(args.maxbytes, what="-e")
    except OptionError as exc:
        parser.error(str(exc))
    args.op_list = [op.strip() for op in args.ops.split(",") if op.strip()]
    unknown = [op for op in args.op_list if op not in OPS]
    if unknown or not args.op_list:
        parser.error(f"--ops {args.ops!r}: choose among {', '.join(OPS)}")
    # all-to-all last: a failure there (its GPU kernel is the newest) cannot take the
    # communicator away from the other ops' rows.
    args.op_list = [op for op in OPS if op in args.op_list]
    for name in ("stepfactor", "calls", "replays", "host_calls"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: at least 1")
    if args.warmup < 0:
        parser.error("--warmup: at least 0")
    if args.min_bytes > args.max_bytes:
        parser.error(f"-b {args.minbytes} is above -e {args.maxbytes}")
    return args


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, import what a GPU run needs (a one-line error and 2 when it is missing),
    run, write; the exit status of the module docstring."""
    args = parse_args(argv)
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        print(f"torch_user_table: needs torch with CUDA and NCCL, and torch is not "
              f"importable here ({_one_line(exc)})", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("torch_user_table: this torch sees no CUDA device", file=sys.stderr)
        return 2
    if not dist.is_available() or not dist.is_nccl_available():
        print("torch_user_table: this torch has no torch.distributed with NCCL",
              file=sys.stderr)
        return 2
    try:
        from mpi4py import MPI
    except ImportError as exc:
        print(f"torch_user_table: needs mpi4py ({_one_line(exc)})", file=sys.stderr)
        return 2
    from ipcshare.runtime.errors import IpcShareError

    try:
        results = _Run(args, torch, dist, MPI).run()
    except (_SetupError, IpcShareError) as exc:
        print(f"torch_user_table: rank {MPI.COMM_WORLD.Get_rank()}: {_one_line(exc)}",
              file=sys.stderr)
        return 2
    return exit_status(results)


# -- driving torch and ipcshare (needs GPUs) -------------------------------------------
class _SetupError(Exception):
    """The run cannot start here (the same on every rank)."""


class _RowFailed(Exception):
    """A step of a row failed on some rank; the messages, alike on every rank."""

    def __init__(self, messages: list[str]) -> None:
        super().__init__("; ".join(messages))
        self.messages = messages


class _Refused(Exception):
    """Every rank's ipcshare refused the call: rank 0's reason."""


def _free_port() -> int:
    # Port 0: the kernel picks a free one; released before torch binds it, so a
    # collision in between fails the init loudly rather than silently.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _commit() -> str | None:
    """The checkout's commit (with ``+dirty`` for uncommitted changes), or None."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "-C", str(here), "rev-parse", "--short=12", "HEAD"],
                              capture_output=True, text=True, timeout=10, check=True)
        status = subprocess.run(["git", "-C", str(here), "status", "--porcelain",
                                 "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if status.stdout.strip() else "")


# Per-rank figures reduced in one buffer, in this order (seconds; NaN: not measured).
FIGURES = ("ours_graph", "ours_eager", "torch_graph", "torch_eager", "ours_graph_wall",
           "ours_eager_wall", "torch_graph_wall", "torch_eager_wall", "ours_host_bound",
           "ours_host_plain", "torch_host")


class _Run:
    """One launch: the group, the process group, the communicator, every row."""

    def __init__(self, args: argparse.Namespace, torch: Any, dist: Any, mpi: Any) -> None:
        self.args, self.torch, self.dist, self.MPI = args, torch, dist, mpi
        self.comm = mpi.COMM_WORLD
        self.rank, self.world = self.comm.Get_rank(), self.comm.Get_size()
        self.dtype = getattr(torch, args.dtype)
        self.int_view = torch.int16 if DTYPES[args.dtype][0] == 2 else torch.int32

    # -- setup --------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        import ipcshare
        from ipcshare.patterns.driver import run_ceiling
        from ipcshare.runtime.nvlink_multicast import keep_multicast_off

        torch, dist = self.torch, self.dist
        keep_multicast_off()  # NCCL_NVLS_ENABLE=0 unless the user set it
        if self.world > MAX_RANKS:
            raise _SetupError(f"{self.world} ranks: at most {MAX_RANKS} (the checks' sums "
                              "stay exact in bfloat16 up to there)")
        itemsize = DTYPES[self.args.dtype][0]
        plans = [plan for op in self.args.op_list
                 for size in sweep(self.args.min_bytes, self.args.max_bytes,
                                   self.args.stepfactor)
                 if (plan := size_plan(op, size, self.world, itemsize)) is not None]
        if not plans:
            raise _SetupError("no size leaves one element per rank; raise -b")
        with ipcshare.Group(backend="cuda-vmm") as group:
            if group.world.node_count != 1:
                raise _SetupError(f"ranks on {group.world.node_count} nodes: one node only "
                                  "(the rendezvous is at 127.0.0.1)")
            if group.shared_gpus:
                raise _SetupError("ranks share a GPU: NCCL needs one GPU per rank")
            self.device = group.backend.device
            torch.cuda.set_device(self.device)
            port = self.comm.bcast(_free_port() if self.rank == 0 else None, root=0)
            os.environ["MASTER_ADDR"] = "127.0.0.1"
            os.environ["MASTER_PORT"] = str(port)
            dist.init_process_group("nccl", rank=self.rank, world_size=self.world,
                                    device_id=torch.device("cuda", self.device))
            try:
                # The first collective builds NCCL's communicators: outside every timing.
                dist.barrier(device_ids=[self.device])
                torch.cuda.synchronize()
                self.ceiling = run_ceiling(group)
                with group.communicator(max_bytes=communicator_bytes(plans)) as cm:
                    self.cm = cm
                    self.stream = torch.cuda.Stream(device=self.device)
                    with torch.cuda.stream(self.stream):
                        self.offset = self._clock_offset()
                        rows = [self._row(plan) for plan in plans]
                    torch.cuda.synchronize()
                results = self._results(rows, plans)
            finally:
                dist.destroy_process_group()
        if self.rank == 0:
            self._write(results)
        return results

    def _clock_offset(self) -> float:
        from ipcshare.patterns.clock_check import clock_offset

        torch = self.torch

        def empty() -> tuple[float, float]:
            begin, end = self._events()
            torch.cuda.synchronize()
            begin.record(self.stream)
            start = time.perf_counter()
            end.record(self.stream)
            torch.cuda.synchronize()
            return begin.elapsed_time(end) / 1e3, time.perf_counter() - start
        return clock_offset(empty)

    def _events(self) -> tuple[Any, Any]:
        event = self.torch.cuda.Event
        return event(enable_timing=True), event(enable_timing=True)

    # -- steps every rank takes together ----------------------------------------------
    def _agreed(self, name: str, action: Callable[[], Any], refusable: tuple = ()) -> Any:
        """Collective: ``action()`` on every rank; a failure anywhere raises _RowFailed on
        every rank with each rank's message, a refusal (of ``refusable``) on every rank
        raises _Refused."""
        kind = message = result = None
        try:
            result = action()
        except refusable as exc:
            kind, message = "refused", _one_line(exc)
        except Exception as exc:  # any rank's failure fails the row on every rank
            kind, message = "failed", f"{type(exc).__name__}: {_one_line(exc)}"
        found = self.comm.allgather((kind, message))
        if all(k is None for k, _ in found):
            return result
        if all(k == "refused" for k, _ in found):
            raise _Refused(found[0][1])
        raise _RowFailed([f"{name}: rank {r}: {m}" if k == "failed" else
                          f"{name}: rank {r}: refused: {m}"
                          for r, (k, m) in enumerate(found) if k])

    def _values(self, segments: Sequence[Segment], count: int, dtype: Any) -> Any:
        """A device tensor of ``count`` elements holding ``segments``."""
        torch = self.torch
        out = torch.empty(count, dtype=dtype, device=self.device)
        at = 0
        for segment in segments:
            period = torch.from_numpy(rolled(segment)).to(device=self.device, dtype=dtype)
            reps = -(-segment.length // PERIOD)
            out[at:at + segment.length].copy_(period.repeat(reps)[:segment.length])
            at += segment.length
        return out

    def _wrong(self, got: Any, want: Any, tolerance: float) -> int:
        """Elements of ``got`` that are not ``want``: bit for bit, or within a relative
        ``tolerance`` (``want`` then in float32)."""
        if tolerance == 0:
            return int((got.view(self.int_view) != want.view(self.int_view)).sum().item())
        got = got.float()
        close = (got == want) | ((got - want).abs() <= tolerance * want.abs())
        return int((~close).sum().item())

    def _capture(self, call: Callable[[], None]) -> Any:
        torch = self.torch
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        # thread_local: NCCL's watchdog thread may query events while we capture.
        with torch.cuda.graph(graph, stream=self.stream, capture_error_mode="thread_local"):
            for _ in range(self.args.calls):
                call()
        torch.cuda.synchronize()
        return graph

    def _timed(self, run: Callable[[], None], times: int) -> tuple[float, float]:
        """(event seconds, host seconds from before the first enqueue to after a full
        synchronize) of ``times`` runs back to back on the stream."""
        torch = self.torch
        begin, end = self._events()
        torch.cuda.synchronize()
        self.comm.Barrier()
        begin.record(self.stream)
        start = time.perf_counter()
        for _ in range(times):
            run()
        end.record(self.stream)
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
        return begin.elapsed_time(end) / 1e3, wall

    def _host(self, call: Callable[[], None]) -> float:
        """Python's seconds per call of ``host_calls`` calls, none waited for."""
        torch = self.torch
        for _ in range(self.args.warmup):
            call()
        torch.cuda.synchronize()
        self.comm.Barrier()
        start = time.perf_counter()
        for _ in range(self.args.host_calls):
            call()
        seconds = (time.perf_counter() - start) / self.args.host_calls
        torch.cuda.synchronize()
        self.comm.Barrier()
        return seconds

    # -- one row ------------------------------------------------------------------------
    def _calls(self, op: str, out: Any, inp: Any) -> tuple[Callable, Callable, Callable]:
        """(ours plain, ours bound once here, torch's) for ``op`` on these tensors."""
        cm, dist, s = self.cm, self.dist, self.stream
        if op == "all_reduce":
            return (lambda: cm.all_reduce(inp, stream=s),
                    lambda: cm.bind("all_reduce", inp, stream=s),
                    lambda: dist.all_reduce(inp))
        ours = {"all_gather": cm.all_gather, "reduce_scatter": cm.reduce_scatter,
                "all_to_all": cm.all_to_all}[op]
        theirs = {"all_gather": dist.all_gather_into_tensor,
                  "reduce_scatter": dist.reduce_scatter_tensor,
                  "all_to_all": dist.all_to_all_single}[op]
        return (lambda: ours(out, inp, stream=s), lambda: cm.bind(op, out, inp, stream=s),
                lambda: theirs(out, inp))

    def _row(self, plan: SizePlan) -> dict[str, Any]:
        from ipcshare.patterns.clock_check import agreed_errors

        torch = self.torch
        row = new_row(plan)
        figures = dict.fromkeys(FIGURES, math.nan)
        graphs: list[Any] = []
        try:
            self._measure(plan, row, figures, graphs)
        except _RowFailed as failed:
            row["errors"] += failed.messages
        finally:
            for graph in graphs:
                graph.reset()
            torch.cuda.synchronize()
        reduced = max_over_ranks(self.comm, [figures[k] for k in FIGURES], self.MPI.MAX)
        value = {key: None if math.isnan(seconds) else float(seconds)
                 for key, seconds in zip(FIGURES, reduced, strict=True)}
        calls = self.args.calls
        per_call = {"graph": calls * self.args.replays, "eager": calls}
        for side in SIDES:
            for mode in MODES:
                seconds = value[f"{side}_{mode}"]
                row[side][f"{mode}_us"] = None if seconds is None else round(
                    seconds / per_call[mode] * 1e6, 3)
                wall = value[f"{side}_{mode}_wall"]
                row[side][f"{mode}_host_clock_us"] = None if wall is None else round(
                    wall / per_call[mode] * 1e6, 3)
        for key in ("host_bound", "host_plain"):
            seconds = value[f"ours_{key}"]
            row["ours"][f"{key}_us"] = None if seconds is None else round(seconds * 1e6, 3)
        seconds = value["torch_host"]
        row["torch"]["host_us"] = None if seconds is None else round(seconds * 1e6, 3)
        row["errors"] += agreed_errors(self.comm, row.pop("_clock_errors", []))
        judge_row(row, world=self.world, ceiling=self.ceiling)
        if self.rank == 0:
            self._progress(row)
        return row

    def _measure(self, plan: SizePlan, row: dict[str, Any], figures: dict[str, float],
                 graphs: list[Any]) -> None:
        """Collective: check every kind of call of ``plan``'s op on both sides, then time
        the sides found right, filling ``row`` and this rank's ``figures`` (seconds);
        the graphs made go into ``graphs`` (the caller releases them)."""
        torch, args = self.torch, self.args
        rank, world = self.rank, self.world
        segments, tolerance = graph_expected(plan, rank, world, args.calls, args.dtype)

        def tensors() -> tuple[Any, Any, Any, Any, Any]:
            pristine = self._values(input_segments(plan, rank, world), plan.in_count,
                                    self.dtype)
            inp = torch.empty_like(pristine)
            out = inp if plan.op == "all_reduce" else torch.empty(
                plan.out_count, dtype=self.dtype, device=self.device)
            expected = self._values(expected_segments(plan, rank, world), plan.out_count,
                                    self.dtype)
            after_graph = expected if segments is None else self._values(
                segments, plan.out_count, self.dtype if tolerance == 0 else torch.float32)
            return pristine, inp, out, expected, after_graph
        pristine, inp, out, expected, after_graph = self._agreed("allocating the tensors",
                                                                 tensors)

        def checked(run: Callable[[], None], ours: bool, want: Any = expected,
                    tol: float = 0.0) -> Callable[[], int]:
            """A step: fresh input, poisoned output, ``run()`` once, its wrong elements."""
            def check() -> int:
                inp.copy_(pristine)
                if out is not inp:
                    out.fill_(math.nan)
                torch.cuda.synchronize()
                self.comm.Barrier()
                run()
                if ours:
                    self.cm.synchronize(self.stream)  # what a kernel recorded, raised
                torch.cuda.synchronize()
                return self._wrong(out, want, tol)
            return check

        plain, bind, theirs = self._calls(plan.op, out, inp)
        wrong: dict[str, int] = {}
        ours = None  # (bound call, graph) once every check of ours ran
        try:
            ours = self._check_ours(plan, plain, bind, checked, after_graph, tolerance,
                                    wrong, graphs)
        except _Refused as refused:
            row["ours"]["refused"] = str(refused)
        wrong["torch call"] = self._agreed("torch checked call", checked(theirs, False))
        torch_graph = self._agreed("torch graph capture", lambda: self._capture(theirs))
        graphs.append(torch_graph)
        wrong["torch graph"] = self._agreed(
            "torch checked graph", checked(torch_graph.replay, False, after_graph, tolerance))
        # Wrong elements summed over the ranks, as one int64 buffer.
        mine = np.asarray(list(wrong.values()), dtype=np.int64)
        total = np.empty_like(mine)
        self.comm.Allreduce(mine, total, op=self.MPI.SUM)
        summed = dict(zip(wrong, (int(n) for n in total), strict=True))
        for side in SIDES:
            by_call = {k.split(" ", 1)[1]: n for k, n in summed.items() if k.startswith(side)}
            row[side]["wrong_by_call"] = by_call
            if side == "torch" or ours is not None:
                row[side]["wrong"] = sum(by_call.values())
        if plan.op == "all_reduce":
            inp.zero_()  # timed in place: zero is the one sum that stays what it was
        # A wrong side is not timed: it has no figure to show.
        sides = [] if row["torch"]["wrong"] else [("torch", theirs, torch_graph)]
        if ours is not None and not row["ours"]["wrong"]:
            sides.insert(0, ("ours", plain, ours[1]))
        readings: dict[str, tuple[float, float]] = {}
        for side, call, captured in sides:
            timed = self._agreed(f"{side} timing",
                                 lambda call=call, captured=captured, side=side:
                                 self._time_side(side, call, captured))
            for mode, (timer_s, wall_s) in timed.items():
                figures[f"{side}_{mode}"], figures[f"{side}_{mode}_wall"] = timer_s, wall_s
                stretch = (f"{side} {mode} {plan.op} {format_size(plan.size)} "
                           f"({args.calls} calls" + (f" x {args.replays} replays)"
                                                      if mode == "graph" else ")"))
                readings[stretch] = (timer_s, wall_s)
        if ours is not None and not row["ours"]["wrong"]:
            bound = ours[0]
            figures["ours_host_bound"] = self._agreed("ours host time, bound",
                                                      lambda: self._host(bound))
            figures["ours_host_plain"] = self._agreed("ours host time, plain",
                                                      lambda: self._host(plain))
            self._agreed("ours after host timing",
                         lambda: self.cm.synchronize(self.stream))
        figures["torch_host"] = self._agreed("torch host time", lambda: self._host(theirs))
        row["_clock_errors"] = clock_errors(readings, self.offset)

    def _check_ours(self, plan: SizePlan, plain: Callable[[], None], bind: Callable[[], Any],
                    checked: Callable[..., Callable[[], int]], after_graph: Any,
                    tolerance: float, wrong: dict[str, int],
                    graphs: list[Any]) -> tuple[Any, Any]:
        """Collective: check ours plain, bound and graph-replayed (wrong elements into
        ``wrong``); (the bound call, the graph).

        Raises:
            _Refused: every rank's ipcshare refused an all-to-all call.
        """
        from ipcshare.runtime.errors import CollectiveError, Unsupported

        refusable = (CollectiveError, Unsupported) if plan.op == "all_to_all" else ()
        wrong["ours call"] = self._agreed("ours checked call", checked(plain, True), refusable)
        bound = self._agreed("ours bind", bind, refusable)
        wrong["ours bound"] = self._agreed("ours checked bound call", checked(bound, True),
                                           refusable)
        graph = self._agreed("ours graph capture", lambda: self._capture(plain), refusable)
        graphs.append(graph)
        wrong["ours graph"] = self._agreed(
            "ours checked graph", checked(graph.replay, True, after_graph, tolerance),
            refusable)
        return bound, graph

    def _time_side(self, side: str, call: Callable[[], None],
                   captured: Any) -> dict[str, tuple[float, float]]:
        """(event seconds, host-clock seconds) of ``side``'s eager stretch of ``calls``
        calls, after ``warmup`` calls, and of ``replays`` replays of its graph."""
        for _ in range(self.args.warmup):
            call()
        eager = self._timed(call, self.args.calls)
        captured.replay()  # the first launch uploads the graph
        in_graph = self._timed(captured.replay, self.args.replays)
        if side == "ours":
            self.cm.synchronize(self.stream)  # what a kernel recorded, raised
        return {"eager": eager, "graph": in_graph}

    # -- outputs --------------------------------------------------------------------------
    def _results(self, rows: list[dict[str, Any]], plans: list[SizePlan]) -> dict[str, Any]:
        torch = self.torch
        offsets = max_over_ranks(self.comm, [self.offset], self.MPI.MAX)
        version = torch.cuda.nccl.version()
        nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        import ipcshare

        facts = {
            "world_size": self.world, "hostname": socket.gethostname(),
            "gpu_name": torch.cuda.get_device_name(self.device),
            "gpu_count": torch.cuda.device_count(), "nccl": nccl,
            "torch": torch.__version__.split("+")[0], "ipcshare": ipcshare.__version__,
            "commit": _commit() if self.rank == 0 else None,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE"),
        }
        failed = [row for row in rows if not row["ok"]]
        return {
            "tool": "torch_user_table", "facts": facts,
            "options": {"dtype": self.args.dtype, "ops": self.args.op_list,
                        "sizes": sorted({plan.size for plan in plans}),
                        "calls": self.args.calls, "replays": self.args.replays,
                        "warmup": self.args.warmup, "host_calls": self.args.host_calls,
                        "max_bytes": communicator_bytes(plans)},
            "ceiling": None if self.ceiling is None else self.ceiling.to_dict(),
            "clock_offset_us": round(float(offsets[0]) * 1e6, 3),
            "checks": {"rows": len(rows), "failed": len(failed),
                       "refused": sum(bool(row["ours"]["refused"]) for row in rows),
                       "errors": [f"{row['op']} {format_size(row['size'])}: {error}"
                                  for row in failed for error in row["errors"]]},
            "rows": rows,
        }

    def _progress(self, row: dict[str, Any]) -> None:
        ours, theirs = row["ours"], row["torch"]
        print(f"torch_user_table: {row['op']} {format_size(row['size'])}: graph "
              f"{_cell(ours, 'graph_us')} vs {_cell(theirs, 'graph_us')} us, eager "
              f"{_cell(ours, 'eager_us')} vs {_cell(theirs, 'eager_us')} us"
              + ("" if row["ok"] else f", FAILED ({len(row['errors'])} errors)"),
              file=sys.stderr, flush=True)

    def _write(self, results: dict[str, Any]) -> None:
        text = render_markdown(results)
        print(text, end="", flush=True)
        if self.args.markdown:
            Path(self.args.markdown).write_text(text)
        if self.args.json:
            Path(self.args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
