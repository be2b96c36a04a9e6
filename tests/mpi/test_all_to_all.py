"""Communicator.all_to_all and all_to_all_v on the host backend, at every world size the
suite runs with: bit-exact against MPI's Alltoall / Alltoallv on the same bytes, every
dtype, odd counts, even / random / skewed / one-pair / all-zero splits, in and out of
place, arrays from empty() and registered arrays, bound calls, ranks whose splits
disagree (named on every rank, nothing hangs), local misuse, and, across virtual nodes,
all_to_all through the hierarchical steps and all_to_all_v's refusal."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import ipcshare
from ipcshare.runtime.errors import CollectiveError
from ipcshare.topology.world import VIRTUAL_NODES_ENV

from ..reduction_reference import NUMPY_DTYPES
from .test_register import SharedSegment

pytestmark = pytest.mark.mpi

MAX_BYTES = 1 << 20
# Every dtype the communicator moves (bytes are moved, so these stand for all of them).
DTYPES = ("uint8", "float16", "bfloat16", "float32", "int32", "float64")
# One element, primes and counts no world size of 2-4 divides (times the ranks for
# all_to_all's blocks).
BLOCKS = (1, 3, 13, 1021)
PATTERNS = ("even", "random", "skewed", "one-pair", "all-zero")


@pytest.fixture(scope="module")
def group():
    with ipcshare.Group(backend="host") as g:
        yield g
    gc.collect()  # arrays from empty() held by caught exceptions' frames


@pytest.fixture(scope="module")
def communicator(group):
    with group.communicator(max_bytes=MAX_BYTES) as comm:
        yield comm


def np_dtype(dtype: str) -> np.dtype:
    return NUMPY_DTYPES.get(dtype, np.dtype(dtype))


def seeded(dtype: str, count: int, seed: int, rank: int) -> np.ndarray:
    """``count`` elements of random bytes (NaN and subnormal patterns included), the
    same for (seed, rank) on every rank."""
    item = np_dtype(dtype)
    raw = np.random.default_rng([seed, rank]).integers(0, 256, count * item.itemsize,
                                                         dtype=np.uint8)
    return raw.view(item)


def mpi_all_to_all(comm, data: np.ndarray) -> bytes:
    """MPI's Alltoall of ``data``'s bytes (blocks of equal bytes per rank)."""
    out = np.empty(data.nbytes, np.uint8)
    comm.Alltoall(data.view(np.uint8), out)
    return out.tobytes()


def mpi_all_to_all_v(comm, data: np.ndarray, output: np.ndarray, sends, receives) -> bytes:
    """MPI's Alltoallv of ``data``'s bytes into a copy of ``output`` (what the splits do
    not reach keeps its bytes), packed by the element counts ``sends`` / ``receives``."""
    item = data.itemsize
    out = output.view(np.uint8).copy()
    send_counts = [c * item for c in sends]
    recv_counts = [c * item for c in receives]
    send_displs = [sum(send_counts[:q]) for q in range(len(sends))]
    recv_displs = [sum(recv_counts[:q]) for q in range(len(receives))]
    from mpi4py import MPI

    comm.Alltoallv([data.view(np.uint8), send_counts, send_displs, MPI.BYTE],
                   [out, recv_counts, recv_displs, MPI.BYTE])
    return out.tobytes()


def split_matrix(pattern: str, size: int, seed: int) -> np.ndarray:
    """``m[r, q]``: elements rank r sends rank q, drawn alike on every rank."""
    rng = np.random.default_rng([seed, size, 31])
    if pattern == "even":
        return np.full((size, size), 7, np.int64)
    if pattern == "random":
        m = rng.integers(0, 60, (size, size))
        m[rng.random((size, size)) < 0.25] = 0   # zero-size splits among the others
        return m
    if pattern == "skewed":
        m = np.ones((size, size), np.int64)
        m[:, int(rng.integers(0, size))] = 4099  # every rank sends most to one rank
        return m
    m = np.zeros((size, size), np.int64)
    if pattern == "one-pair":
        m[int(rng.integers(0, size)), int(rng.integers(0, size))] = 1021
    return m


@pytest.mark.parametrize("dtype", DTYPES)
def test_all_to_all_matches_mpi(comm, communicator, dtype):
    me, n = communicator.rank, communicator.size
    failures = []
    for seed, block in enumerate(BLOCKS):
        data = seeded(dtype, block * n, seed, me)
        want = mpi_all_to_all(comm, data)
        output = np.full_like(data, 0x5A) if dtype == "uint8" else np.zeros_like(data)
        assert communicator.all_to_all(output, data) is output
        if output.tobytes() != want:
            failures.append(f"block {block} out of place")
        if data.tobytes() != seeded(dtype, block * n, seed, me).tobytes():
            failures.append(f"block {block}: the input was written")
        in_place = data.copy()
        communicator.all_to_all(in_place, in_place)
        if in_place.tobytes() != want:
            failures.append(f"block {block} in place")
        # From the window's heap (read in place by peers), out of place and in place.
        heap = communicator.empty(block * n, np_dtype(dtype))
        heap[:] = data
        heap_out = communicator.empty(block * n, np_dtype(dtype))
        communicator.all_to_all(heap_out, heap)
        if heap_out.tobytes() != want:
            failures.append(f"block {block} from empty()")
        communicator.all_to_all(heap, heap)
        if heap.tobytes() != want:
            failures.append(f"block {block} in place in empty()")
    assert not failures


def test_all_to_all_moves_block_r_to_rank_r(communicator):
    """Readable values: rank q's output block r is what rank r put for rank q."""
    me, n = communicator.rank, communicator.size
    data = np.array([1000 * me + q for q in range(n) for _ in range(3)], np.int32)
    output = np.zeros_like(data)
    communicator.all_to_all(output, data.reshape(n, 3))
    assert output.tolist() == [1000 * r + me for r in range(n) for _ in range(3)]


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_to_all_v_matches_mpi(comm, communicator, dtype, pattern):
    me, n = communicator.rank, communicator.size
    failures = []
    for seed in range(3):
        m = split_matrix(pattern, n, seed)
        sends, receives = m[me].tolist(), m[:, me].tolist()
        # Arrays longer than the splits by an odd count: the tail is neither sent nor
        # written.
        data = seeded(dtype, sum(sends) + 5, 100 + seed, me)
        output = seeded(dtype, sum(receives) + 3, 200 + seed, me)
        want = mpi_all_to_all_v(comm, data, output, sends, receives)
        got = output.copy()
        # Splits as lists on some seeds, numpy integer arrays on others.
        splits = ((receives, sends) if seed % 2 == 0 else
                  (np.array(receives, np.int32), np.array(sends, np.int64)))
        assert communicator.all_to_all_v(got, data, *splits) is got
        if got.tobytes() != want:
            failures.append(f"seed {seed} out of place")
        # In place: one array long enough for both directions.
        length = max(sum(sends), sum(receives)) + 1
        whole = seeded(dtype, length, 300 + seed, me)
        want = mpi_all_to_all_v(comm, whole, whole, sends, receives)
        communicator.all_to_all_v(whole, whole, receives, sends)
        if whole.tobytes() != want:
            failures.append(f"seed {seed} in place")
        # From empty(): read in place by peers, out of place and in place.
        heap = communicator.empty(length, np_dtype(dtype))
        heap[:] = seeded(dtype, length, 400 + seed, me)
        heap_out = communicator.empty(length, np_dtype(dtype))
        heap_out[:] = 0
        want = mpi_all_to_all_v(comm, heap, heap_out, sends, receives)
        communicator.all_to_all_v(heap_out, heap, receives, sends)
        if heap_out.tobytes() != want:
            failures.append(f"seed {seed} from empty()")
        want = mpi_all_to_all_v(comm, heap, heap, sends, receives)
        communicator.all_to_all_v(heap, heap, receives, sends)
        if heap.tobytes() != want:
            failures.append(f"seed {seed} in place in empty()")
    assert not failures


