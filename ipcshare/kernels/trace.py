"""The collective kernels' phase stamps (kernels/include/ipcshare/trace.cuh) on the host:
which build carries them, reading them after a call, and what they say.

A traced build (``IPCSHARE_KERNEL_TRACE=1`` when the backend first compiles
collectives.cu) stamps two clocks at each mark a kernel reaches, from thread 0 of its
first TRACE_BLOCKS blocks: the SM's cycle counter and the GPU's globaltimer. Every block
(up to TRACE_SPAN_BLOCKS) also keeps the globaltimer of its first and its latest mark, so
the whole kernel's span and the gap to the next call are known. Each call lands in a slot
of its own (the block's count of calls modulo TRACE_CALLS), so one read after a CUDA graph
of up to TRACE_CALLS calls holds every one of them. Cycles time a
phase exactly but only within one SM; the globaltimer is comparable everywhere but its
resolution depends on the GPU. So offsets are cycles, converted to nanoseconds at the
ratio the two clocks show over many calls at once (``ns_per_cycle``), where a coarse
globaltimer's error spreads over a long span. tools/probes/timing/kernel_trace.py runs a collective
and prints what each phase cost."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..runtime import settings

__all__ = ["TRACE_BLOCKS", "TRACE_MARKS", "TRACE_CALLS", "TRACE_SPAN_BLOCKS", "TRACE_SYMBOL",
           "KERNEL_MARKS", "build_options", "KernelTrace", "TraceRead", "ns_per_cycle",
           "mark_offsets_ns", "MarkRow", "summarize", "call_spans", "SpanSummary",
           "summarize_spans"]

# trace.cuh's kTraceBlocks, kTraceMarks, kTraceCalls and kTraceSpanBlocks
# (tests/unit/test_kernel_trace.py compares them).
TRACE_BLOCKS = 4
TRACE_MARKS = 16
TRACE_CALLS = 8
TRACE_SPAN_BLOCKS = 1024
TRACE_SYMBOL = "ipcshare_trace"
TRACE_SPAN_SYMBOL = "ipcshare_trace_span"
TRACE_CALLS_SYMBOL = "ipcshare_trace_calls"
# Each symbol's shape (uint64), as trace.cuh defines it.
_SHAPES = {TRACE_SYMBOL: (TRACE_CALLS, TRACE_BLOCKS, TRACE_MARKS, 2),
           TRACE_SPAN_SYMBOL: (TRACE_CALLS, TRACE_SPAN_BLOCKS, 2),
           TRACE_CALLS_SYMBOL: (TRACE_SPAN_BLOCKS,)}
_TRACE_DEFINE = "-DIPCSHARE_KERNEL_TRACE"
# The one unit whose kernels carry marks (all of KERNEL_MARKS): one module, so one stamps
# buffer orders every traced call.
TRACED_UNIT = "collectives_all_to_all.cu"

# The marks each entry point stamps, in the order it stamps them (its marks in its .cuh).
_PULL = ("begun", "staged", "met", "headers and rows read", "read", "ended")
_BALANCED = ("begun", "staged", "part signalled", "met", "headers and rows read", "read",
             "ended")
_LL = ("begun", "pushed", "digests checked", "received", "ended")
_LL_V = ("begun", "pushed", "digests checked", "rows read and checked", "received", "ended")
KERNEL_MARKS: dict[str, tuple[str, ...]] = {
    "all_to_all_pull_bytes": _PULL,
    "all_to_all_v_pull_bytes": _PULL,
    "all_to_all_balanced_bytes": _BALANCED,
    "all_to_all_v_balanced_bytes": _BALANCED,
    "all_to_all_ll_bytes": _LL,
    "all_to_all_v_ll_bytes": _LL_V,
    "all_to_all_ll128_bytes": _LL,
    "all_to_all_v_ll128_bytes": _LL_V,
    "all_to_all_push_bytes": ("begun", "met, headers read", "tile 0 stored",
                              "tile 0 signalled", "the peers' tile 0 came", "every step done",
                              "ended"),
    "all_to_all_v_push_bytes": ("begun", "row published", "met", "rows read and checked",
                                "tile 0 stored", "tile 0 signalled", "the peers' tile 0 came",
                                "every step done", "ended"),
    "all_to_all_v_eager_bytes": ("begun", "row pushed", "digests checked",
                                 "rows read and checked", "tile 0 stored", "tile 0 signalled",
                                 "the peers' tile 0 came", "every step done", "ended"),
}


def build_options(source: str) -> tuple[str, ...]:
    """NVRTC options for ``source``: the trace's define where the setting asks for it
    and the source carries marks, else none (the usual build)."""
    if source == TRACED_UNIT and settings.kernel_trace():
        return (_TRACE_DEFINE,)
    return ()


@dataclasses.dataclass(frozen=True)
class TraceRead:
    """One read of the stamps: ``stamps[call, block, mark, clock]`` (clock 0: cycles, 1:
    globaltimer ns) and ``spans[call, block, edge]`` (edge 0: the block's mark 0, 1: its
    latest mark; globaltimer ns), 0 where nothing was stamped; ``call`` is the slot, the
    order of the calls since the last reset."""

    stamps: np.ndarray
    spans: np.ndarray


class KernelTrace:
    """The stamps of a traced module (``LoadedKernels``): ``reset(stream)`` before a call
    or a graph replay on that stream, ``read()`` after it has finished (the caller
    synchronizes).

    Raises:
        RuntimeError: the module was built without stamps.
    """

    def __init__(self, kernels: Any) -> None:
        from ..runtime.errors import CudaError

        self.arrays: dict[str, tuple[int, int]] = {}
        for symbol, shape in _SHAPES.items():
            try:
                ptr, nbytes = kernels.global_array(symbol)
            except CudaError:
                raise RuntimeError("the collective kernels were built without phase stamps: "
                                   "set IPCSHARE_KERNEL_TRACE=1 before the group is made"
                                   ) from None
            expected = int(np.prod(shape)) * 8
            if nbytes != expected:
                raise RuntimeError(f"{symbol} holds {nbytes} bytes, expected {expected}: "
                                   "trace.cuh and kernels/trace.py disagree")
            self.arrays[symbol] = (ptr, nbytes)

    def reset(self, stream: Any = None) -> None:
        """Zero the stamps and the calls' counts, on ``stream`` (any stream the
        communicator takes) before the call's kernel, or at once with the context
        synchronized (None): a plain memset goes on the legacy stream, which a non-blocking
        stream (torch's) does not wait for."""
        from ..runtime.cuda_driver import check, driver

        if stream is not None:
            from ..backends.cuda_streams import stream_handle

            handle = driver.CUstream(stream_handle(stream))
            for ptr, nbytes in self.arrays.values():
                check("cuMemsetD8Async", driver.cuMemsetD8Async(ptr, 0, nbytes, handle))
            return
        for ptr, nbytes in self.arrays.values():
            check("cuMemsetD8", driver.cuMemsetD8(ptr, 0, nbytes))
        check("cuCtxSynchronize", driver.cuCtxSynchronize())

    def read(self) -> TraceRead:
        """What the calls since the last ``reset`` stamped."""
        from ..runtime.cuda_driver import check, driver

        out = {}
        for symbol in (TRACE_SYMBOL, TRACE_SPAN_SYMBOL):
            ptr, nbytes = self.arrays[symbol]
            out[symbol] = np.zeros(_SHAPES[symbol], np.uint64)
            check("cuMemcpyDtoH", driver.cuMemcpyDtoH(out[symbol].ctypes.data, ptr, nbytes))
        return TraceRead(out[TRACE_SYMBOL], out[TRACE_SPAN_SYMBOL])


def _reached(stamps: np.ndarray) -> np.ndarray:
    """[block, mark]: whether the mark was stamped (a zero globaltimer never is)."""
    return stamps[:, :, 1] != 0


def ns_per_cycle(calls: Sequence[np.ndarray]) -> float:
    """The ratio of globaltimer nanoseconds to cycles over every block's span (its first
    to its last reached mark) of every call, pooled: the longer the sum, the less a coarse
    globaltimer matters. NaN where no block spans two marks with time between them."""
    cycles = nanoseconds = 0
    for stamps in calls:
        reached = _reached(stamps)
        for block in range(stamps.shape[0]):
            marks = np.flatnonzero(reached[block])
            if marks.size < 2:
                continue
            first, last = stamps[block, marks[0]], stamps[block, marks[-1]]
            if last[0] > first[0] and last[1] >= first[1]:
                cycles += int(last[0] - first[0])
                nanoseconds += int(last[1] - first[1])
    return nanoseconds / cycles if cycles and nanoseconds else float("nan")


def mark_offsets_ns(stamps: np.ndarray, scale: float) -> np.ndarray:
    """[block, mark]: nanoseconds from the block's mark 0 to each mark, from cycles at
    ``scale`` ns a cycle; NaN where the mark (or the block's mark 0) was not reached."""
    reached = _reached(stamps)
    cycles = stamps[:, :, 0].astype(np.float64)
    offsets = (cycles - cycles[:, :1]) * scale
    offsets[~reached] = np.nan
    offsets[~reached[:, 0]] = np.nan
    return offsets


@dataclasses.dataclass(frozen=True)
class MarkRow:
    """One mark over the calls: the median (and 10th / 90th percentiles) of block 0's
    time from mark 0 to it, the median of the slowest traced block's, the median step
    from the mark before it (block 0), and in how many calls block 0 reached it."""

    name: str
    median_us: float
    p10_us: float
    p90_us: float
    slowest_us: float
    step_us: float
    reached: int


def summarize(calls: Sequence[np.ndarray], names: Sequence[str]) -> tuple[float,
                                                                             list[MarkRow]]:
    """(ns a cycle, a row per named mark) over ``calls`` (each ``KernelTrace.read()``)."""
    scale = ns_per_cycle(calls)
    if not calls:
        return scale, []
    offsets = np.stack([mark_offsets_ns(stamps, scale) for stamps in calls])  # call, block, mark
    rows = []
    for mark, name in enumerate(names[:TRACE_MARKS]):
        first = offsets[:, 0, mark]
        seen = first[~np.isnan(first)]
        # The slowest traced block of each call that any block reached the mark in.
        slowest = np.array([np.max(blocks[~np.isnan(blocks)])
                            for blocks in offsets[:, :, mark] if not np.all(np.isnan(blocks))])
        step = first - offsets[:, 0, mark - 1] if mark else first
        step = step[~np.isnan(step)]
        if seen.size == 0:
            rows.append(MarkRow(name, *(float("nan"),) * 5, 0))
            continue
        rows.append(MarkRow(name, float(np.median(seen)) / 1e3,
                            float(np.percentile(seen, 10)) / 1e3,
                            float(np.percentile(seen, 90)) / 1e3,
                            float(np.median(slowest)) / 1e3 if slowest.size else float("nan"),
                            float(np.median(step)) / 1e3 if step.size else float("nan"),
                            int(seen.size)))
    return scale, rows


def call_spans(spans: np.ndarray) -> list[tuple[int, int, int] | None]:
    """Per slot of ``TraceRead.spans``: (the first block's mark 0, the latest mark of any
    block, the blocks that stamped), globaltimer ns; None for a slot no block stamped."""
    out: list[tuple[int, int, int] | None] = []
    for slot in spans:
        began = slot[:, 0] != 0
        if not began.any():
            out.append(None)
            continue
        out.append((int(slot[began, 0].min()), int(slot[began, 1].max()), int(began.sum())))
    return out


@dataclasses.dataclass(frozen=True)
class SpanSummary:
    """Over calls: the median (and 90th percentile) of a kernel's span, from its first
    block's mark 0 to the latest mark of any block; of the gap from there to the next
    call's first mark 0 (back-to-back calls of one graph replay); the blocks that stamped
    (fewest, most); and how many spans and gaps were counted."""

    span_us: float
    span_p90_us: float
    gap_us: float
    gap_p90_us: float
    blocks: tuple[int, int]
    spans: int
    gaps: int


def summarize_spans(reads: Sequence[np.ndarray], skip: int = 0) -> SpanSummary:
    """``reads``: ``TraceRead.spans`` of several samples, each a call or a graph replay of
    calls; the first ``skip`` slots of each left out of the spans (a replay's first call
    starts with the launch). Gaps are between consecutive stamped slots of one read."""
    spans, gaps, blocks = [], [], []
    for read in reads:
        calls = call_spans(read)
        for slot, edges in enumerate(calls):
            if edges is None:
                continue
            if slot >= skip:
                spans.append(edges[1] - edges[0])
                blocks.append(edges[2])
            following = calls[slot + 1] if slot + 1 < len(calls) else None
            if following is not None:
                gaps.append(following[0] - edges[1])

    def stat(values: list[int], q: float) -> float:
        return float(np.percentile(values, q)) / 1e3 if values else float("nan")

    return SpanSummary(stat(spans, 50), stat(spans, 90), stat(gaps, 50), stat(gaps, 90),
                       (min(blocks), max(blocks)) if blocks else (0, 0), len(spans), len(gaps))
