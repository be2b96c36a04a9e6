"""Communicator on the host backend, at every world size the suite runs with: results
against a reference computed from every rank's seeded data, the same bytes on every
rank, zero-copy arrays from empty(), reuse, disagreement and misuse."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import ipcshare
from ipcshare.runtime.errors import CollectiveError

from ..reduction_reference import NUMPY_DTYPES, mismatches, reference, seeded_values

pytestmark = pytest.mark.mpi

MAX_BYTES = 1 << 20
REDUCE_DTYPES = ("float32", "float16", "bfloat16", "int32")
OPS = ("sum", "max", "min")
ALL_REDUCE_ALGOS = ("one-shot", "two-shot", "auto")
# One element, primes, and counts that no world size of 2-4 divides.
COUNTS = (1, 2, 13, 1021, 20011)


@pytest.fixture(scope="module")
def group():
    with ipcshare.Group(backend="host") as g:
        yield g
    # Arrays from empty() keep their window's mapping; those that caught exceptions still
    # reach go with the cycles: collect them here, not in a later module's leak check.
    gc.collect()


@pytest.fixture(scope="module")
def communicator(group):
    with group.communicator(max_bytes=MAX_BYTES) as comm:
        yield comm


def same_everywhere(comm, array: np.ndarray) -> bool:
    """Whether every rank holds the same bytes."""
    mine = array.tobytes()
    return all(theirs == mine for theirs in comm.allgather(mine))


def inputs_of(dtype: str, count: int, seed: int, size: int, *, specials: bool = True):
    return [seeded_values(dtype, count, seed, r, specials=specials) for r in range(size)]


@pytest.mark.parametrize("algo", ALL_REDUCE_ALGOS)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", REDUCE_DTYPES)
def test_all_reduce_matches_the_reference_in_rank_order(comm, communicator, dtype, op, algo):
    me, n = communicator.rank, communicator.size
    failures = []
    for seed, count in enumerate(COUNTS):
        inputs = inputs_of(dtype, count, seed, n)
        want = reference(dtype, op, inputs)
        for in_place in (True, False):
            tensor = inputs[me].copy()
            if in_place:
                got = communicator.all_reduce(tensor, op=op, algo=algo)
                assert got is tensor
            else:
                got = np.full_like(tensor, 7)
                communicator.all_reduce(tensor, op=op, output=got, algo=algo)
                assert tensor.tobytes() == inputs[me].tobytes()  # the input is left alone
            wrong = mismatches(dtype, op, got, want)
            if wrong or not same_everywhere(comm, got):
                failures.append(f"count {count} in_place {in_place}: {wrong} wrong")
    assert not failures


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", REDUCE_DTYPES)
def test_one_shot_and_two_shot_give_the_same_bits(communicator, dtype, op):
    n = communicator.size
    inputs = inputs_of(dtype, 4099, 77, n)
    results = []
    for algo in ("one-shot", "two-shot"):
        tensor = inputs[communicator.rank].copy()
        results.append(communicator.all_reduce(tensor, op=op, algo=algo).tobytes())
    assert results[0] == results[1]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", REDUCE_DTYPES)
def test_reduce_scatter_matches_the_reference(comm, communicator, dtype, op):
    me, n = communicator.rank, communicator.size
    failures = []
    for seed, block in enumerate((1, 13, 1021)):
        inputs = inputs_of(dtype, block * n, 100 + seed, n)
        want = reference(dtype, op, inputs)[me * block:(me + 1) * block]
        for in_place in (True, False):
            source = inputs[me].copy()
            if in_place:
                output = source[me * block:(me + 1) * block]
            else:
                output = np.full(block, 3, dtype=source.dtype)
            assert communicator.reduce_scatter(output, source, op=op) is output
            wrong = mismatches(dtype, op, output, want)
            # Every rank's block, together, is the whole reduction.
            whole = np.frombuffer(b"".join(comm.allgather(output.tobytes())), source.dtype)
            wrong += mismatches(dtype, op, whole, reference(dtype, op, inputs))
            if wrong:
                failures.append(f"block {block} in_place {in_place}: {wrong} wrong")
    assert not failures


@pytest.mark.parametrize("dtype", ("float32", "bfloat16", "uint8", "float64", "int16"))
def test_all_gather_gathers_every_rank_in_order(comm, communicator, dtype):
    me, n = communicator.rank, communicator.size
    numpy_dtype = NUMPY_DTYPES.get(dtype, np.dtype(dtype))
    for count in (1, 3, 1021, MAX_BYTES // (n * numpy_dtype.itemsize)):
        blocks = [np.random.default_rng([count, r]).integers(0, 255, count * numpy_dtype.itemsize,
                                                              dtype=np.uint8).view(numpy_dtype)
                  for r in range(n)]
        want = np.concatenate(blocks).tobytes()
        output = np.zeros(count * n, numpy_dtype)
        communicator.all_gather(output, blocks[me])
        assert output.tobytes() == want, f"out of place, count {count}"
        in_place = np.zeros(count * n, numpy_dtype)
        in_place[me * count:(me + 1) * count] = blocks[me]
        communicator.all_gather(in_place, in_place[me * count:(me + 1) * count],
                                algo="copy-engine")
        assert in_place.tobytes() == want, f"in place, count {count}"
    assert same_everywhere(comm, output)


def test_arrays_from_empty_are_used_in_place(comm, communicator):
    me, n = communicator.rank, communicator.size
    inputs = inputs_of("bfloat16", 1000, 5, n)
    want = reference("bfloat16", "sum", inputs)
    before = communicator.copies_in
    for algo in ALL_REDUCE_ALGOS:
        tensor = communicator.empty((10, 100), "bfloat16")
        assert tensor.shape == (10, 100) and tensor.dtype == NUMPY_DTYPES["bfloat16"]
        tensor[:] = inputs[me].reshape(10, 100)
        communicator.all_reduce(tensor, algo=algo)
        assert mismatches("bfloat16", "sum", tensor.reshape(-1), want) == 0, algo
        # Out of place from the heap into the heap, and into a numpy array.
        tensor[:] = inputs[me].reshape(10, 100)
        heap_output = communicator.empty(1000, "bfloat16")
        communicator.all_reduce(tensor, output=heap_output, algo=algo)
        assert mismatches("bfloat16", "sum", heap_output, want) == 0, algo
        plain = np.empty(1000, NUMPY_DTYPES["bfloat16"])
        communicator.all_reduce(tensor.reshape(-1), output=plain, algo=algo)
        assert mismatches("bfloat16", "sum", plain, want) == 0, algo
    gathered = communicator.empty(4 * n, np.int32)
    gathered[me * 4:(me + 1) * 4] = me
    communicator.all_gather(gathered, gathered[me * 4:(me + 1) * 4])
    assert gathered.tolist() == [r for r in range(n) for _ in range(4)]
    scattered = communicator.empty(3 * n, "float32")
    scattered[:] = np.arange(3 * n) * (me + 1)
    communicator.reduce_scatter(scattered[me * 3:(me + 1) * 3], scattered, op="max")
    assert scattered[me * 3:(me + 1) * 3].tolist() == (np.arange(me * 3, me * 3 + 3) * n).tolist()
    assert communicator.copies_in == before  # no input was copied into the window


def test_ranks_may_mix_arrays_from_empty_with_their_own(comm, communicator):
    me, n = communicator.rank, communicator.size
    inputs = inputs_of("float32", 777, 9, n)
    before = communicator.copies_in
    if me % 2:
        tensor = communicator.empty(777, "float32")
        tensor[:] = inputs[me]
    else:
        tensor = inputs[me].copy()
    communicator.all_reduce(tensor, op="max")
    assert mismatches("float32", "max", tensor, reference("float32", "max", inputs)) == 0
    assert communicator.copies_in - before == (0 if me % 2 else 1)


def test_heap_blocks_come_back_when_the_arrays_go(group):
    with group.communicator(max_bytes=64 << 10, heap_bytes=64 << 10) as comm:
        for _ in range(20):
            whole = comm.empty(64 << 10, np.uint8)  # the whole heap, each time
            view = whole[10:20]
            del whole
            with pytest.raises(CollectiveError, match=r"largest free piece is 0 bytes \(0 bytes "
                                                      r"free in all\) of heap_bytes=65536.*"
                                                      r"larger heap_bytes"):
                comm.empty(1, np.uint8)
            del view
            gc.collect()
        kept = comm.empty(16, "float32")
        kept[:] = 1.5
        # free space in two pieces: the message gives the largest, not the sum
        halves = [comm.empty(16 << 10, np.uint8) for _ in range(3)]
        del halves[1]
        gc.collect()
        with pytest.raises(CollectiveError, match=r"needs 20480 bytes \(20K\) in one piece, "
                                                  r"but the heap's largest free piece is 16384 "
                                                  r"bytes \(16K\) \(\d+ bytes free in all\)"):
            comm.empty(20 << 10, np.uint8)
        del halves
    assert comm.closed
    # Arrays from empty() stay readable after close; calls refuse.
    assert kept.tolist() == [1.5] * 16
    with pytest.raises(CollectiveError, match="communicator is closed"):
        comm.all_reduce(kept)
    comm.close()  # idempotent


def test_two_hundred_calls_reuse_the_scratch(comm, communicator):
    me, n = communicator.rank, communicator.size
    heap = communicator.empty(257, "float32")
    wrong = []
    for call in range(200):
        inputs = inputs_of("float32", 257, 1000 + call, n, specials=False)
        algo = ("one-shot", "two-shot")[call % 2]
        if call % 3 == 0:
            tensor = heap
            tensor[:] = inputs[me]
        else:
            tensor = inputs[me].copy()
        if call % 5 == 4:
            output = np.empty(257 * n, np.float32)
            communicator.all_gather(output, tensor)
            ok = output.tobytes() == np.concatenate(inputs).tobytes()
        else:
            communicator.all_reduce(tensor, algo=algo)
            ok = mismatches("float32", "sum", tensor, reference("float32", "sum", inputs)) == 0
        if not ok:
            wrong.append(call)
    assert not wrong
    assert same_everywhere(comm, heap)


def test_bound_calls_rerun_on_what_the_arrays_hold_then(comm, communicator):
    me, n = communicator.rank, communicator.size
    tensor = np.zeros(1021, np.float32)
    out = np.zeros(1021, np.float32)
    gathered = np.zeros(13 * n, np.int32)
    block = np.zeros(13, np.int32)
    reduce_in = np.zeros(20 * n, np.float32)
    reduce_out = np.zeros(20, np.float32)
    all_reduce = communicator.bind("all_reduce", tensor, op="max", output=out)
    all_gather = communicator.bind("all_gather", gathered, block)
    reduce_scatter = communicator.bind("reduce_scatter", reduce_out, reduce_in, algo="one-shot")
    assert "all_reduce of 1021 float32" in repr(all_reduce)
    for call in range(4):
        inputs = inputs_of("float32", 1021, call, n)
        tensor[:] = inputs[me]
        assert all_reduce() is out
        assert mismatches("float32", "max", out, reference("float32", "max", inputs)) == 0
        blocks = [np.arange(13, dtype=np.int32) * (r + 1) + call for r in range(n)]
        block[:] = blocks[me]
        all_gather()
        assert np.array_equal(gathered, np.concatenate(blocks))
        parts = inputs_of("float32", 20 * n, 50 + call, n, specials=False)
        reduce_in[:] = parts[me]
        reduce_scatter()
        want = reference("float32", "sum", parts)[me * 20:(me + 1) * 20]
        assert mismatches("float32", "sum", reduce_out, want) == 0


def test_bind_refuses_what_the_call_refuses(communicator):
    # A refused bind is a bound call that takes part in the call refused: calling it raises
    # on every rank (all refuse here), naming the lowest rank.
    with pytest.raises(CollectiveError, match="^a collective call: rank 0's collective failed "
                                              "its "
                                              "check there \\(bind\\('broadcast'\\): choose "
                                              "all_gather"):
        communicator.bind("broadcast", np.zeros(4, np.float32))()
    with pytest.raises(CollectiveError, match="rank 0's tensor failed .*float64"):
        communicator.bind("all_reduce", np.zeros(4, np.float64))()
    # arguments the method does not take are named against it, not a private one
    with pytest.raises(CollectiveError, match=r"bind\('all_reduce', \.\.\.\): got an "
                                              r"unexpected keyword argument 'opp'; the "
                                              r"arguments are those of all_reduce\(\)"):
        communicator.bind("all_reduce", np.zeros(4, np.float32), opp="sum")()


def test_a_bound_call_refuses_to_run_after_close(group):
    comm = group.communicator(max_bytes=4096)
    bound = comm.bind("all_reduce", np.ones(8, np.float32))
    comm.close()
    with pytest.raises(CollectiveError, match=r"communicator it was bound to takes no more "
                                              r"calls \(communicator is closed\)"):
        bound()


@pytest.mark.parametrize("change", ["count", "dtype", "op", "algo", "collective"])
def test_ranks_that_disagree_raise_on_every_rank(comm, communicator, change):
    if comm.size == 1:
        pytest.skip("needs 2 ranks to disagree")
    me, n = communicator.rank, communicator.size
    odd = me == 1
    count = 11 if odd and change == "count" else 10
    dtype = np.int32 if odd and change == "dtype" else np.float32
    op = "min" if odd and change == "op" else "sum"
    algo = "two-shot" if odd and change == "algo" else "one-shot"
    tensor = np.ones(count, dtype)
    # Every rank first makes the agreed call, so the disagreeing one below is a call
    # rank 0 made before and rank 1 never: every call is checked, not only first ones.
    agreed = np.ones(10, np.float32)
    communicator.all_reduce(agreed, algo="one-shot")
    assert agreed.tolist() == [float(n)] * 10
    with pytest.raises(CollectiveError) as caught:
        if odd and change == "collective":
            communicator.reduce_scatter(np.ones(10, np.float32), np.ones(10 * n, np.float32))
        else:
            communicator.all_reduce(tensor, op=op, algo=algo)
    message = str(caught.value)
    assert message.startswith("ranks disagree on a collective call: ")
    assert "rank 1 " in message and "all_reduce of 10 float32 (40 bytes), op sum, algo one-shot" \
        in message
    assert comm.allgather(message) == [message] * n
    # The communicator goes on working.
    again = np.full(5, me + 1, np.int32)
    communicator.all_reduce(again)
    assert again.tolist() == [n * (n + 1) // 2] * 5


def test_misuse_on_one_rank_raises_on_every_rank_in_that_call(comm, communicator):
    """The last rank misuses each call, the others make it right: every rank raises the
    same error, naming the last rank and what its check said (tests/mpi/test_refused_calls.py
    has the rest of this contract)."""
    me, n = communicator.rank, communicator.size
    last = n - 1
    f32 = np.zeros(8, np.float32)

    def all_reduce(bad):
        return lambda: communicator.all_reduce(bad if me == last else np.zeros(8, np.float32))

    def with_args(call, good, **bad):
        return lambda: call(*good, **(bad if me == last else {}))
    good_scatter = (np.zeros(3, np.float32), np.zeros(3 * n, np.float32))
    cases = [
        (all_reduce(np.zeros(8, np.float64)),
         "tensor has dtype float64: all_reduce reduces float32, float16, bfloat16, int32"),
        (with_args(communicator.all_reduce, (f32,), op="prod"),
         "op='prod' is not a reduction all_reduce runs; choose one of: sum, max, min"),
        (all_reduce(np.zeros(16, np.float32)[::2]),
         "tensor is a float32 array of shape (8,) that is not contiguous"),
        (with_args(communicator.all_reduce, (f32,), output=np.zeros(9, np.float32)),
         "output has 9 elements and tensor 8: they must be as long"),
        (with_args(communicator.all_reduce, (f32,), output=np.zeros(8, np.float16)),
         "tensor is a float32 array of shape (8,) and output a float16 array of shape (8,): "
         "all_reduce takes one dtype"),
        (all_reduce(np.zeros(MAX_BYTES // 4 + 1, np.float32)),
         f"tensor has {MAX_BYTES + 4} bytes, more than this communicator's "
         f"max_bytes={MAX_BYTES} (1M): create it with Group.communicator("
         f"max_bytes={MAX_BYTES + 4}) or more"),
        (all_reduce([1.0, 2.0]), "tensor is a list, not an array"),
        (with_args(communicator.all_reduce, (f32,), stream=7),
         "stream=7: a communicator on host memory has no streams"),
        (with_args(communicator.all_reduce, (f32,), algo="three-shot"),
         "algo='three-shot' is not an algorithm of all_reduce on host memory; choose one "
         "of: auto, one-shot, two-shot"),
        (lambda: (communicator.all_reduce(f32[:6], output=f32[2:]) if me == last
                  else communicator.all_reduce(np.zeros(6, np.float32))),
         "output overlaps tensor but is not in place (all_reduce in place: output is "
         "tensor): it starts at byte 8 of tensor, in place is byte 0"),
        (all_reduce(np.frombuffer(bytes(32), np.float32)),
         "tensor is a float32 array of shape (8,) that is read-only"),
        (lambda: communicator.all_gather(
            np.zeros(8 * n + (me == last), np.float32), f32),
         f"output has {8 * n + 1} elements, expected {n} x 8 (the ranks times input's)"),
        (with_args(communicator.reduce_scatter, good_scatter, op="avg"),
         "op='avg' is not a reduction reduce_scatter runs"),
        (lambda: communicator.reduce_scatter(np.zeros(3, np.float32),
                                             np.zeros(3 * n + (me == last), np.float32)),
         f"input has {3 * n + 1} elements, expected {n} x 3"),
    ]
    for call, message in cases:
        with pytest.raises(CollectiveError) as caught:
            call()
        text = str(caught.value)
        assert message in text, (message, text)
        assert f"rank {last}'s " in text
        assert len(set(comm.allgather(text))) == 1
    # empty() is not collective: its misuse raises on the calling rank alone.
    if me == last:
        for call, message in [
                (lambda: communicator.empty((2, -1), "float32"),
                 "shape=(2, -1): expected an int or a tuple of ints >= 0"),
                (lambda: communicator.empty(4, "not-a-dtype"),
                 "dtype='not-a-dtype' is not a dtype")]:
            with pytest.raises(CollectiveError) as caught:
                call()
            assert message in str(caught.value)
    # Still in step: every rank makes the same next call.
    tensor = np.full(3, me, np.int32)
    communicator.all_reduce(tensor, op="max")
    assert tensor.tolist() == [last] * 3


def test_communicator_sizes_are_checked_on_every_rank(comm, group):
    with pytest.raises(CollectiveError, match=r"max_bytes=0: expected an int of at least 1"):
        group.communicator(max_bytes=0)
    # The same size spelled as a numpy integer on some ranks is the same size.
    group.communicator(max_bytes=np.int64(4096) if comm.rank % 2 else 4096).close()
    if comm.size > 1:
        with pytest.raises(CollectiveError) as caught:
            group.communicator(max_bytes=4096 * (1 + (comm.rank == 1)))
        assert "ranks disagree on the communicator's sizes" in str(caught.value)
        assert "rank 1 max_bytes=8192, heap_bytes=None" in str(caught.value)


def test_random_mixed_calls_stay_correct(communicator):
    """Collectives, ops, algorithms, sizes and placements drawn at random (the same draws
    on every rank, except where each rank's input lies), NaN and infinities included."""
    me, n = communicator.rank, communicator.size
    shared = np.random.default_rng(2026)        # what every rank calls
    mine = np.random.default_rng([2026, me])    # where this rank keeps its input
    heap_in = communicator.empty(4096, "float32")
    heap_out = communicator.empty(4096 * n, "float32")
    failures = []
    for call in range(300):
        count = int(shared.integers(1, 4096 // n))
        kind = ("all_reduce", "all_reduce_out", "reduce_scatter", "all_gather")[
            int(shared.integers(0, 4))]
        op = ("sum", "max", "min")[int(shared.integers(0, 3))]
        algo = ("one-shot", "two-shot", "auto")[int(shared.integers(0, 3))]
        length = count * n if kind == "reduce_scatter" else count
        data = [seeded_values("float32", length, call, r, specials=True) for r in range(n)]
        if mine.random() < 0.5:
            tensor = heap_in[:length]
            tensor[:] = data[me]
        else:
            tensor = data[me].copy()
        if kind == "all_reduce":
            communicator.all_reduce(tensor, op=op, algo=algo)
            wrong = mismatches("float32", op, tensor, reference("float32", op, data))
        elif kind == "all_reduce_out":
            output = np.empty_like(tensor)
            communicator.all_reduce(tensor, op=op, output=output, algo=algo)
            wrong = mismatches("float32", op, output, reference("float32", op, data))
        elif kind == "reduce_scatter":
            output = np.empty(count, np.float32)
            communicator.reduce_scatter(output, tensor, op=op)
            want = reference("float32", op, data)[me * count:(me + 1) * count]
            wrong = mismatches("float32", op, output, want)
        else:
            output = heap_out[:count * n] if mine.random() < 0.5 else np.empty(count * n,
                                                                               np.float32)
            communicator.all_gather(output, tensor)
            wrong = int(np.count_nonzero(output.view(np.uint32)
                                         != np.concatenate(data).view(np.uint32)))
        if wrong:
            failures.append(f"call {call}: {kind} of {count} op {op} algo {algo}: {wrong}")
    assert not failures