def test_all_to_all_v_places_what_each_rank_sends(communicator):
    """Readable values: rank r sends rank q (q + 1) copies of 100 r + q."""
    me, n = communicator.rank, communicator.size
    sends = [q + 1 for q in range(n)]
    receives = [me + 1] * n
    data = np.array([100 * me + q for q in range(n) for _ in range(q + 1)], np.int32)
    output = np.full(sum(receives) + 2, -1, np.int32)
    communicator.all_to_all_v(output, data, receives, sends)
    assert output.tolist() == [100 * r + me for r in range(n) for _ in range(me + 1)] + [-1, -1]


def test_zero_size_arrays_and_splits(comm, communicator):
    n = communicator.size
    empty = np.zeros(0, np.float32)
    communicator.all_to_all(empty, np.zeros(0, np.float32))
    communicator.all_to_all_v(empty, empty, [0] * n, [0] * n)
    untouched = np.arange(4, dtype=np.float32)
    communicator.all_to_all_v(untouched, np.ones(2, np.float32), [0] * n, [0] * n)
    assert untouched.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_registered_arrays_are_read_in_place(comm, communicator):
    me, n = communicator.rank, communicator.size
    segment = SharedSegment()
    try:
        source = segment.array(13 * n, "int32")
        source[:] = seeded("int32", 13 * n, 5, me)
        registration = communicator.register(source)
        before = communicator.copies_in
        output = np.zeros(13 * n, np.int32)
        communicator.all_to_all(output, source)
        assert output.tobytes() == mpi_all_to_all(comm, source)
        m = split_matrix("even", n, 9)   # something to send on every rank: read in place
        if n > 1:
            m[0, -1] = 0                   # and a zero-size split
        sends, receives = m[me].tolist(), m[:, me].tolist()
        part = source[:sum(sends)]
        got = np.zeros(sum(receives), np.int32)
        communicator.all_to_all_v(got, part, receives, sends)
        assert got.tobytes() == mpi_all_to_all_v(comm, part, np.zeros_like(got), sends, receives)
        want = mpi_all_to_all(comm, source)
        communicator.all_to_all(source, source)  # in place in registered memory
        assert source.tobytes() == want
        assert communicator.copies_in == before
        del registration, part
        communicator.unregister(source)
        del source
    finally:
        segment.close()


