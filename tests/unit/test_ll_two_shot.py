"""The LL two-shot all-reduce's arithmetic without a GPU: its chunks are the kernels' own
(kernels/src/collectives/two_shot_chunks.cuh, compiled here for the host and called
through ctypes), the two regions it writes in a slot fit the window's LL buffers for every
input it accepts, and it refuses the inputs whose regions would not fit."""

from __future__ import annotations

import ctypes
import types
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ipcshare.kernels
from ipcshare.collectives.agreement import Signature
from ipcshare.collectives.algorithms import algorithm
from ipcshare.collectives.algorithms.gpu_low_latency import two_shot_region_lines
from ipcshare.collectives.algorithms.gpu_two_shot import chunk_elements, chunk_spans
from ipcshare.collectives.scratch import LL_LINE_BYTES, LL_MAX_BYTES, ScratchLayout
from ipcshare.kernels import KERNEL_SOURCES
from tests.host_kernels import build_for_host

from ..hypothesis_profiles import examples

_KERNELS = Path(ipcshare.kernels.__file__).parent
_U64 = ctypes.c_ulonglong
_SHIM = r"""
#include "collectives/two_shot_chunks.cuh"
using namespace ipcshare::two_shot_chunks;
extern "C" {
u64 elements(u64 count, u64 nranks, u64 itemsize) {
  return chunk_elements(count, nranks, itemsize);
}
u64 length(u64 count, u64 chunk, u64 p) { return chunk_length(count, chunk, p); }
}
"""
_DTYPES = {"float32": 4, "float16": 2, "bfloat16": 2, "int32": 4}


@pytest.fixture(scope="module")
def chunks(tmp_path_factory):
    """two_shot_chunks.cuh's functions, compiled for this host."""
    lib = build_for_host(tmp_path_factory.mktemp("chunks"), _SHIM, "the kernels' chunk rule")
    for name in ("elements", "length"):
        getattr(lib, name).restype = _U64
        getattr(lib, name).argtypes = [_U64, _U64, _U64]
    return lib


@settings(max_examples=examples(300), deadline=None)
@given(st.integers(0, 1 << 22), st.integers(1, 8), st.sampled_from([1, 2, 4, 8]))
def test_the_python_chunks_are_the_kernels(chunks, count, size, itemsize):
    chunk = chunk_elements(count, itemsize, size)
    assert chunk == chunks.elements(count, size, itemsize)
    assert chunk * itemsize % 16 == 0  # whole granules: whole lines, aligned starts
    spans = chunk_spans(count, itemsize, size)
    assert [nbytes for _, nbytes in spans] == [
        chunks.length(count, chunk, p) * itemsize for p in range(size)]
    assert sum(nbytes for _, nbytes in spans) == count * itemsize


def _call(count: int, dtype: str, size: int, layout: ScratchLayout):
    signature = Signature("all_reduce", count, dtype, _DTYPES[dtype], "sum", "ll-two-shot")
    return types.SimpleNamespace(signature=signature, size=size,
                                 ll_max_bytes=layout.ll_max_bytes)


def _fits(count: int, dtype: str, size: int, layout: ScratchLayout) -> bool:
    """Whether every line the kernel writes in a slot lies inside it: the digest line,
    region 0 (lines 1 to region), region 1 (the next region lines)."""
    region = two_shot_region_lines(count, _DTYPES[dtype], size)
    return (1 + 2 * region) * LL_LINE_BYTES <= layout.ll_slot_bytes


@settings(max_examples=examples(400), deadline=None)
@given(st.integers(1, 3 * LL_MAX_BYTES), st.integers(2, 8), st.sampled_from(sorted(_DTYPES)),
       st.floats(0, 1))
