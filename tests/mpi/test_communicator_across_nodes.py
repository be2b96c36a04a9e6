"""``Group.communicator`` on a group spanning (virtual) nodes, host backend, ``inter``
MPI: every op, dtype and reduction in and out of place at odd counts, against a reference
computed from every rank's seeded data, the same bytes on every rank; arrays from
``empty()``; bound calls; disagreement and misuse on every rank. At -n 2 the nodes are
2 x 1, at -n 4 2 x 2 and 4 x 1; -n 1 and -n 3 have no even split and check the refusal
(-n 3 as 3 nodes of 1 runs too)."""

from __future__ import annotations

import numpy as np
import pytest

import ipcshare
from ipcshare.collectives.across_nodes.communicator import NodesCommunicator
from ipcshare.runtime.errors import CollectiveError, ConfigError, Unsupported
from ipcshare.topology.world import VIRTUAL_NODES_ENV

from ..reduction_reference import NUMPY_DTYPES, mismatches, reference, seeded_values

pytestmark = pytest.mark.mpi

MAX_BYTES = 1 << 18
REDUCE_DTYPES = ("float32", "float16", "bfloat16", "int32")
OPS = ("sum", "max", "min")
# One element (fewer than a node's ranks: the all-reduce's tail), primes, 4099.
COUNTS = (1, 3, 13, 1021, 4099)


def _splits(size: int) -> list[int]:
    return [k for k in (2, 3, 4) if k <= size and size % k == 0]


@pytest.fixture(params=[2, 3, 4], ids=lambda k: f"{k}-nodes")
def nodes(request, comm, monkeypatch):
    if request.param not in _splits(comm.size):
        pytest.skip(f"{request.param} even virtual nodes need a multiple of "
                    f"{request.param} ranks, not {comm.size}")
    monkeypatch.setenv(VIRTUAL_NODES_ENV, str(request.param))
    return request.param


@pytest.fixture
def communicator(nodes):
    with ipcshare.Group(backend="host") as g:
        with g.communicator(max_bytes=MAX_BYTES, inter="mpi") as c:
            yield c


def _values(dtype: str, count: int, seed: int, rank: int, op: str) -> np.ndarray:
    """Seeded data whose sum is exact in every order and at every level (small integers,
    specials included) for sums; full-range values and specials for max / min."""
    if op != "sum" or dtype == "int32":
        return seeded_values(dtype, count, seed, rank, specials=True)
    rng = np.random.default_rng([seed, rank, 7])
    values = rng.integers(-8, 9, size=count).astype(np.float32).astype(NUMPY_DTYPES[dtype])
    values[:min(count, 3)] = np.array([np.inf, -0.0, np.nan], np.float32)[:min(count, 3)]
    return values


def _same_everywhere(comm, array: np.ndarray) -> bool:
    mine = array.tobytes()
    return all(theirs == mine for theirs in comm.allgather(mine))


def test_a_group_across_nodes_gets_a_nodes_communicator(comm, communicator, nodes):
    assert isinstance(communicator, NodesCommunicator)
    assert communicator.inter == "mpi" and communicator.size == comm.size
    assert communicator.per_node == comm.size // nodes


@pytest.mark.parametrize("in_place", [True, False], ids=["in-place", "out-of-place"])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", REDUCE_DTYPES)
def test_all_reduce_matches_the_reference(comm, communicator, dtype, op, in_place):
    me, n = comm.rank, comm.size
    wrong = 0
    for seed, count in enumerate(COUNTS):
        inputs = [_values(dtype, count, seed, r, op) for r in range(n)]
        want = reference(dtype, op, inputs)
        tensor = inputs[me].copy()
        if in_place:
            got = communicator.all_reduce(tensor, op=op)
            assert got is tensor
        else:
            got = np.full(count, 7, NUMPY_DTYPES[dtype])
            communicator.all_reduce(tensor, op=op, output=got)
            assert np.array_equal(tensor.view(np.uint8), inputs[me].view(np.uint8))
        wrong += mismatches(dtype, op, got, want)
        assert _same_everywhere(comm, got)
    assert comm.allgather(wrong) == [0] * n


@pytest.mark.parametrize("in_place", [True, False], ids=["in-place", "out-of-place"])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", REDUCE_DTYPES)
def test_reduce_scatter_matches_the_reference(comm, communicator, dtype, op, in_place):
    me, n = comm.rank, comm.size
    wrong = 0
    for seed, block in enumerate((1, 5, 1021)):
        inputs = [_values(dtype, n * block, seed, r, op) for r in range(n)]
        want = reference(dtype, op, inputs)[me * block:(me + 1) * block]
        source = inputs[me].copy()
        output = (source[me * block:(me + 1) * block] if in_place
                  else np.full(block, 3, NUMPY_DTYPES[dtype]))
        communicator.reduce_scatter(output, source, op=op)
        wrong += mismatches(dtype, op, output, want)
    assert comm.allgather(wrong) == [0] * n