def test_bound_calls_rerun_on_what_the_arrays_hold_then(comm, communicator):
    me, n = communicator.rank, communicator.size
    data = np.zeros(5 * n, np.float32)
    output = np.zeros(5 * n, np.float32)
    bound = communicator.bind("all_to_all", output, data)
    assert "all_to_all of" in repr(bound)
    m = split_matrix("random", n, 3)
    sends, receives = m[me].tolist(), m[:, me].tolist()
    v_in = np.zeros(sum(sends), np.float64)
    v_out = np.zeros(sum(receives) + 1, np.float64)
    bound_v = communicator.bind("all_to_all_v", v_out, v_in, receives, sends)
    assert "all_to_all_v of float64" in repr(bound_v)
    for call in range(4):
        data[:] = seeded("float32", 5 * n, call, me)
        assert bound() is output
        assert output.tobytes() == mpi_all_to_all(comm, data)
        v_in[:] = seeded("float64", sum(sends), 10 + call, me)
        want = mpi_all_to_all_v(comm, v_in, v_out, sends, receives)
        assert bound_v() is v_out
        assert v_out.tobytes() == want


def test_disagreeing_splits_raise_on_every_rank(comm, communicator):
    me, n = communicator.rank, communicator.size
    m = split_matrix("even", n, 0)
    sends, receives = m[me].tolist(), m[:, me].tolist()
    receiver = 1 % n
    if me == receiver:
        receives[0] += 1   # expects one more element from rank 0 than it sends
    data = np.ones(sum(sends), np.float32)
    output = np.full(sum(receives), -1.0, np.float32)
    with pytest.raises(CollectiveError) as caught:
        communicator.all_to_all_v(output, data, receives, sends)
    message = str(caught.value)
    assert message == (f"ranks disagree on all_to_all_v's splits: rank {receiver} expects 8 "
                       f"elements from rank 0 (output_splits[0]=8), which sends it 7 "
                       f"(input_splits[{receiver}]=7)")
    assert comm.allgather(message) == [message] * n
    assert (output == -1.0).all()   # nothing moved
    # Many pairs: the first are named, the rest counted; one line.
    if n > 1:
        with pytest.raises(CollectiveError) as caught:
            communicator.all_to_all_v(np.zeros(8 * n * n, np.float32),
                                      np.zeros(7 * n, np.float32), [7 + me + 1] * n, [7] * n)
        assert "\n" not in str(caught.value)
        assert ("and " in str(caught.value)) == (n * n > 4)
    # The communicator goes on working.
    communicator.all_to_all_v(output[:7 * n], data, [7] * n, [7] * n)
    assert (output[:7 * n] == 1.0).all()


