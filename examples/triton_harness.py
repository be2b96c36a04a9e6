"""What the Triton examples (``triton_allgather.py``, ``triton_allreduce_rmsnorm.py``,
``triton_ring.py``) share: a group that can run Triton kernels or one line on every rank
saying why not, NCCL over the MPI world for the baseline, CUDA-graph timing, and the
per-program meeting their kernels use. Not an example itself.

The meeting. A kernel's program ``pid`` on rank r meets program ``pid`` of its peers in
words ``pid * world + q`` (written only by rank q) of a flags array in the communicator's
heap, and keeps its own call count in word ``programs * world + pid``: each program
reads and bumps only its own, so a CUDA graph replays it with no reset and no program of
a launch waits for another of the same rank. Call ``e`` (from 1) signals ``2e - 1`` on
entry (the peer's stream has reached this call: its input is written and its output may
be overwritten) and ``2e`` when done (it has stored into, or read from, its peers what
this call needs). Values only grow, waits are ``>=``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ipcshare
from ipcshare import IpcShareError
from ipcshare.runtime.config import BACKENDS, parse_size
from ipcshare.triton import require_triton

try:  # the kernels below need Triton; without it the examples refuse in one line
    import triton
    import triton.language as tl

    import ipcshare.triton as ipt
except ImportError:
    triton = None

# Programs per launch: at most one per SM of an H100, so every program of a launch is
# resident and a wait never depends on a program that cannot start. The meeting's words
# are laid out for this many, whatever grid a launch has.
MAX_PROGRAMS = 128
# Calls captured in one timed CUDA graph.
CALLS_PER_GRAPH = 10


class Refused(Exception):
    """This job cannot run the example; the message says why, in one line, and every rank
    raises it alike."""


def parser_for(doc: str, sizes: str) -> argparse.ArgumentParser:
    """The flags every Triton example takes; each may add its own."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--sizes", default=sizes,
                        help="bytes per call, comma-separated (K/M suffixes)")
    parser.add_argument("--iters", type=int, default=20,
                        help=f"graph replays timed per size ({CALLS_PER_GRAPH} calls each)")
    parser.add_argument("--checks", type=int, default=3, help="checked graph replays per size")
    parser.add_argument("--backend", default="auto", choices=BACKENDS,
                        help="a GPU backend; host memory is refused (auto picks a GPU)")
    parser.add_argument("--result", metavar="FILE",
                        help="write the timings as a result document (rank 0; docs/CLI.md)")
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None, *,
               unit: int) -> tuple[argparse.Namespace, list[int]]:
    """The flags, checked on every rank alike (exit status 2), and the sizes in bytes,
    each a positive multiple of ``unit``."""
    args = parser.parse_args(argv)
    for flag in ("--iters", "--checks"):
        value = getattr(args, flag[2:])
        if value < 1:
            parser.error(f"{flag} must be at least 1, got {value}")
    try:
        sizes = [parse_size(text) for text in args.sizes.split(",")]
    except (ValueError, IpcShareError) as exc:
        parser.error(f"--sizes {args.sizes!r}: {exc}")
    if any(size < unit or size % unit for size in sizes):
        parser.error(f"--sizes must be positive multiples of {unit} bytes, got {args.sizes}")
    if args.result:   # refused now, not after the run
        from ipcshare.runtime.output_files import check_writable

        try:
            check_writable(args.result)
        except IpcShareError as exc:
            parser.error(f"--result: {exc}")
    return args, sizes


def open_gpu(group) -> Any:
    """torch, bound to this rank's GPU, once the group can run Triton kernels.

    Raises:
        Refused: host memory, or torch missing.
        Unsupported: Triton missing or too old.
    """
    if not group.backend.device_memory:
        raise Refused("this example runs Triton kernels on GPU memory: it needs a GPU per "
                      "rank (--backend cuda-ipc or cuda-vmm), not host memory")
    require_triton()
    if triton is None:
        raise Refused("Triton is installed but does not import here")
    try:
        import torch
    except ImportError:
        raise Refused("the example's tensors are torch's: pip install torch") from None
    torch.cuda.set_device(group.backend.device)
    return torch


def main(script: str, args: argparse.Namespace,
         run: Callable[[Any, Any, argparse.Namespace], tuple[bool, list[str]]]) -> int:
    """Open the group, refuse or run ``run(group, torch, args)``; rank 0 prints its lines.
    Exit status 0 only when every check passed on every rank."""
    try:
        with ipcshare.Group(backend=args.backend) as group:
            torch = open_gpu(group)
            ok, lines = run(group, torch, args)
            if group.rank == 0:
                print("\n".join(lines), flush=True)
    except (Refused, IpcShareError) as exc:   # every rank alike: one line each, no hang
        sys.stderr.write(f"{script}: error: {exc}\n")
        return 1
    return 0 if ok else 1


def start_nccl(group, torch) -> tuple[Any, str | None]:
    """``(torch.distributed, None)`` once NCCL runs over the MPI world, else ``(None, why
    not)``, on every rank alike (the sibling example's; this folder is on sys.path when
    an example runs as a script)."""
    from torch_grad_allreduce_graph import start_nccl as start

    return start(group, torch)