@pytest.mark.parametrize("in_place", [True, False], ids=["in-place", "out-of-place"])
@pytest.mark.parametrize("dtype", ("uint8", "float32", "bfloat16", "float64"))
def test_all_gather_gathers_every_rank_in_order(comm, communicator, dtype, in_place):
    me, n = comm.rank, comm.size
    numpy_dtype = NUMPY_DTYPES.get(dtype, np.dtype(dtype))
    for count in (1, 7, 1000):
        blocks = [np.random.default_rng([count, r]).integers(0, 255, count * numpy_dtype.itemsize,
                                                              dtype=np.uint8).view(numpy_dtype)
                  for r in range(n)]
        output = np.zeros(n * count, numpy_dtype)
        if in_place:
            output[me * count:(me + 1) * count] = blocks[me]
            source = output[me * count:(me + 1) * count]
        else:
            source = blocks[me].copy()
        communicator.all_gather(output, source)
        assert output.view(np.uint8).tobytes() == b"".join(b.view(np.uint8).tobytes()
                                                            for b in blocks)


def test_arrays_from_empty_and_bound_calls(comm, communicator):
    me, n = comm.rank, comm.size
    tensor = communicator.empty((1000,), "int32")
    bound = communicator.bind("all_reduce", tensor, op="sum")
    for step in range(3):
        tensor[:] = np.arange(1000, dtype=np.int32) * (me + 1) + step
        assert bound() is tensor
        want = np.arange(1000, dtype=np.int32) * (n * (n + 1) // 2) + n * step
        assert np.array_equal(tensor, want)
    assert communicator.copies_in >= 0


def test_ranks_that_disagree_raise_on_every_rank(comm, communicator):
    count = 10 + (comm.rank == comm.size - 1)
    with pytest.raises(CollectiveError, match="ranks disagree on a collective call"):
        communicator.all_reduce(np.ones(count, np.float32))
    # The communicator is still usable after every rank raised.
    data = np.ones(4, np.float32)
    communicator.all_reduce(data)
    assert np.array_equal(data, np.full(4, comm.size, np.float32))


def test_misuse_raises_on_the_calling_rank_with_the_values(comm, communicator):
    with pytest.raises(CollectiveError, match="algo='one-shot': a communicator spanning "
                                              "nodes runs the hierarchical algorithm"):
        communicator.all_reduce(np.ones(4, np.float32), algo="one-shot")
    with pytest.raises(CollectiveError, match=r"output has 3 elements, expected \d+ x 2"):
        communicator.all_gather(np.zeros(3, np.float32), np.zeros(2, np.float32))
    with pytest.raises(CollectiveError, match="max_bytes=262144"):
        communicator.all_reduce(np.ones(MAX_BYTES // 4 + 1, np.float32))
    with pytest.raises(Unsupported, match="register on a communicator of one node's group"):
        communicator.register(np.ones(4, np.float32))


def test_uneven_nodes_are_refused_on_every_rank(comm, monkeypatch):
    if comm.size < 3 or comm.size % 2 == 0:
        pytest.skip("uneven virtual nodes need an odd number of ranks, 3 or more")
    monkeypatch.setenv(VIRTUAL_NODES_ENV, "2")
    with ipcshare.Group(backend="host") as g:
        with pytest.raises(ConfigError, match="needs as many ranks on every node"):
            g.communicator(max_bytes=4096, inter="mpi")
        assert comm.allgather(g.world.node_count) == [2] * comm.size


def test_kept_bindings_do_not_keep_the_users_arrays_alive(comm, communicator):
    import gc
    import weakref

    data = np.ones(256, np.float32)
    gone = weakref.ref(data)
    communicator.all_reduce(data)
    assert np.array_equal(data, np.full(256, comm.size, np.float32))
    del data
    gc.collect()
    assert gone() is None


def test_sizes_are_agreed_by_the_whole_group_before_any_node_sets_up(comm, nodes):
    import time

    # The last rank (on the last node) asks for another size; every rank must raise at
    # once, none left waiting in the rail setup for the node that refused.
    asked = 8192 if comm.rank == comm.size - 1 else 4096
    started = time.monotonic()
    with ipcshare.Group(backend="host") as g:
        with pytest.raises(CollectiveError, match="ranks disagree on the communicator's sizes"):
            g.communicator(max_bytes=asked, inter="mpi")
        with pytest.raises(CollectiveError, match="heap_bytes=-1: expected an int"):
            g.communicator(max_bytes=4096, heap_bytes=-1 if comm.rank == 0 else 0,
                           inter="mpi")
    assert time.monotonic() - started < 10


def test_calls_on_ever_new_arrays_at_max_bytes_reuse_the_scratch(comm, communicator):
    n = comm.size
    count = MAX_BYTES // (4 * n)
    for step in range(6):  # each call a new pair of arrays: a new kept binding
        source = np.full(count, comm.rank + step, np.float32)
        output = np.zeros(n * count, np.float32)
        communicator.all_gather(output, source)
        want = np.repeat(np.arange(n, dtype=np.float32) + step, count)
        assert np.array_equal(output, want), step
        data = np.full(MAX_BYTES // 4, 1.0, np.float32)
        communicator.reduce_scatter(data[:MAX_BYTES // 4 // n], data[:MAX_BYTES // 4 // n * n]
                                    .copy())


def test_at_most_sixteen_calls_keep_their_scratch(comm, communicator):
    kept = []
    for step in range(20):
        data = np.full(100 + step, float(step), np.float32)   # a new shape each time
        communicator.all_reduce(data)
        assert np.array_equal(data, np.full(100 + step, step * comm.size, np.float32))
        kept.append(len(communicator._bound))
    assert max(kept) == 16 and kept[-1] == 16
