"""The parts of the collectives layer that need no MPI: array descriptors, reductions,
the heap, signatures, the scratch layout, the algorithm registry and the auto choice."""

from __future__ import annotations

import contextlib

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ipcshare.collectives.agreement import Signature, disagreement_error
from ipcshare.collectives.algorithms import OPS, algorithm, algorithm_names
from ipcshare.collectives.algorithms.host_two_shot import two_shot_chunks
from ipcshare.collectives.arrays import (
    c_contiguous,
    check_array,
    describe_array,
    parse_dlpack_capsule,
)
from ipcshare.collectives.choice import choose
from ipcshare.collectives.communicator import Communicator
from ipcshare.collectives.heap import Heap
from ipcshare.collectives.reduction import (
    REDUCE_DTYPES,
    REDUCE_OPS,
    Reducer,
    bfloat16_to_float32,
    float32_to_bfloat16,
)
from ipcshare.collectives.scratch import (
    ALIGN,
    HEADER_WORDS,
    LL_CLEANED_SLOT,
    LL_LINE_BYTES,
    LL_LINE_PAYLOAD,
    LL_MAX_BYTES,
    ScratchLayout,
)
from ipcshare.patterns.collective_case import exact_bytes
from ipcshare.patterns.seeding import seeded_small_integers
from ipcshare.runtime.errors import CollectiveError, Unsupported
from ipcshare.window import ERROR_SLOT, USER_SLOT_BASE

from ..hypothesis_profiles import examples
from ..reduction_reference import NUMPY_DTYPES, mismatches, reference, seeded_values

# -- arrays -------------------------------------------------------------------------


def test_numpy_arrays_are_described_where_they_lie():
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    ref = describe_array(array, "input")
    assert (ref.ptr, ref.nbytes, ref.count, ref.dtype, ref.itemsize, ref.shape) == (
        array.ctypes.data, 48, 12, "float32", 4, (3, 4))
    assert ref.contiguous and not ref.readonly and ref.device == "cpu"
    assert ref.bytes().ctypes.data == array.ctypes.data  # a view, not a copy
    assert describe_array(np.zeros(4, ml_dtypes.bfloat16), "x").dtype == "bfloat16"
    # Byte-swapped floats keep their typestring: no reduction takes them for float32.
    assert describe_array(np.zeros(4, ">f4"), "x").dtype == ">f4"
    assert not describe_array(array[:, ::2], "x").contiguous
    assert describe_array(np.frombuffer(b"abcd", np.uint8), "x").readonly
    # The buffer protocol and __array_interface__ give views as well.
    raw = bytearray(16)
    assert describe_array(raw, "x").ptr == np.frombuffer(raw, np.uint8).ctypes.data


def test_arrays_of_python_objects_are_refused_by_name():
    # Their bytes are pointers into this process (was a numpy TypeError from deep inside).
    for dtype in (object, [("a", np.int32), ("b", object)]):
        with pytest.raises(CollectiveError, match=r"^output has dtype .*: it holds Python "
                                                  "objects"):
            describe_array(np.empty(4, dtype=dtype), "output")


@pytest.mark.parametrize("scalar", [np.float32(3.0), np.int32(7), np.float16(1.5)])
def test_numpy_scalars_are_refused_since_no_result_could_reach_them(scalar):
    # numpy views a scalar through a temporary copy: an all-reduce "in place" on one
    # used to return the unreduced value on every rank, without an error.
    name = type(scalar).__name__
    with pytest.raises(CollectiveError, match=rf"^tensor is a numpy scalar \({name}\), not an "
                       rf"array: .*numpy.array\(\[value\], dtype=numpy.{name}\)"):
        describe_array(scalar, "tensor")


@pytest.mark.parametrize(("dtype", "says"), [
    (None, "dtype=None: name the element type"),
    (object, "holds Python objects"),
    ("not-a-type", "is not a dtype"),
])
def test_dtypes_that_name_no_numeric_element_are_refused(dtype, says):
    # None used to give float64 in silence, and object numpy's own TypeError.
    from ipcshare.collectives.arrays import to_numpy_dtype

    with pytest.raises(CollectiveError, match=says):
        to_numpy_dtype(dtype)


def test_what_is_not_an_array_is_named():
    with pytest.raises(CollectiveError, match="^tensor is a list, not an array"):
        describe_array([1, 2], "tensor")
    with pytest.raises(CollectiveError, match="^output is a NoneType, not an array"):
        describe_array(None, "output")


class _CudaArray:
    """A stand-in that speaks only __cuda_array_interface__ (no memory behind it)."""

    def __init__(self, shape, typestr, strides=None):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr,
                                         "data": (0x7F0000000000, False), "strides": strides,
                                         "version": 3}


