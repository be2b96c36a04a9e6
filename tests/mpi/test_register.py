"""Communicator.register on the host backend, at every world size: peers map a rank's
own shared memory and calls read it in place (no copy-in); private memory is refused
on every rank naming the rank and why; mappings are counted per allocation and none
outlives unregister or close."""

from __future__ import annotations

import gc
import mmap
import os

import numpy as np
import pytest

import ipcshare
from ipcshare.runtime.errors import BackendError, CollectiveError

pytestmark = pytest.mark.mpi

SEGMENT = 1 << 16


class SharedSegment:
    """Host memory the user already has: a memfd mapped shared, descriptor kept open."""

    def __init__(self, nbytes: int = SEGMENT) -> None:
        self.fd = os.memfd_create("user-segment", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, nbytes)
        self.mapping = mmap.mmap(self.fd, nbytes, mmap.MAP_SHARED)

    def array(self, count: int, dtype: str = "float32", offset: int = 0) -> np.ndarray:
        return np.frombuffer(self.mapping, dtype, count, offset)

    def close(self) -> None:
        gc.collect()  # tracebacks of the errors a test expected hold its arrays in cycles
        self.mapping.close()
        os.close(self.fd)


@pytest.fixture(scope="module")
def communicator():
    with ipcshare.Group(backend="host") as g, g.communicator(max_bytes=1 << 20) as comm:
        yield comm


@pytest.fixture
def segment():
    """A fresh shared segment, closed after the test (when its arrays are gone)."""
    made = SharedSegment()
    yield made
    made.close()


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_peers_see_the_registered_memory_itself_not_a_copy(comm, communicator, segment):
    mine = segment.array(1000, offset=100)   # not page-aligned on purpose
    mine[:] = communicator.rank
    registration = communicator.register(mine)
    comm.Barrier()
    mine[:] = 1000 + communicator.rank     # written after registering
    comm.Barrier()
    seen = [int(np.asarray(registration.peer(r)).view(np.float32)[999])
            for r in range(communicator.size)]
    assert seen == [1000 + r for r in range(communicator.size)]
    assert registration.buffer_ptrs[communicator.rank] == mine.ctypes.data
    del seen
    communicator.unregister(mine)
    with pytest.raises(CollectiveError, match="unregistered"):
        registration.peer(0)