def test_every_input_up_to_the_buffers_is_taken_and_fits_both_regions(max_bytes, size, dtype,
                                                                      fraction):
    layout = ScratchLayout(max_bytes, 0, size, gpu=True)
    two_shot = algorithm("cuda", "all_reduce", "ll-two-shot")
    largest = layout.ll_max_bytes // _DTYPES[dtype]
    for count in {min(1, largest), largest, max(largest - 1, 0), int(fraction * largest)}:
        assert two_shot.unsupported(_call(count, dtype, size, layout)) is None, (
            count, dtype, size, max_bytes)
        assert _fits(count, dtype, size, layout), (count, dtype, size, max_bytes)


@pytest.mark.parametrize("size", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("dtype", sorted(_DTYPES))
def test_it_takes_every_input_the_one_shot_ll_takes_in_full_sized_buffers(size, dtype):
    # Buffers of LL_MAX_BYTES (any communicator of 2 MiB or more): two chunks of lines
    # fit wherever the whole input does, so ll-two-shot refuses nothing ll takes.
    layout = ScratchLayout(4 << 20, 0, size, gpu=True)
    two_shot = algorithm("cuda", "all_reduce", "ll-two-shot")
    one_shot = algorithm("cuda", "all_reduce", "ll")
    largest = LL_MAX_BYTES // _DTYPES[dtype]
    for count in (*range(1, 200), *range(largest - 200, largest + 1), largest // 3,
                  largest // 2 + 1):
        call = _call(count, dtype, size, layout)
        assert one_shot.unsupported(call) is None
        assert two_shot.unsupported(call) is None, count
        assert _fits(count, dtype, size, layout)
    too_large = _call(largest + 1, dtype, size, layout)
    assert "its buffers take inputs of up to" in two_shot.unsupported(too_large)


@pytest.mark.parametrize("size", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("dtype", sorted(_DTYPES))
def test_a_communicator_sized_for_its_call_takes_it(size, dtype):
    # The command line sizes its communicator for each row: 2 float32 (8 bytes) at 4
    # ranks are 1 line whole but two regions of 2 lines in chunks, which slots sized
    # for the whole input did not hold (refused on 4 H200s, 2026-11-28).
    two_shot = algorithm("cuda", "all_reduce", "ll-two-shot")
    for count in (*range(1, 70), 250, 1000, 4097):
        layout = ScratchLayout(count * _DTYPES[dtype], 0, size, gpu=True)
        assert two_shot.unsupported(_call(count, dtype, size, layout)) is None, count
        assert _fits(count, dtype, size, layout), count


def test_a_call_larger_than_its_layout_is_refused():
    # A call that claims buffers larger than the layout's: the guard names both counts.
    layout = ScratchLayout(8, 0, 4, gpu=True)
    call = _call(4096, "float32", 4, ScratchLayout(16384, 0, 4, gpu=True))
    call.ll_max_bytes = 16384
    assert algorithm("cuda", "all_reduce", "ll-two-shot").unsupported(call) is None
    small = _call(4096, "float32", 4, layout)
    why = algorithm("cuda", "all_reduce", "ll-two-shot").unsupported(small)
    assert why is not None and "its buffers take inputs of up to 8 bytes" in why
    # One rank sends no lines: nothing to fit.
    alone = ScratchLayout(1000, 0, 1, gpu=True)
    assert algorithm("cuda", "all_reduce", "ll-two-shot").unsupported(
        _call(250, "float32", 1, alone)) is None


def test_every_dtype_and_op_has_its_kernel_entry():
    two_shot = algorithm("cuda", "all_reduce", "ll-two-shot")
    entries = set(KERNEL_SOURCES["collectives_ll.cu"])
    for dtype, itemsize in _DTYPES.items():
        for op in ("sum", "max", "min"):
            signature = Signature("all_reduce", 7, dtype, itemsize, op, "ll-two-shot")
            assert two_shot.entry(signature) in entries
    source = (_KERNELS / "src" / "collectives_ll.cu").read_text()
    # Every dtype and op, bound to the block (test_kernels checks its registers).
    assert "IPCSHARE_TYPES(all_reduce_ll_two_shot, IPCSHARE_BOUNDED)" in source