def test_cuda_array_interface_is_read_without_touching_the_memory():
    ref = describe_array(_CudaArray((4, 8), "<f2"), "tensor")
    assert (ref.device, ref.dtype, ref.nbytes, ref.count, ref.contiguous, ref.ptr) == (
        "cuda", "float16", 64, 32, True, 0x7F0000000000)
    assert not describe_array(_CudaArray((4, 8), "<f2", strides=(32, 4)), "x").contiguous
    with pytest.raises(CollectiveError, match="tensor is a float16 array of shape \\(4, 8\\) in "
                                              "cuda memory, but this communicator takes a numpy"):
        check_array(ref, "tensor", device="cpu")
    bad = _CudaArray((4,), "<f4")
    del bad.__cuda_array_interface__["shape"]
    with pytest.raises(CollectiveError, match="x has a malformed __cuda_array_interface__"):
        describe_array(bad, "x")


@pytest.mark.parametrize("array", [
    np.arange(10, dtype=np.int32), np.zeros((3, 5), np.float16)[:, 1:4],
    np.zeros((2, 3), np.float64), np.zeros(7, np.uint8)[::3], np.zeros(0, np.float32)])
def test_dlpack_capsules_are_parsed_like_numpy_reads_them(array):
    ref = parse_dlpack_capsule(array.__dlpack__(), array, "x")
    assert (ref.ptr, ref.shape, ref.nbytes, ref.dtype, ref.contiguous, ref.device) == (
        array.ctypes.data if array.size else ref.ptr, array.shape, array.nbytes,
        array.dtype.name, array.flags.c_contiguous, "cpu")
    with pytest.raises(CollectiveError, match="did not return a 'dltensor' capsule"):
        parse_dlpack_capsule(object(), array, "x")


@given(hnp.arrays(np.int8, hnp.array_shapes(min_dims=1, max_dims=4, max_side=4)),
       st.data())
def test_contiguity_agrees_with_numpy(array, data):
    slices = tuple(slice(None, None, data.draw(st.integers(1, 2))) for _ in array.shape)
    view = array[slices]
    assert c_contiguous(view.shape, view.strides, 1) == view.flags.c_contiguous


# -- reductions -----------------------------------------------------------------------


def test_bfloat16_conversions_match_ml_dtypes_on_every_value():
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    widened = bfloat16_to_float32(every)
    assert widened.tobytes() == every.view(ml_dtypes.bfloat16).astype(np.float32).tobytes()
    rng = np.random.default_rng(3)
    values = rng.integers(0, 1 << 32, 1 << 16, dtype=np.uint64).astype(np.uint32).view(np.float32)
    with np.errstate(all="ignore"):
        want = values.astype(ml_dtypes.bfloat16).view(np.uint16)
    assert np.array_equal(float32_to_bfloat16(values), want)


_BIT_TYPES = {"float32": np.uint32, "float16": np.uint16, "bfloat16": np.uint16,
              "int32": np.uint32}


@settings(max_examples=examples(60), deadline=None)
@given(dtype=st.sampled_from(REDUCE_DTYPES), op=st.sampled_from(REDUCE_OPS),
       ranks=st.integers(1, 5), count=st.integers(0, 70), data=st.data())
def test_reductions_match_the_reference_on_any_bits(dtype, op, ranks, count, data):
    """Every bit pattern (NaNs, infinities, signed zeros, subnormals) in every rank."""
    bits = _BIT_TYPES[dtype]
    inputs = [data.draw(hnp.arrays(bits, count)).view(NUMPY_DTYPES[dtype])
              for _ in range(ranks)]
    out = np.empty(count, NUMPY_DTYPES[dtype])
    Reducer(dtype, op)([x.view(np.uint8) for x in inputs], out.view(np.uint8))
    assert mismatches(dtype, op, out, reference(dtype, op, inputs)) == 0


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_max_and_min_of_signed_zeros_and_nans(dtype):
    numpy_dtype = NUMPY_DTYPES[dtype]
    a = np.array([-0.0, 0.0, np.nan, 1.0, -np.inf], np.float32).astype(numpy_dtype)
    b = np.array([0.0, -0.0, 2.0, np.nan, -1.0], np.float32).astype(numpy_dtype)
    results = {}
    for op in ("max", "min"):
        for order in ((a, b), (b, a)):
            out = np.empty(5, numpy_dtype)
            Reducer(dtype, op)([x.view(np.uint8) for x in order], out.view(np.uint8))
            results.setdefault(op, set()).add(out.tobytes())
    assert len(results["max"]) == len(results["min"]) == 1  # order does not matter
    nan = {"float32": 0x7FC00000, "float16": 0x7E00, "bfloat16": 0x7FC0}[dtype]
    bits = _BIT_TYPES[dtype]
    high = np.frombuffer(results["max"].pop(), numpy_dtype)
    low = np.frombuffer(results["min"].pop(), numpy_dtype)
    assert high.view(bits)[2:4].tolist() == low.view(bits)[2:4].tolist() == [nan, nan]
    assert not np.signbit(high[0]) and not np.signbit(high[1])
    assert np.signbit(low[0]) and np.signbit(low[1])
    assert float(high[4]) == -1.0 and float(low[4]) == -np.inf