def test_ranks_calling_different_collectives_raise_on_every_rank(comm, communicator):
    if comm.size == 1:
        pytest.skip("needs 2 ranks to disagree")
    me, n = communicator.rank, communicator.size
    with pytest.raises(CollectiveError) as caught:
        if me == 1:
            communicator.all_to_all_v(np.zeros(2 * n, np.float32), np.zeros(2 * n, np.float32),
                                      [2] * n, [2] * n)
        else:
            communicator.all_to_all(np.zeros(2 * n, np.float32), np.zeros(2 * n, np.float32))
    message = str(caught.value)
    assert message.startswith("ranks disagree on a collective call: ")
    assert "rank 1 all_to_all_v of float32 (counts by splits), algo pull" in message
    assert f"all_to_all of {2 * n} float32" in message
    assert comm.allgather(message) == [message] * n
    with pytest.raises(CollectiveError) as caught:   # dtype differs: int32 on rank 1
        dtype = np.int32 if me == 1 else np.float32
        communicator.all_to_all_v(np.zeros(n, dtype), np.zeros(n, dtype), [1] * n, [1] * n)
    assert "rank 1 all_to_all_v of int32" in str(caught.value)


def test_misuse_on_one_rank_raises_on_every_rank_in_that_call(comm, communicator):
    """The last rank misuses each call, the others make it right: every rank raises the
    same error in that call, naming the last rank and what its check said."""
    c = communicator
    me, n = c.rank, c.size
    last = n - 1
    f32 = np.zeros(4 * n, np.float32)
    big = MAX_BYTES // 4 + 1
    cases = [
        ("all_to_all", lambda: c.all_to_all(np.zeros(4 * n, np.float16), f32),
         f"output is a float16 array of shape ({4 * n},) and input a float32 array of shape "
         f"({4 * n},): all_to_all takes one dtype"),
        ("all_to_all", lambda: c.all_to_all(np.zeros(4 * n + 1, np.float32), f32),
         f"all_to_all: input has {4 * n} elements and output {4 * n + 1}: they must be as long"),
        ("all_to_all", lambda: c.all_to_all(np.zeros(4 * n + 1, np.float32),
                                         np.zeros(4 * n + 1, np.float32)),
         f"all_to_all: input has {4 * n + 1} elements, not a multiple of {n} (the ranks)")
        if n > 1 else ("all_to_all", lambda: c.all_to_all(f32, f32[::2]), "not contiguous"),
        ("all_to_all", lambda: c.all_to_all(f32, np.zeros(8 * n, np.float32)[::2]),
         f"input is a float32 array of shape ({4 * n},) that is not contiguous"),
        ("all_to_all", lambda: c.all_to_all(np.frombuffer(bytes(16 * n), np.float32), f32),
         "that is read-only"),
        ("all_to_all", lambda: c.all_to_all(np.zeros(big * n, np.float32),
                                         np.zeros(big * n, np.float32)),
         f"all_to_all: output has {big * n * 4} bytes"),
        ("all_to_all", lambda: c.all_to_all(f32[1:], f32[:-1]),
         "input overlaps output but is not in place (all_to_all in place: input is output)"),
        ("all_to_all", lambda: c.all_to_all(f32, f32, algo="ring"),
         "algo='ring' is not an algorithm of all_to_all on host memory; choose one of: "
         "auto, pull"),
        ("all_to_all", lambda: c.all_to_all(f32, f32, stream=3),
         "stream=3: a communicator on host memory has no streams"),
        ("all_to_all_v", lambda: c.all_to_all_v(f32, np.zeros(4, np.int32), [0] * n, [0] * n),
         "all_to_all_v takes one dtype"),
        ("all_to_all_v", lambda: c.all_to_all_v(f32, f32, [0] * n, [0] * (n + 1)),
         f"all_to_all_v: input_splits has {n + 1} counts, expected one per rank ({n})"),
        ("all_to_all_v", lambda: c.all_to_all_v(f32, f32, [-1] + [0] * (n - 1), [0] * n),
         "all_to_all_v: output_splits[0]=-1: counts are elements, at least 0"),
        ("all_to_all_v", lambda: c.all_to_all_v(f32, f32, [0] * n, [1.5] + [0] * (n - 1)),
         "all_to_all_v: input_splits[0]=1.5: expected an int"),
        ("all_to_all_v", lambda: c.all_to_all_v(f32, f32, [0] * n, [4 * n + 1] + [0] * (n - 1)),
         f"all_to_all_v: input_splits add up to {4 * n + 1} elements, more than input's "
         f"{4 * n}"),
        ("all_to_all_v", lambda: c.all_to_all_v(f32, f32, [5 * n] + [0] * (n - 1), [0] * n),
         f"all_to_all_v: output_splits add up to {5 * n} elements, more than output's {4 * n}"),
        ("all_to_all_v", lambda: c.all_to_all_v(f32, f32, [0] * n, "0" * n),
         "all_to_all_v: input_splits is a str: pass a sequence of one int per rank"),
        ("all_to_all_v", lambda: c.all_to_all_v(f32, f32, np.zeros((n, 1), np.int64), [0] * n),
         "all_to_all_v: output_splits is a numpy array of dtype int64 and shape"),
        ("all_to_all_v", lambda: c.all_to_all_v(np.zeros(big, np.float32),
                                           np.zeros(big, np.float32), [0] * n,
                                           [big] + [0] * (n - 1)),
         f"all_to_all_v: input_splits add up to {big * 4} bytes"),
        ("all_to_all_v", lambda: c.all_to_all_v(f32[1:], f32[:-1], [0] * n, [0] * n),
         "input overlaps output but is not in place (all_to_all_v in place: input is output)"),
        ("all_to_all_v", lambda: c.all_to_all_v(f32, f32, [0] * n, [0] * n, algo="push"),
         "algo='push' is not an algorithm of all_to_all_v on host memory"),
        ("bind_all_to_all_v", lambda: c.bind("all_to_all_v", f32, f32, [0] * n),
         "bind('all_to_all_v', ...): missing a required argument: 'input_splits'"),
        ("bind_all_to_all", lambda: c.bind("all_to_all", f32, f32[1:]),
         "all_to_all: input has"),
    ]
    out = np.zeros(4 * n, np.float32)
    good = {"all_to_all": lambda: c.all_to_all(out, f32),
            "all_to_all_v": lambda: c.all_to_all_v(out, f32, [0] * n, [0] * n)}
    good["bind_all_to_all"] = lambda: c.bind("all_to_all", out, f32)()
    good["bind_all_to_all_v"] = lambda: c.bind("all_to_all_v", out, f32, [0] * n,
                                                          [0] * n)()
    for kind, call, message in cases:
        with pytest.raises(CollectiveError) as caught:
            if me != last:
                good[kind]()
            elif kind.startswith("bind_"):
                call()()   # a refused bind: its bound call takes part, refused
            else:
                call()
        text = str(caught.value)
        assert message.removeprefix(f"{kind.removeprefix('bind_')}: ") in text, (message, text)
        assert f"rank {last}'s " in text and "\n" not in text
        assert comm.allgather(text) == [text] * n
    # Still in step: every rank makes the same next call.
    data = np.full(n, me, np.int32)
    communicator.all_to_all(data, data)
    assert data.tolist() == list(range(n))