@pytest.mark.parametrize("algo", ("one-shot", "two-shot"))
def test_calls_on_registered_arrays_read_them_in_place(comm, communicator, segment, algo):
    me, n = communicator.rank, communicator.size
    count = 1021
    tensor = segment.array(count, "int32")
    gather_in = segment.array(count, "int32", offset=8192)
    scatter_in = segment.array(n * count, "int32", offset=16384)
    registered = [communicator.register(a) for a in (tensor, gather_in, scatter_in)]
    before = communicator.copies_in
    tensor[:] = np.arange(count, dtype=np.int32) * (me + 1)
    communicator.all_reduce(tensor, algo=algo)            # in place, aliased
    assert (tensor == np.arange(count) * (n * (n + 1) // 2)).all()
    gather_in[:] = me
    gathered = np.empty(n * count, np.int32)
    communicator.all_gather(gathered, gather_in)
    assert (gathered == np.repeat(np.arange(n), count)).all()
    scatter_in[:] = np.arange(n * count, dtype=np.int32)
    block = np.empty(count, np.int32)
    communicator.reduce_scatter(block, scatter_in)
    assert (block == n * np.arange(me * count, (me + 1) * count)).all()
    assert communicator.copies_in == before       # no input was copied in
    assert registered[0].index != registered[1].index
    communicator.unregister(scatter_in)
    communicator.unregister(gather_in)
    communicator.unregister(tensor)
    # An array that is no longer registered is copied in again.
    communicator.all_reduce(np.ones(4, np.float32))
    assert communicator.copies_in == before + 1


def test_private_memory_is_refused_on_every_rank_naming_the_rank(comm, communicator, segment):
    shared = segment.array(64)
    offender = communicator.size - 1
    array = np.zeros(64, np.float32) if communicator.rank == offender else shared
    with pytest.raises(BackendError) as raised:
        communicator.register(array)
    message = str(raised.value)
    del raised  # its traceback's frames hold the arrays
    assert f"rank {offender}@" in message and "private mapping" in message
    assert "comm.empty()" in message
    assert communicator.registered == 0 and communicator._registry.mappings == 0
    assert comm.allgather(message) == [message] * communicator.size


def test_unregistering_an_unknown_array_raises_on_every_rank(comm, communicator, segment):
    shared = segment.array(64)
    with pytest.raises(CollectiveError, match="not registered with this communicator"):
        communicator.unregister(shared)
    with pytest.raises(CollectiveError, match="not contiguous"):
        communicator.register(segment.array(64)[::2])


def test_unregister_takes_the_registration_register_returned(comm, communicator, segment):
    shared = segment.array(64)
    first = communicator.register(shared)
    second = communicator.register(shared)
    assert communicator.registered == 2
    communicator.unregister(first)   # that one, not the latest of the array
    assert first.closed and not second.closed and communicator.registered == 1
    communicator.unregister(second)
    assert communicator.registered == 0 and communicator._registry.mappings == 0


def test_a_registration_one_rank_lacks_raises_on_every_rank(comm, communicator, segment):
    """The last rank passes a registration it already dropped, the others a live one:
    every rank raises the same error naming that rank, and the registries stay in step."""
    shared = segment.array(64)
    stale = communicator.register(shared)
    communicator.unregister(stale)
    live = communicator.register(shared)
    last = communicator.size - 1
    with pytest.raises(CollectiveError) as raised:
        communicator.unregister(stale if communicator.rank == last else live)
    message = str(raised.value)
    del raised
    assert f"rank {last}@" in message and "was unregistered" in message
    assert comm.allgather(message) == [message] * communicator.size
    communicator.unregister(live)   # the next unregister is the same on every rank
    assert communicator.registered == 0 and communicator._registry.mappings == 0


def test_misuse_of_register_on_one_rank_raises_on_every_rank(comm, communicator, segment):
    last = communicator.size - 1
    array = segment.array(64)[::2] if communicator.rank == last else segment.array(64)
    with pytest.raises(CollectiveError) as raised:
        communicator.register(array)
    message = str(raised.value)
    del raised, array
    assert f"rank {last}@" in message and "not contiguous" in message
    assert comm.allgather(message) == [message] * communicator.size
    assert communicator.registered == 0 and communicator._registry.mappings == 0


def test_mappings_are_counted_per_allocation(comm, communicator, segment):
    first, second = segment.array(100), segment.array(100, offset=SEGMENT // 2)
    communicator.register(first)
    communicator.register(second)
    peers = communicator.size - 1
    assert communicator.registered == 2
    # Two spans of one file (different pages): each is mapped on its own.
    mapped = communicator._registry.mappings
    assert mapped == 2 * peers
    communicator.register(first)                  # the same array again: shared
    assert communicator._registry.mappings == mapped
    communicator.unregister(first)
    assert communicator._registry.mappings == mapped
    communicator.unregister(first)
    assert communicator._registry.mappings == peers
    communicator.unregister(second)
    assert communicator._registry.mappings == 0 and communicator.registered == 0


def test_register_and_unregister_in_a_loop_leak_nothing(comm, communicator, segment):
    array = segment.array(256)
    communicator.register(array)
    communicator.unregister(array)
    descriptors = open_descriptors()
    for _ in range(50):
        communicator.register(array)
        communicator.all_reduce(array)
        communicator.unregister(array)
    assert open_descriptors() == descriptors
    assert communicator._registry.mappings == 0


def test_close_releases_every_registration(comm, segment):
    array = segment.array(256)
    with ipcshare.Group(backend="host") as g:
        communicator = g.communicator(max_bytes=4096)
        registration = communicator.register(array)
        communicator.close()
        assert communicator._registry.mappings == 0 and registration.closed
        communicator.close()   # idempotent
