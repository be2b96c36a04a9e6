"""The kernels' phase stamps (kernels/include/ipcshare/trace.cuh, kernels/trace.py,
tools/probes/timing/kernel_trace.py) without a GPU: the build that carries them is asked for
only by IPCSHARE_KERNEL_TRACE=1 and only for the all-to-all unit; the usual build's kernels
are the same machine code as if the marks were not there, and it has no stamps buffer; the
traced build has one, of the size the host reads, and its kernels still fit a block; every
traced kernel stamps exactly the marks the host names for it, in order; and the summary
turns stamps into the right microseconds (made-up stamps: offsets, percentiles, the slowest
block, steps, marks not reached, the cycle-to-nanosecond ratio pooled over calls). The two
builds are compiled and compared in test_kernels.py."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from ipcshare.kernels import KERNEL_SOURCES, trace
from ipcshare.runtime import settings
from ipcshare.runtime.errors import CudaError
from tests.example_runs import load_example

_ROOT = Path(__file__).resolve().parents[2]
_SRC = _ROOT / "ipcshare" / "kernels" / "src" / "collectives"
_HEADER = _ROOT / "ipcshare" / "kernels" / "include" / "ipcshare" / "trace.cuh"
_TOOL = _ROOT / "tools" / "probes" / "timing" / "kernel_trace.py"


def test_the_host_reads_the_buffers_the_header_defines():
    text = _HEADER.read_text()
    for name, value in (("kTraceBlocks", trace.TRACE_BLOCKS), ("kTraceMarks", trace.TRACE_MARKS),
                        ("kTraceCalls", trace.TRACE_CALLS),
                        ("kTraceSpanBlocks", trace.TRACE_SPAN_BLOCKS)):
        assert int(re.search(rf"{name} = (\d+);", text).group(1)) == value, name
    flat = " ".join(text.split())
    assert (f"unsigned long long {trace.TRACE_SYMBOL}[ipcshare::kTraceCalls]"
            "[ipcshare::kTraceBlocks][ipcshare::kTraceMarks][2];") in flat
    assert (f"unsigned long long {trace.TRACE_SPAN_SYMBOL}[ipcshare::kTraceCalls] "
            "[ipcshare::kTraceSpanBlocks][2];") in flat
    assert f"unsigned long long {trace.TRACE_CALLS_SYMBOL}[ipcshare::kTraceSpanBlocks];" in flat


def test_the_traced_build_is_asked_for_by_the_setting_and_only_for_the_collectives(
        monkeypatch):
    monkeypatch.delenv(settings.KERNEL_TRACE, raising=False)
    assert trace.build_options(trace.TRACED_UNIT) == ()
    monkeypatch.setenv(settings.KERNEL_TRACE, "1")
    assert trace.build_options(trace.TRACED_UNIT) == ("-DIPCSHARE_KERNEL_TRACE",)
    for other in set(KERNEL_SOURCES) - {trace.TRACED_UNIT}:
        assert trace.build_options(other) == ()
    monkeypatch.setenv(settings.KERNEL_TRACE, "0")
    assert trace.build_options(trace.TRACED_UNIT) == ()


# (file, the kernel function whose body holds the marks, the entry points it runs).
_KERNELS = [
    ("all_to_all.cuh", "all_to_all_pull", ("all_to_all_pull_bytes", "all_to_all_v_pull_bytes")),
    ("all_to_all_balanced.cuh", "all_to_all_balanced",
     ("all_to_all_balanced_bytes", "all_to_all_v_balanced_bytes")),
    ("all_to_all_ll.cuh", "all_to_all_ll", ("all_to_all_ll_bytes",)),
    ("all_to_all_ll.cuh", "all_to_all_v_ll", ("all_to_all_v_ll_bytes",)),
    ("all_to_all_ll128.cuh", "all_to_all_ll128", ("all_to_all_ll128_bytes",)),
    ("all_to_all_ll128.cuh", "all_to_all_v_ll128", ("all_to_all_v_ll128_bytes",)),
    ("all_to_all_push.cuh", "all_to_all_push", ("all_to_all_push_bytes",)),
    ("all_to_all_v_push.cuh", "all_to_all_v_push", ("all_to_all_v_push_bytes",)),
    ("all_to_all_v_eager.cuh", "all_to_all_v_eager", ("all_to_all_v_eager_bytes",)),
]


# Helpers that stamp, called by kernels.
_HELPERS = ("push_v_meet", "push_v_steps", "ll_plan_after_push")


def _body(function: str) -> str:
    """``function``'s text in the collectives' headers: from its signature to the next
    function, template or section comment at column 0."""
    for path in sorted(_SRC.glob("*.cuh")):
        text = path.read_text()
        found = re.search(rf"^__device__[^\n]*\b{function}\(", text, re.MULTILINE)
        if found:
            start = found.start()
            following = re.search(r"^(__device__|template|// [A-Z])", text[start + 1:],
                                  re.MULTILINE)
            return text[start:start + 1 + following.start()] if following else text[start:]
    raise AssertionError(f"{function} is in no header")


def _marks_of(function: str) -> list[int]:
    """The IPCSHARE_MARK numbers of ``function``'s body and of the stamping helpers it
    calls."""
    body = _body(function)
    marks = [int(k) for k in re.findall(r"IPCSHARE_MARK\((\d+)\)", body)]
    for helper in _HELPERS:
        if re.search(rf"\b{helper}(<[^>(]*>)?\(", body[body.index("{"):]):
            marks += _marks_of(helper)
    return sorted(marks)


@pytest.mark.parametrize(("source", "function", "entries"), _KERNELS)
def test_every_traced_kernel_stamps_the_marks_the_host_names(source, function, entries):
    assert (_SRC / source).read_text().count(f" {function}(") >= 1
    marks = _marks_of(function)
    for entry in entries:
        names = trace.KERNEL_MARKS[entry]
        assert marks == list(range(len(names))), (entry, marks)
        assert len(names) <= trace.TRACE_MARKS


def test_every_entry_the_host_names_is_traced_above():
    assert set(trace.KERNEL_MARKS) == {entry for _, _, entries in _KERNELS for entry in entries}


_SIZES = {trace.TRACE_SYMBOL: 8 * 4 * 16 * 2 * 8, trace.TRACE_SPAN_SYMBOL: 8 * 1024 * 2 * 8,
          trace.TRACE_CALLS_SYMBOL: 1024 * 8}


class _Kernels:
    def __init__(self, sizes):
        self.sizes = sizes

    def global_array(self, name):
        if name not in self.sizes:
            raise CudaError("cuModuleGetGlobal failed: CUDA_ERROR_NOT_FOUND")
        return 0x1000, self.sizes[name]


def test_a_module_without_stamps_is_refused_with_what_to_set():
    with pytest.raises(RuntimeError, match=r"built without phase stamps: set "
                                           r"IPCSHARE_KERNEL_TRACE=1 before the group is made"):
        trace.KernelTrace(_Kernels({}))
    with pytest.raises(RuntimeError, match=r"built without phase stamps"):
        trace.KernelTrace(_Kernels({trace.TRACE_SYMBOL: _SIZES[trace.TRACE_SYMBOL]}))
    # A buffer of another shape (one call's stamps, as before the slots) is named.
    with pytest.raises(RuntimeError, match=r"ipcshare_trace holds 1024 bytes, expected 8192: "
                                           r"trace.cuh and kernels/trace.py disagree"):
        trace.KernelTrace(_Kernels({**_SIZES, trace.TRACE_SYMBOL: 1024}))
    arrays = trace.KernelTrace(_Kernels(_SIZES)).arrays
    assert {name: nbytes for name, (_, nbytes) in arrays.items()} == _SIZES


def _stamps(marks_cycles: dict[int, list[int]], scale: float = 0.5,
            gt0: int = 10_000) -> np.ndarray:
    """Stamps of one call: block -> cycles at marks 0, 1, ... (None: not reached), with a
    globaltimer that runs at ``scale`` ns a cycle from ``gt0``."""
    out = np.zeros((trace.TRACE_BLOCKS, trace.TRACE_MARKS, 2), np.uint64)
    for block, cycles in marks_cycles.items():
        for mark, cycle in enumerate(cycles):
            if cycle is not None:
                out[block, mark] = (cycle, gt0 + int(round((cycle - cycles[0]) * scale)))
    return out


def test_offsets_are_cycles_at_the_pooled_ratio_and_unreached_marks_are_missing():
    calls = [_stamps({0: [1_000, 3_000, 7_000], 1: [5_000, 5_400, 13_000]}),
             _stamps({0: [2_000, 4_000, 8_000, None], 2: [0 + 100, 900, 2_100]}),
             _stamps({0: [1_000, 5_000, 9_000]})]
    scale = trace.ns_per_cycle(calls)
    assert scale == pytest.approx(0.5, rel=1e-3)
    offsets = trace.mark_offsets_ns(calls[0], scale)
    assert offsets[0, :3] == pytest.approx([0, 1_000, 3_000], rel=1e-3)
    assert offsets[1, :3] == pytest.approx([0, 200, 4_000], rel=1e-3)
    assert np.all(np.isnan(offsets[3]))             # a block that stamped nothing
    assert np.isnan(trace.mark_offsets_ns(calls[1], scale)[0, 3])
    _, rows = trace.summarize(calls, ("begun", "met", "read", "ended"))
    begun, met, read, ended = rows
    assert (begun.median_us, begun.reached) == (0.0, 3)
    # Block 0's offsets: met at 1.0, 1.0, 2.0 us; read at 3.0, 3.0, 4.0 us.
    assert (met.median_us, met.step_us) == pytest.approx((1.0, 1.0))
    assert (read.median_us, read.step_us) == pytest.approx((3.0, 2.0))
    assert read.p10_us == pytest.approx(3.0) and read.p90_us == pytest.approx(3.8)
    # The slowest traced block of each call: 4.0 (block 1), 3.0 (block 0; block 2 at
    # 1.0), 4.0 -> median 4.0.
    assert read.slowest_us == pytest.approx(4.0)
    assert ended.reached == 0 and np.isnan(ended.median_us)


def test_no_span_gives_no_ratio_and_no_call_no_rows():
    assert np.isnan(trace.ns_per_cycle([_stamps({0: [5_000]})]))
    assert np.isnan(trace.ns_per_cycle([]))
    assert trace.summarize([], ("begun",))[1] == []


def _spans(calls: list[dict[int, tuple[int, int]]]) -> np.ndarray:
    """Spans of one read: per slot, block -> (its mark 0, its latest mark) in ns."""
    out = np.zeros((trace.TRACE_CALLS, trace.TRACE_SPAN_BLOCKS, 2), np.uint64)
    for slot, blocks in enumerate(calls):
        for block, edges in blocks.items():
            out[slot, block] = edges
    return out


def test_a_call_spans_from_its_first_block_to_its_last_and_gaps_are_between_calls():
    # A graph replay of three calls: blocks 0-2 begin and end at different times.
    replay = _spans([{0: (1_000, 9_000), 1: (1_200, 11_000), 7: (1_100, 10_500)},
                     {0: (12_000, 20_000), 1: (12_500, 19_000)},
                     {0: (21_500, 30_000), 3: (22_000, 31_000)}])
    assert trace.call_spans(replay)[:4] == [(1_000, 11_000, 3), (12_000, 20_000, 2),
                                             (21_500, 31_000, 2), None]
    summary = trace.summarize_spans([replay], skip=1)
    # Spans of the second and third calls (8.0 and 9.5 us), gaps 1.0 and 1.5 us (the
    # first call's gap counts: it is the launch of the second that it measures).
    assert (summary.spans, summary.gaps) == (2, 2)
    assert summary.span_us == pytest.approx(8.75) and summary.gap_us == pytest.approx(1.25)
    assert summary.span_p90_us == pytest.approx(9.35)
    assert summary.blocks == (2, 2)
    # Eager calls read one at a time: spans, no gaps.
    single = trace.summarize_spans([_spans([{0: (500, 4_500)}]), _spans([{0: (700, 6_700)}])])
    assert (single.span_us, single.gaps, single.blocks) == (5.0, 0, (1, 1))
    assert np.isnan(single.gap_us)
    empty = trace.summarize_spans([])
    assert (empty.spans, empty.blocks) == (0, (0, 0)) and np.isnan(empty.span_us)


def _tool():
    return load_example("kernel_trace", _TOOL.parent)


def test_the_tool_checks_against_what_each_rank_receives_and_prints_a_table():
    tool = _tool()
    m = np.array([[1, 2], [3, 0]])
    inputs = [np.arange(12, dtype=np.uint8), np.arange(100, 112, dtype=np.uint8)]
    # Rank 1 receives rank 0's elements 1-2 (bytes 4-11) and nothing from itself.
    assert np.array_equal(tool._expected(m, inputs, 1, 4), np.arange(4, 12, dtype=np.uint8))
    assert np.array_equal(tool._expected(m, inputs, 0, 4),
                          np.concatenate([np.arange(0, 4), np.arange(100, 112)]).astype(
                              np.uint8))
    _, rows = trace.summarize([_stamps({0: [0, 2_000]})], ("begun", "met"))
    text = tool.table(1, "all_to_all_v_push_bytes", 0.5, rows, 12.5)
    assert text.splitlines()[0] == ("rank 1: all_to_all_v_push_bytes, 1 calls, 0.5000 ns a "
                                    "cycle, 12.50 us a call by CUDA events (its wait for "
                                    "later peers included)")
    assert "| met | 1.00 | 1.00 | 1.00 | 1.00 | 1.00 | 1 |" in text
    assert "kernel span" not in text
    replay = _spans([{0: (1_000, 9_000)}, {0: (10_000, 18_000), 5: (10_100, 19_000)},
                     {0: (20_000, 27_000), 5: (20_200, 26_000)}])
    lines = tool.table(1, "all_to_all_v_push_bytes", 0.5, rows, 12.5,
                       trace.summarize_spans([replay], skip=1), graph=3).splitlines()
    assert lines[0].endswith("12.50 us a call by CUDA events (in graphs of 3 calls)")
    assert lines[-2:] == [
        "kernel span, first block's start to any block's last mark (2 blocks): median 8.00 "
        "us, p90 8.80",
        "gap from a call's last mark to the next call's first (in the graph): median 1.00 us, "
        "p90 1.00"]


@pytest.mark.parametrize(("args", "said"), [
    (["--algo", "auto"], "kernel_trace.py: --algo auto: name the algorithm to trace"),
    (["--algo", "copy-engine", "--splits", "random"],
     "kernel_trace.py: algo='copy-engine' is not an algorithm of all_to_all_v on cuda "
     "memory"),
    (["--algo", "push", "--bytes", "lots"], "kernel_trace.py: "),
    (["--algo", "push", "--graph", "9"], "kernel_trace.py: --graph 9: a graph of 2 to 8 calls"),
    (["--algo", "push", "--graph", "1"], "kernel_trace.py: --graph 1: a graph of 2 to 8 calls"),
])
def test_the_tool_refuses_what_it_cannot_trace_in_one_line_before_any_gpu(args, said):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(_TOOL), *args], capture_output=True, text=True,
                          cwd=_ROOT, timeout=60)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(said), done.stderr