def test_random_mixed_calls_stay_correct(comm, communicator):
    """all_to_all, all_to_all_v and all_gather drawn at random (the same draws on every
    rank), inputs from empty() on some ranks and not others: the scratch and headers
    reused by parity, heap inputs held until every peer read them."""
    me, n = communicator.rank, communicator.size
    shared = np.random.default_rng(2027)
    mine = np.random.default_rng([2027, me])
    heap_in = communicator.empty(2048 * n, "int32")
    heap_out = communicator.empty(2048 * n, "int32")
    failures = []
    for call in range(150):
        kind = ("all_to_all", "all_to_all_v", "all_gather")[int(shared.integers(0, 3))]
        m = shared.integers(0, 2048 // n, (n, n))
        m[shared.random((n, n)) < 0.3] = 0
        block = int(m[0, 0]) or 1
        length = {"all_to_all": block * n, "all_to_all_v": int(m[me].sum()),
                  "all_gather": block}[kind]
        data = seeded("int32", length, call, me)
        if mine.random() < 0.5:
            tensor = heap_in[:length]
            tensor[:] = data
        else:
            tensor = data.copy()
        out_len = {"all_to_all": block * n, "all_to_all_v": int(m[:, me].sum()),
                   "all_gather": block * n}[kind]
        output = heap_out[:out_len] if mine.random() < 0.5 else np.empty(out_len, np.int32)
        output[:] = -7
        if kind == "all_to_all":
            want = mpi_all_to_all(comm, data)
            communicator.all_to_all(output, tensor)
        elif kind == "all_to_all_v":
            want = mpi_all_to_all_v(comm, data, output, m[me].tolist(), m[:, me].tolist())
            communicator.all_to_all_v(output, tensor, m[:, me].tolist(), m[me].tolist())
        else:
            gathered = np.empty(block * n, np.int32)
            comm.Allgather(data, gathered)
            want = gathered.tobytes()
            communicator.all_gather(output, tensor)
        if output.tobytes() != want:
            failures.append(f"call {call}: {kind}")
    assert not failures


@pytest.mark.parametrize("per_node_nodes", [2, "one-per-node"])
def test_a_group_spanning_nodes_runs_all_to_all_hierarchically(comm, monkeypatch,
                                                               per_node_nodes):
    """Virtual nodes of this machine, the MPI engine between them: all_to_all through the
    node's IPC and the rails, bit-exact against MPI's Alltoall over the whole world, odd
    blocks, every dtype, in place and bound; all_to_all_v refused by every rank, said
    once in one line, and the communicator still works after it."""
    n = comm.size
    nodes = n if per_node_nodes == "one-per-node" else 2
    if n % nodes or nodes < 2:
        pytest.skip(f"{nodes} even virtual nodes need a multiple of {nodes} ranks, not {n}")
    monkeypatch.setenv(VIRTUAL_NODES_ENV, str(nodes))
    with ipcshare.Group(backend="host") as g, g.communicator(max_bytes=1 << 16,
                                                             inter="mpi") as c:
        assert g.world.node_count == nodes
        for dtype in DTYPES:
            for block in (1, 3, 257):
                data = seeded(dtype, n * block, 70 + block, comm.rank)
                want = mpi_all_to_all(comm, data)
                out = np.zeros_like(data)
                assert c.all_to_all(out, data) is out
                assert out.tobytes() == want, (dtype, block)
                inplace = data.copy()
                c.all_to_all(inplace, inplace)
                assert inplace.tobytes() == want, (dtype, block, "in place")
        source = np.zeros(n * 5, np.int32)
        out = np.zeros_like(source)
        bound = c.bind("all_to_all", out, source)
        for call in range(3):
            source[:] = seeded("int32", n * 5, 900 + call, comm.rank)
            bound()
            assert out.tobytes() == mpi_all_to_all(comm, source), call
        data = np.zeros(n, np.float32)
        with pytest.raises(CollectiveError) as caught:
            c.all_to_all_v(data, data.copy(), [1] * n, [1] * n)
        message = str(caught.value)
        assert message.startswith("all_to_all_v: every rank's collective failed its check "
                                  "there (all_to_all_v on a communicator spanning nodes is "
                                  "not built") and f"across these {nodes} nodes" in message
        assert "\n" not in message
        c.all_gather(np.zeros(n, np.float32), np.zeros(1, np.float32))  # still works