def test_chunked_reduction_with_the_output_among_the_sources():
    inputs = [seeded_values("float16", 100_003, 1, r) for r in range(3)]
    want = reference("float16", "sum", inputs)
    mine = inputs[1].copy()
    sources = [inputs[0].view(np.uint8), mine.view(np.uint8), inputs[2].view(np.uint8)]
    Reducer("float16", "sum")(sources, mine.view(np.uint8))
    assert mismatches("float16", "sum", mine, want) == 0


def test_int32_sums_wrap_around():
    big = np.array([2**31 - 1], np.int32)
    out = np.empty(1, np.int32)
    Reducer("int32", "sum")([big.view(np.uint8)] * 3, out.view(np.uint8))
    assert out[0] == np.int32(2**31 - 3)


# -- heap, layout, signatures, registry ---------------------------------------------


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 3000)), max_size=60))
def test_heap_blocks_never_overlap_and_merge_back(steps):
    heap = Heap(8192, 256)
    held: dict[int, int] = {}
    for allocate, nbytes in steps:
        if allocate or not held:
            offset = heap.allocate(nbytes)
            if offset is None:
                assert heap.free_bytes < max(nbytes, 1) or nbytes > 8192
                continue
            assert offset % 256 == 0 and offset + nbytes <= 8192
            for other, size in held.items():
                assert offset + max(nbytes, 1) <= other or other + max(size, 1) <= offset
            held[offset] = nbytes
        else:
            heap.free(held.popitem()[0])
    for offset in list(held):
        heap.free(offset)
    assert heap.allocate(8192) == 0  # every range merged back into one