def capture(torch, stream, step: Callable[[], None], calls: int) -> Any:
    """A CUDA graph of ``calls`` back-to-back ``step()`` on ``stream`` (after one eager call
    that compiles and warms it)."""
    step()
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(calls):
            step()
    return graph


def time_graph(torch, stream, graph, calls: int, iters: int, comm_world) -> float:
    """Microseconds per call over ``iters`` replays of ``graph`` (``calls`` calls each),
    the slowest rank's, CUDA events on ``stream``."""
    graph.replay()
    stream.synchronize()
    comm_world.Barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(stream)
    for _ in range(iters):
        graph.replay()
    end.record(stream)
    end.synchronize()
    return max(comm_world.allgather(start.elapsed_time(end) * 1e3 / (iters * calls)))


def meeting_flags(torch, comm) -> Any:
    """The flags of the meeting (module docstring), zeroed on every rank before any
    kernel of any rank uses them: an int64 tensor in ``comm``'s heap."""
    flags = torch.from_dlpack(comm.empty((MAX_PROGRAMS * (comm.size + 1),), torch.int64))
    flags.zero_()
    torch.cuda.synchronize()
    comm.window.barrier()
    return flags


def programs_for(count: int, block: int) -> int:
    """The grid of a launch over ``count`` elements in tiles of ``block``."""
    return max(1, min(MAX_PROGRAMS, -(-count // block)))


def verify_and_time(torch, group, stream, *, ours: Callable[[], None],
                    theirs: Callable[[], None] | None, fill: Callable[[int], None],
                    wrong: Callable[[], tuple[int, int]], checks: int, iters: int,
                    ) -> tuple[int, int, float, float | None]:
    """Capture ``ours`` (and NCCL's ``theirs``) in CUDA graphs of CALLS_PER_GRAPH calls;
    ``checks`` times: ``fill(check)`` new inputs, replay both, count ``wrong()`` (ours,
    NCCL's) elements on this rank; then time both. Returns the wrong counts summed over
    ranks and the microseconds per call (None without NCCL)."""
    comm_world = group.world.comm
    fill(0)
    graphs = [capture(torch, stream, ours, CALLS_PER_GRAPH)]
    if theirs is not None:
        graphs.append(capture(torch, stream, theirs, CALLS_PER_GRAPH))
    bad = [0, 0]
    for check in range(checks):
        fill(check + 1)
        for graph in graphs:
            graph.replay()
        stream.synchronize()
        found = wrong()
        bad = [bad[0] + found[0], bad[1] + found[1]]
    totals = [sum(comm_world.allgather(count)) for count in bad]
    times = [time_graph(torch, stream, graph, CALLS_PER_GRAPH, iters, comm_world)
             for graph in graphs]
    return totals[0], totals[1], times[0], (times[1] if theirs is not None else None)


def verdict(what: str, wrong: int, nccl_wrong: int, ours_us: float, nccl_us: float | None,
            no_nccl: str | None, checks: int, exactness: str = "bit for bit") -> str:
    """One line of an example's report; ``exactness`` says how results were compared."""
    checked = (f"verified {exactness} in {checks} graph replays" if wrong == 0
               else f"MISMATCH: #wrong {wrong} over all ranks")
    if nccl_us is None:
        return f"{what}: {checked}; Triton {ours_us:.2f} us per call (NCCL skipped: {no_nccl})"
    nccl = "" if nccl_wrong == 0 else f" (NCCL #wrong {nccl_wrong}: its time is no result)"
    return (f"{what}: {checked}; Triton {ours_us:.2f} us, NCCL {nccl_us:.2f} us per call "
            f"in CUDA graphs of {CALLS_PER_GRAPH} calls{nccl}; NCCL / Triton "
            f"{nccl_us / ours_us:.2f}")


@dataclasses.dataclass
class Setting:
    """What every size of a sweep uses: the stream, the communicator, the peer table of
    its heap, the meeting's flags, an area of the heap for the kernel's shared buffer,
    and NCCL (None, with ``no_nccl`` saying why, where it could not start)."""

    group: Any
    torch: Any
    args: argparse.Namespace
    stream: Any
    comm: Any
    view: Any
    flags: Any
    area: Any
    dist: Any
    no_nccl: str | None


@dataclasses.dataclass(frozen=True)
class Recorded:
    """What a sweep's result document calls its rows: ``op`` (as the CLI names it, or the
    example's own fused op), the ``dtype`` moved and the bytes of one unit of ``sizes``
    (an element or a row)."""

    op: str
    dtype: str
    unit_bytes: int


def result_rows(recorded: Recorded, world_size: int,
                sizes_and_figures: list[tuple[int, int, int, float, float | None]]) -> list:
    """The rows of one sweep (one launch): per size, Triton's time as ours and NCCL's in
    the same graphs as its baseline (no time where NCCL was wrong or left out)."""
    from ipcshare.runtime.result_document import (
        baseline_figure,
        figure,
        make_row,
        new_launch_id,
    )

    launch = new_launch_id()
    rows = []
    for size, bad, nccl_bad, us, nccl_us in sizes_and_figures:
        nbytes = size * recorded.unit_bytes
        baselines = [] if nccl_us is None else [baseline_figure(
            "nccl", None if nccl_bad else nccl_us, wrong=nccl_bad)]
        rows.append(make_row(op=recorded.op, size=nbytes, dtype=recorded.dtype,
                             algorithm="triton", mode="graph", world_size=world_size,
                             launch=launch, ours=figure(us), baselines=baselines, wrong=bad,
                             details={"calls_per_graph": CALLS_PER_GRAPH}))
    return rows


def sweep(group, torch, args, *, area: tuple[int, Any], sizes: list[int],
          measure: Callable[[Setting, int], tuple[int, int, float, float | None]],
          label: Callable[[int, float], str], recorded: Recorded,
          skip_nccl: str | None = None,
          exactness: str = "bit for bit") -> tuple[bool, list[str]]:
    """``measure(setting, size)`` for every size (verified, then timed: see
    ``verify_and_time``) in a communicator whose heap holds ``area`` (elements, torch
    dtype); a report line per size from ``label(size, our microseconds)``. NCCL is left
    out where ``skip_nccl`` says why. With ``--result``, rank 0 writes the sweep as a
    result document (``recorded`` names its rows)."""
    dist, no_nccl = start_nccl(group, torch) if skip_nccl is None else (None, skip_nccl)
    stream = torch.cuda.Stream()
    lines, ok = [], True
    elements, dtype = area
    heap = elements * torch.empty(0, dtype=dtype).element_size() + (1 << 20)
    try:
        with group.communicator(max_bytes=1 << 20, heap_bytes=heap) as comm, \
                torch.cuda.stream(stream):
            view = ipt.device_view(comm)
            flags = meeting_flags(torch, comm)
            shared = torch.from_dlpack(comm.empty((elements,), dtype))
            setting = Setting(group, torch, args, stream, comm, view, flags, shared, dist,
                              no_nccl)
            figures = []
            for size in sizes:
                bad, nccl_bad, us, nccl_us = measure(setting, size)
                # NCCL's wrong elements fail the run too: its figure is then no baseline.
                ok = ok and bad == 0 and nccl_bad == 0
                figures.append((size, bad, nccl_bad, us, nccl_us))
                lines.append(verdict(label(size, us), bad, nccl_bad, us, nccl_us, no_nccl,
                                     args.checks, exactness))
            view.raise_kernel_error()
    finally:
        if dist is not None:
            dist.destroy_process_group()
    if args.result and group.rank == 0:
        from ipcshare.cli.result_file import write_result

        write_result(args.result, tool=f"examples/{Path(sys.argv[0]).name}",
                     world_size=group.size, rows=result_rows(recorded, group.size, figures),
                     exit_status=0 if ok else 1, argv=["python", *sys.argv],
                     extra=None if no_nccl is None else {"nccl_left_out": no_nccl})
    return ok, lines


def measure_with(setting: Setting, *, ours: Callable[[], None], theirs: Callable[[], None],
                 fill: Callable[[int], None], wrong: Callable[[], tuple[int, int]],
                 ) -> tuple[int, int, float, float | None]:
    """``verify_and_time`` in ``setting`` (NCCL's side left out where it did not start)."""
    return verify_and_time(setting.torch, setting.group, setting.stream, ours=ours,
                           theirs=theirs if setting.dist is not None else None, fill=fill,
                           wrong=wrong, checks=setting.args.checks, iters=setting.args.iters)


if triton is not None:
    _MAX_PROGRAMS = tl.constexpr(MAX_PROGRAMS)

    @triton.jit
    def call_count(flags, world):
        """This program's call number (from 1), read from its own word."""
        pid = tl.program_id(0)
        return tl.load(flags + _MAX_PROGRAMS * world + pid, volatile=True) + 1

    @triton.jit
    def end_call(flags, world, epoch):
        """Record this program's call as done (its own word)."""
        tl.store(flags + _MAX_PROGRAMS * world + tl.program_id(0), epoch)

    @triton.jit
    def meet(flags, table, value, route: tl.constexpr):
        """Signal ``value`` in this program's words and wait until the peers that signal us
        reached it. ``route``: "all" (every peer, both ways), "next" (signal the next
        rank, wait for the previous one) or "previous" (the other way round)."""
        me = ipt.rank(table)
        world = ipt.world_size(table)
        base = tl.program_id(0) * world
        if route == "all":
            ipt.release_fence()   # one release for all peers: no round trip between signals
            for peer in range(0, world):
                if peer != me:
                    ipt.signal_relaxed(ipt.translate(flags, peer, table), base + me, value)
            for peer in range(0, world):
                if peer != me:
                    ipt.wait_until(flags, base + peer, ipt.CMP_GE, value)
        else:
            ahead = (me + 1) % world
            behind = (me + world - 1) % world
            if route == "next":
                to, source = ahead, behind
            else:
                to, source = behind, ahead
            if world > 1:
                ipt.signal(ipt.translate(flags, to, table), base + me, value)
                ipt.wait_until(flags, base + source, ipt.CMP_GE, value)