@pytest.mark.parametrize("gpu", [False, True])
def test_scratch_regions_and_headers_do_not_overlap(gpu):
    layout = ScratchLayout(max_bytes=1000, heap_bytes=3000, world_size=3, gpu=gpu)
    regions = [(0, layout.heap_bytes)]
    regions += [(layout.staging_offset(p), layout.staging_bytes) for p in (0, 1)]
    regions += [(layout.result_offset(p), layout.result_bytes) for p in (0, 1)]
    regions += [(layout.ll_offset(p) + r * layout.ll_slot_bytes, layout.ll_slot_bytes)
                for p in (0, 1) for r in range(3)]
    regions += [(layout.splits_offset(p), layout.splits_bytes) for p in (0, 1)]
    # The LL128 slots (GPU windows: a 128-byte head, then 1000 bytes in 120-byte lines).
    regions += [(layout.ll128_offset(p) + r * layout.ll128_slot_bytes, layout.ll128_slot_bytes)
                for p in (0, 1) for r in range(3)]
    assert layout.ll128_slot_bytes == (-(-128 * (1 + 9) // ALIGN) * ALIGN if gpu else 0)
    assert layout.splits_bytes >= 2 * 8 * 3  # input and output splits, int64 per rank
    for (a, la), (b, _lb) in zip(regions, regions[1:], strict=False):
        assert a + la <= b
    # The copy-engine all-reduce's inbox: 3 chunks of ceil(250 / 3) = 84 float32 rounded
    # up to 4 elements (16 bytes) pass the input's end; its result area holds all of it.
    assert layout.staging_bytes >= 1000 + 3 * 16
    assert layout.result_bytes >= (1000 if gpu else -(-1000 // 3) + 4)
    assert layout.total_bytes == regions[-1][0] + regions[-1][1]
    assert layout.in_heap(0, 3000) and not layout.in_heap(2999, 2) and not layout.in_heap(0, 0)
    words = {layout.header_slot(p) + w for p in (0, 1) for w in range(HEADER_WORDS)}
    words |= {LL_CLEANED_SLOT, LL_CLEANED_SLOT + 1}
    assert len(words) == 2 * HEADER_WORDS + 2
    assert USER_SLOT_BASE <= min(words) < max(words) < ERROR_SLOT


def test_ll_slots_hold_the_digest_line_a_split_row_and_the_largest_input_in_lines():
    assert ScratchLayout(1000, 0, 2).ll_slot_bytes == 0  # host windows carry none
    for size in (2, 3, 4, 8):
        for max_bytes in (1, 8, 9, 1000, LL_MAX_BYTES, 4 * LL_MAX_BYTES):
            layout = ScratchLayout(max_bytes, 0, size, gpu=True)
            payload = min(max_bytes, LL_MAX_BYTES)
            assert layout.ll_max_bytes == payload
            whole = -(-payload // LL_LINE_PAYLOAD)
            # The LL all-to-all-v sends its split row (2n + 3 words, a line each) before
            # a block that may be the whole input.
            row = 2 * size + 3
            # The LL two-shot's two chunk regions: a chunk is ceil(bytes / n) rounded up
            # to 16 bytes, plus up to 7 bytes of a partial element.
            regions = 2 * (-(-(-(-payload // size) + 7) // 16) * 16 // LL_LINE_PAYLOAD)
            lines = 1 + max(row + whole, regions)
            assert lines * LL_LINE_BYTES <= layout.ll_slot_bytes < lines * LL_LINE_BYTES + ALIGN
            assert layout.ll_slot_bytes % ALIGN == 0
            # Full-sized buffers: the regions add at most 4 lines to the whole input.
            if payload == LL_MAX_BYTES:
                assert regions <= whole + 4


@given(st.integers(0, 10_000), st.integers(1, 9))
def test_two_shot_chunks_cover_the_array_once(count, size):
    chunks = two_shot_chunks(count, size)
    assert len(chunks) == size and chunks[0][0] == 0 and chunks[-1][1] == count
    assert all(a[1] == b[0] for a, b in zip(chunks, chunks[1:], strict=False))


DIGEST = 0x407962A4D3819698  # bit 63 clear: never a mark (call_marks.py)


def test_two_gpus_run_small_calls_by_the_low_latency_protocol():
    # ll up to 512 KiB of all-reduce, 256 KiB of all-gather (ll128 above, to 2 MiB) and
    # 2 MiB of reduce-scatter (choice.py).
    for op, limit in (("all_reduce", 512 << 10), ("all_gather", 256 << 10),
                      ("reduce_scatter", 2 << 20)):
        assert choose("cuda", op, 1, 2) == "ll"
        assert choose("cuda", op, limit, 2) == "ll"
        assert choose("cuda", op, limit + 1, 2) != "ll"
        assert LL_MAX_BYTES >= limit  # auto never asks more of the buffers than they take


def test_three_and_four_gpus_run_small_calls_by_the_low_latency_protocol():
    # Measured on 4 GPUs (choice.py): at 3 ranks ll up to 512 KiB, reduce-scatter up to
    # 2 MiB. At 4 ranks and more the all-reduce's ll stops at 128 KiB, its LL two-shot runs
    # to 512; the all-gather's ll to 512 KiB, the reduce-scatter's to 1 MiB, then ll128.
    for op, limit, above in (("all_reduce", 512 << 10, "two-shot"),
                             ("all_gather", 512 << 10, "pull"),
                             ("reduce_scatter", 2 << 20, "one-shot")):
        assert choose("cuda", op, 1, 3) == "ll"
        assert choose("cuda", op, limit, 3) == "ll"
        assert choose("cuda", op, limit + 1, 3) == above
        assert limit <= LL_MAX_BYTES
    for op, limit, above in (("all_reduce", 128 << 10, "ll-two-shot"),
                             ("all_gather", 512 << 10, "ll128"),
                             ("reduce_scatter", 1 << 20, "ll128")):
        for size in (4, 8):
            assert choose("cuda", op, 1, size) == "ll"
            assert choose("cuda", op, limit, size) == "ll"
            assert choose("cuda", op, limit + 1, size) == above
    for size in (4, 8):
        assert choose("cuda", "all_reduce", 512 << 10, size) == "ll-two-shot"
        assert choose("cuda", "all_reduce", (512 << 10) + 1, size) == "two-shot"
    assert choose("cuda", "all_reduce", (128 << 10) + 1, 3) == "ll"


_KiB, _MiB = 1 << 10, 1 << 20
# The algorithms whose lines land in the LL / LL128 buffers, which take inputs of up to
# ScratchLayout.ll_max_bytes.
_LOW_LATENCY = ("ll", "ll128", "ll-two-shot")


def _switches(op: str, size: int) -> list[tuple[int | None, str]]:
    """``auto``'s GPU choice for ``op`` over ``size`` ranks as read off choose(): each run
    of sizes with one algorithm as (its largest size, the algorithm), the last with None.
    Every switch of the tables lies at a power of two, so choose() is asked at each power
    of two from 1 byte to 1 GiB and one byte above it."""
    runs: list[tuple[int | None, str]] = []
    previous = None
    for shift in range(31):
        for nbytes in (1 << shift, (1 << shift) + 1):
            algo = choose("cuda", op, nbytes, size)
            if previous is not None and algo != previous[1]:
                runs.append(previous)
            previous = (nbytes, algo)
    runs.append((None, previous[1]))
    return runs


def test_auto_switches_where_4_h200s_measured_it_on_2026_11_28():
    # choice.py: ll128 from 256-512 KiB to 2 MiB of all-gather and (4 ranks) from 1 to
    # 4 MiB of reduce-scatter; push for the largest reductions (4 ranks above 2 / 4 MiB,
    # 2 ranks above 8 MiB); ll for 2-rank reduce-scatters up to 2 MiB.
    two = {"all_gather": [(256 * _KiB, "ll"), (2 * _MiB, "ll128"), (None, "pull")],
           "reduce_scatter": [(2 * _MiB, "ll"), (8 * _MiB, "one-shot"), (None, "push")],
           "all_reduce": [(512 * _KiB, "ll"), (8 * _MiB, "one-shot"), (None, "push")]}
    three = {"all_gather": [(512 * _KiB, "ll"), (None, "pull")],
             "reduce_scatter": [(2 * _MiB, "ll"), (None, "one-shot")],
             "all_reduce": [(512 * _KiB, "ll"), (None, "two-shot")]}
    four = {"all_gather": [(512 * _KiB, "ll"), (2 * _MiB, "ll128"), (None, "pull")],
            "reduce_scatter": [(1 * _MiB, "ll"), (4 * _MiB, "ll128"), (None, "push")],
            "all_reduce": [(128 * _KiB, "ll"), (512 * _KiB, "ll-two-shot"),
                           (2 * _MiB, "two-shot"), (None, "push")]}
    alone = {"all_gather": [(None, "pull")], "reduce_scatter": [(None, "one-shot")],
             "all_reduce": [(None, "one-shot")]}
    for op in OPS:
        assert _switches(op, 1) == alone[op]
        assert _switches(op, 2) == two[op], op
        assert _switches(op, 3) == three[op], op
        # 5 to 8 ranks have not run: the 4-rank row serves them.
        for size in range(4, 9):
            assert _switches(op, size) == four[op], (op, size)
    # Just below and above each switch, by choose() itself.
    assert [choose("cuda", "all_gather", n, 2) for n in
            (0, 256 * _KiB, 256 * _KiB + 1, 2 * _MiB, 2 * _MiB + 1)] == [
        "ll", "ll", "ll128", "ll128", "pull"]
    assert [choose("cuda", "reduce_scatter", n, 4) for n in
            (1 * _MiB, 1 * _MiB + 1, 4 * _MiB, 4 * _MiB + 1)] == ["ll", "ll128", "ll128", "push"]
    assert [choose("cuda", "all_reduce", n, 4) for n in
            (2 * _MiB, 2 * _MiB + 1, 1 << 30)] == ["two-shot", "push", "push"]
    assert [choose("cuda", "all_reduce", n, 2) for n in
            (8 * _MiB, 8 * _MiB + 1)] == ["one-shot", "push"]
    assert choose("cuda", "reduce_scatter", 8 * _MiB + 1, 2) == "push"
    # 3 ranks keep their row: no ll128 nor push has been timed there at these sizes.
    for nbytes in (1 * _MiB, 2 * _MiB, 64 * _MiB):
        assert choose("cuda", "all_gather", nbytes, 3) == "pull"
        assert choose("cuda", "all_reduce", nbytes, 3) == "two-shot"
    assert choose("cuda", "reduce_scatter", 64 * _MiB, 3) == "one-shot"


def _calls(op: str, nbytes: int, size: int):
    """Calls of ``op`` over ``size`` ranks whose largest array has about ``nbytes``, as
    (signature without its algorithm, largest array's bytes): a few counts around it, in
    a 1-, 2- and 4-byte dtype where the op takes it. The largest array is an all-gather's
    output (size x input) and a reduce-scatter's input (size x output)."""
    dtypes = ((("uint8", 1), ("float16", 2), ("float32", 4)) if op == "all_gather" else
              (("float16", 2), ("float32", 4)))
    redop = None if op == "all_gather" else "sum"
    for dtype, itemsize in dtypes:
        per = itemsize * (1 if op == "all_reduce" else size)  # bytes per element of count
        middle = nbytes // per
        for elements in {middle - 1, middle, middle + 1}:
            if elements < 1:
                continue
            # Signature.count is the input's: a reduce-scatter's input holds size blocks.
            count = elements * size if op == "reduce_scatter" else elements
            yield (op, count, dtype, itemsize, redop), elements * per


def _overflows() -> list:
    """Every call of world sizes 2 to 8 for which ``auto`` picks a low-latency algorithm
    that the smallest communicator taking the call (max_bytes = its largest array) cannot
    run: asked of the algorithm itself, as the GPU path asks before a call
    (gpu_path._bind), and of the slots' sizes. Sizes: every limit of every GPU row, a
    byte either side, and the powers of two from 8 B to 64 MiB."""
    from ipcshare.collectives.algorithms.gpu_kernel import GpuCall
    from ipcshare.collectives.choice import CUDA_CHOICES
    from ipcshare.collectives.scratch import LL128_LINE_BYTES, ll128_lines

    limits = {limit for op in OPS for row in CUDA_CHOICES[op].values() for limit in row.limits}
    sizes = sorted({n + d for n in limits for d in (-1, 0, 1)} |
                   {1 << shift for shift in range(3, 27)})
    found = []
    for size in range(2, 9):
        for op in OPS:
            for target in sizes:
                for (op_, count, dtype, itemsize, redop), largest in _calls(op, target, size):
                    algo = choose("cuda", op, largest, size)
                    if algo not in _LOW_LATENCY:
                        continue
                    layout = ScratchLayout(max_bytes=largest, heap_bytes=0, world_size=size,
                                           gpu=True)
                    signature = Signature(op_, count, dtype, itemsize, redop, algo)
                    call = GpuCall(signature, size, lambda *_: None, layout.ll_max_bytes,
                                   ll128_max_bytes=layout.ll128_max_bytes)
                    why = algorithm("cuda", op, algo).unsupported(call)
                    # What one sender's lines carry into a slot: its input, or one block.
                    payload = count * itemsize // (size if op == "reduce_scatter" else 1)
                    if why is None and algo == "ll128":
                        head_and_lines = LL128_LINE_BYTES * (1 + ll128_lines(payload))
                        if head_and_lines > layout.ll128_slot_bytes:
                            why = f"{head_and_lines} bytes of lines, slot of " \
                                  f"{layout.ll128_slot_bytes}"
                    if why is None and algo == "ll" and payload > layout.ll_max_bytes:
                        why = f"{payload} bytes, LL slots take {layout.ll_max_bytes}"
                    if why is not None:
                        found.append((op, size, largest, dtype, algo, why))
    return found


def test_every_low_latency_choice_fits_the_buffers_of_a_communicator_that_takes_the_call():
    assert _overflows() == []


def test_the_fit_check_catches_a_row_that_outgrows_the_buffers(monkeypatch):
    # A 4-rank all-gather row running ll128 up to 64 MiB gathered: 16 MiB inputs, twice
    # what the LL128 slots (ll128_max_bytes: 8 MiB) hold.
    from ipcshare.collectives.choice import CUDA_CHOICES, Choice
    from ipcshare.collectives.scratch import LL128_MAX_BYTES

    monkeypatch.setitem(CUDA_CHOICES["all_gather"], 4,
                        Choice((512 * _KiB, 64 * _MiB), ("ll", "ll128", "pull")))
    found = _overflows()
    assert found
    assert {(op, algo) for op, _size, _largest, _dtype, algo, _why in found} == {
        ("all_gather", "ll128")}
    assert any(size == 4 and largest == 64 * _MiB for _op, size, largest, *_ in found)
    # Only where an input passes the 8 MiB the slots hold (5 to 8 ranks share the row).
    assert all(largest // size > LL128_MAX_BYTES for _op, size, largest, *_ in found)
    # The same rows with ll at 2 ranks up to 8 MiB of reduce-scatter: 4 MiB blocks.
    monkeypatch.undo()
    monkeypatch.setitem(CUDA_CHOICES["reduce_scatter"], 2,
                        Choice((8 * _MiB,), ("ll", "push")))
    assert {(op, size, algo) for op, size, _l, _d, algo, _w in _overflows()} == {
        ("reduce_scatter", 2, "ll")}


def test_all_to_all_v_runs_ll_on_small_communicators_and_all_to_all_ll_then_pull():
    # all_to_all_v: nbytes is the communicator's max_bytes. Up to LL_MAX_BYTES every block
    # fits an LL slot; ll where it was measured ahead (2 MiB at 2 ranks, 512 KiB at 4).
    assert choose("cuda", "all_to_all_v", 1, 1) == "balanced"
    assert choose("cuda", "all_to_all_v", LL_MAX_BYTES, 2) == "ll"
    assert choose("cuda", "all_to_all_v", LL_MAX_BYTES + 1, 2) == "balanced"
    for size in (3, 4, 8):
        assert choose("cuda", "all_to_all_v", 512 << 10, size) == "ll"
        assert choose("cuda", "all_to_all_v", (512 << 10) + 1, size) == "balanced"
    # all_to_all: ll to 1 MiB at 2 ranks, 512 KiB at more.
    for size in (2, 3, 4):
        ll_limit = (1 << 20) if size == 2 else (512 << 10)
        assert choose("cuda", "all_to_all_v", 1 << 30, size) == "balanced"
        assert choose("cuda", "all_to_all", 1, size) == "ll"
        assert choose("cuda", "all_to_all", ll_limit, size) == "ll"
        assert choose("cuda", "all_to_all", ll_limit + 1, size) == "pull"
        assert choose("cuda", "all_to_all", 8 << 20, size) == "pull"
        assert choose("cuda", "all_to_all", (8 << 20) + 1, size) == "balanced"
    # Push above 32 MiB where it was measured ahead (2 ranks); balanced at 3 and more.
    assert choose("cuda", "all_to_all", 32 << 20, 2) == "balanced"
    assert choose("cuda", "all_to_all", (32 << 20) + 1, 2) == "push"
    assert choose("cuda", "all_to_all", 1 << 30, 2) == "push"
    for size in (3, 4, 8):
        assert choose("cuda", "all_to_all", 1 << 30, size) == "balanced"
    # A rank alone never waits on lines: it copies.
    assert choose("cuda", "all_to_all", 1, 1) == "pull"


def test_ranks_sharing_a_gpu_run_the_stepped_kernels_at_every_size():
    for op in OPS:
        assert "stepped" in algorithm_names("cuda", op)
        for size in (2, 3, 5):
            for nbytes in (0, 1, 4096, 1 << 20, 1 << 30):
                assert choose("cuda", op, nbytes, size, shared_gpus=True) == "stepped"
                assert choose("cuda", op, nbytes, size) != "stepped"
        # Host memory has no kernels to spin: sharing a GPU changes nothing there.
        assert choose("host", op, 4096, 2, shared_gpus=True) == choose("host", op, 4096, 2)


def test_signature_digests_are_the_same_in_every_process():
    signature = Signature("all_reduce", 1000, "float32", 4, "sum", "one-shot")
    # A fixed value: Python's hash() of a string changes from process to process.
    assert signature.digest == DIGEST
    assert signature.digest != Signature("all_reduce", 1001, "float32", 4, "sum",
                                           "one-shot").digest
    assert signature.describe() == "all_reduce of 1000 float32 (4000 bytes), op sum, algo one-shot"
    assert Signature("all_gather", 1 << 20, "uint8", 1, None, "copy-engine").describe() == (
        "all_gather of 1048576 uint8 (1048576 bytes = 1M), algo copy-engine")
    error = disagreement_error(["a", "b", "a"])
    assert str(error) == "ranks disagree on a collective call: ranks 0, 2 call a, rank 1 b"


@pytest.mark.parametrize("memory", ["host", "cuda"])
def test_every_auto_choice_is_a_registered_algorithm(memory):
    for op in OPS:
        names = algorithm_names(memory, op)
        assert names
        for size in (1, 2, 3, 4, 8):
            for nbytes in (0, 1, 4096, 1 << 20, 1 << 30):
                assert choose(memory, op, nbytes, size) in names
    if memory == "cuda":
        return  # the GPU algorithms import CUDA bindings; the host ones are checked below
    for op in OPS:
        names = algorithm_names(memory, op)
        for name in names:
            found = algorithm("host", op, name)
            assert (found.name, found.op, found.memory) == (name, op, "host")
    with pytest.raises(CollectiveError, match="algo='ring' is not an algorithm of "
                                              "reduce_scatter on host memory; choose one of: "
                                              "auto, one-shot"):
        algorithm("host", "reduce_scatter", "ring")


class _Group:
    """Enough of a Group to construct a Communicator up to its backend check."""

    def __init__(self, backend: str, nodes: int = 1) -> None:
        self.backend_name = backend
        self.world = type("World", (), {"node_count": nodes, "size": 2})()

    def collective(self, what, value):
        return [value, value]

    def step(self, name):
        return contextlib.nullcontext()


def test_a_communicator_made_directly_over_nodes_points_to_group_communicator():
    with pytest.raises(Unsupported, match=r"over 2 nodes: make it with Group.communicator\(\)"):
        Communicator(_Group("host", nodes=2), 1 << 20)
    assert issubclass(Unsupported, NotImplementedError)


@settings(max_examples=examples(30), deadline=None)
@given(st.integers(1, 600), st.integers(0, 5))
def test_cli_data_reduces_exactly_in_every_type(world_size, iteration):
    """The CLI's seeded data: any sum over the ranks is exact in every reduction type,
    so every algorithm and summation order must give the same bits."""
    values = [seeded_small_integers(iteration, r, 64, world_size) for r in range(world_size)]
    assert sum(int(np.abs(v).max()) for v in values) <= 256
    total = np.sum(values, axis=0)
    for dtype in REDUCE_DTYPES:
        data = exact_bytes(total, dtype)
        decoded = (bfloat16_to_float32(data.view(np.uint16)) if dtype == "bfloat16" else
                   data.view(NUMPY_DTYPES[dtype]).astype(np.float64))
        assert decoded.tolist() == total.tolist()


def _recorded(algo_name: str, op: str, dtype: str, count: int, size: int, max_blocks: int):
    from ipcshare.collectives.algorithms.gpu_kernel import GpuCall

    itemsize = 1 if op == "all_gather" else np.dtype(NUMPY_DTYPES[dtype]).itemsize
    signature = Signature(op, count, dtype, itemsize, None if op == "all_gather" else "sum",
                          algo_name)
    steps: list = []
    call = GpuCall(signature, size, lambda entry, blocks: steps.append((entry, blocks)),
                   meet=lambda turn: steps.append(("meet", turn)), max_blocks=max_blocks)
    algorithm("cuda", op, algo_name).run(call)
    return steps


def test_a_stepped_call_is_stage_meet_work_meet_with_both_flag_sets():
    steps = _recorded("stepped", "all_reduce", "bfloat16", 1 << 20, 2, 128)
    assert [s[0] for s in steps] == ["stage_and_publish_bfloat16", "meet",
                                     "all_reduce_stepped_bfloat16_sum", "meet"]
    assert [s[1] for s in steps if s[0] == "meet"] == [0, 1]
    gather = _recorded("stepped", "all_gather", "uint8", 4096, 3, 128)
    assert [s[0] for s in gather] == ["stage_and_publish_bytes", "meet",
                                      "all_gather_stepped_bytes", "meet"]


@pytest.mark.parametrize("op,algo_name", [("all_reduce", "one-shot"), ("all_reduce", "two-shot"),
                                          ("all_reduce", "ll"), ("all_reduce", "ll-two-shot"),
                                          ("all_reduce", "ll128"),
                                          ("all_reduce", "ll128-two-shot"),
                                          ("all_reduce", "stepped"),
                                          ("reduce_scatter", "one-shot"),
                                          ("all_gather", "pull"), ("all_gather", "stepped")])
def test_grids_stay_within_the_share_of_ranks_on_one_gpu(op, algo_name):
    """With k ranks on a GPU every kernel gets at most 128 // k blocks, so all of their
    spinning blocks fit on the GPU at once; small calls keep their smaller grids."""
    dtype = "uint8" if op == "all_gather" else "float32"
    for max_blocks in (128, 64, 32):
        steps = _recorded(algo_name, op, dtype, 1 << 22, 4, max_blocks)
        assert all(1 <= blocks <= max_blocks for entry, blocks in steps if entry != "meet")
        assert max(blocks for entry, blocks in steps if entry != "meet") == max_blocks
    small = _recorded(algo_name, op, dtype, 64, 4, 32)
    assert all(blocks == 1 for entry, blocks in small if entry != "meet")


def test_auto_all_to_all_v_is_chosen_by_the_communicators_max_bytes_not_the_call(monkeypatch):
    """Ranks' inputs differ in an all-to-all-v: a choice by the call's own bytes could
    differ from rank to rank; by max_bytes every rank picks the same."""
    import types

    from ipcshare.collectives import communicator as module

    asked = []
    monkeypatch.setattr(module, "choose", lambda memory, op, nbytes, size, **_: (
        asked.append((op, nbytes)) or "ll"))
    fake = types.SimpleNamespace(memory="cuda", size=2, max_bytes=1 << 20,
                                 _time_sliced=False, _signatures={})
    fake._resolve = lambda *facts: module.Communicator._resolve(fake, *facts)
    for op, nbytes in (("all_to_all_v", 4096), ("all_to_all", 4096)):
        call = types.SimpleNamespace(op=op, algo="auto", nbytes=nbytes, redop=None,
                                     inp=types.SimpleNamespace(count=1024, dtype="float32",
                                                               itemsize=4))
        signature, chosen = module.Communicator._signature(fake, call)
        assert (signature.algo, chosen.name) == ("ll", "ll")
    assert asked == [("all_to_all_v", 1 << 20), ("all_to_all", 4096)]
