"""ipcshare.triton's device functions on GPUs, at any world size (one GPU per rank, or
ranks sharing GPUs under MPS): every data function with data written by one rank and
read by another after a signal, in the heap and in a registered tensor (its own row);
atomics from every program of every rank at once giving the exact count; 1,000 CUDA
graph replays of barrier_all with no reset from the host. Run under mpiexec; skipped,
with the reason, without a GPU, Triton or torch.

    mpiexec -n 2 python -m pytest --with-mpi -m "gpu and mpi" tests/gpu/test_triton_primitives.py
"""

from __future__ import annotations

import importlib.util
import itertools

import numpy as np
import pytest

import ipcshare
from ipcshare.backends import gpu_count
from ipcshare.window.layout import TRITON_EPOCH_SLOT, TRITON_USER_SLOT_BASE

from .torch_communicator import torch_communicator

torch = pytest.importorskip("torch")
if importlib.util.find_spec("triton") is None:
    pytest.skip("needs Triton (pip install triton)", allow_module_level=True)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import ipcshare.triton as ipt  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.mpi]

BLOCK = 1024
PROGRAMS = 8          # programs of the atomics kernel, every one adding at every rank
ADDS = 50             # atomic adds per program and peer
REPLAYS = 1000
# The exchange's signal values, growing over every run of it on a communicator (a word
# with one writer is a counter): the same sequence on every rank.
_EXCHANGES = itertools.count(1)


@triton.jit
def exchange(inbox, stored, outbox, fetched, loaded, table, word, value,
             BLOCK: tl.constexpr, ALIGN: tl.constexpr, FENCE_ONCE: tl.constexpr):
    """Into the next rank: ``put`` our source block and ``store`` a computed one, then
    ``signal`` (or ``release_fence`` and ``signal_relaxed``); once the previous rank's
    signal is here, ``get`` and ``load`` its outbox (which it wrote before launching).
    ``inbox``, ``stored`` and ``outbox`` lie in the communicator's heap; ``fetched`` and
    ``loaded`` are local. ALIGN: the data functions' ``align`` (0, or the view's)."""
    me = ipt.rank(table)
    world = ipt.world_size(table)
    ahead = (me + 1) % world
    behind = (me + world - 1) % world
    offsets = tl.arange(0, BLOCK)
    mine = tl.load(outbox + offsets)
    ipt.put(inbox + offsets, outbox + offsets, ahead, table, align=ALIGN)
    ipt.store(stored + offsets, mine * 3 + 1, ahead, table, align=ALIGN)
    if FENCE_ONCE:
        ipt.release_fence()
        ipt.signal_relaxed(ipt.pad(ahead, table), word, value)
    else:
        ipt.signal(ipt.pad(ahead, table), word, value)
    ipt.wait_until(ipt.pad(me, table), word, ipt.CMP_GE, value)
    ipt.get(fetched + offsets, outbox + offsets, behind, table, align=ALIGN)
    tl.store(loaded + offsets, ipt.load(outbox + offsets, behind, table, align=ALIGN))


@triton.jit
def count_at_every_rank(counters, swapped, exchanged, table, ADDS: tl.constexpr):
    """Every program adds 1 to word 0 of every rank's counters ADDS times (relaxed, system
    scope); program 0 swaps 0 for rank + 1 in word ``rank`` of every rank's ``swapped``
    (a second swap of 0 must fail) and exchanges rank + 100 into every rank's
    ``exchanged`` word ``rank``, keeping what it held."""
    me = ipt.rank(table)
    world = ipt.world_size(table)
    for peer in range(0, world):
        for _ in range(0, ADDS):
            ipt.atomic_add(counters, 1, peer, table, sem="relaxed", scope="sys")
    if tl.program_id(0) == 0:
        for peer in range(0, world):
            first = ipt.atomic_cas(swapped + me, 0, me + 1, peer, table)
            second = ipt.atomic_cas(swapped + me, 0, me + 7, peer, table)
            old = ipt.atomic_xchg(exchanged + me, me + 100, peer, table, sem="acq_rel",
                                  scope="sys")
            # What we saw, in our own words after the peers' (offset world + peer ...).
            tl.store(swapped + world + peer * 3, first)
            tl.store(swapped + world + peer * 3 + 1, second)
            tl.store(swapped + world + peer * 3 + 2, old)


@triton.jit
def lockstep(tick, mailbox, errors, table):
    """One replay: bump our tick, store it into the next rank's mailbox, barrier; the
    previous rank's tick must be ours; barrier again before anyone stores the next."""
    me = ipt.rank(table)
    world = ipt.world_size(table)
    value = tl.load(tick) + 1
    tl.store(tick, value)
    ipt.store(mailbox, value, (me + 1) % world, table)
    ipt.barrier_all(table)
    if tl.load(mailbox, volatile=True) != value:
        tl.atomic_add(errors, 1)
    ipt.barrier_all(table)


@triton.jit
def put_into_registered(dst, src, table, word, value, ROW: tl.constexpr,
                        BLOCK: tl.constexpr):
    """``put`` our source into the next rank's registered tensor (table row ROW), signal;
    wait for the previous rank's."""
    me = ipt.rank(table)
    world = ipt.world_size(table)
    ahead = (me + 1) % world
    offsets = tl.arange(0, BLOCK)
    ipt.put(dst + offsets, src + offsets, ahead, table, ROW)
    ipt.signal(ipt.pad(ahead, table), word, value)
    ipt.wait_until(ipt.pad(me, table), word, ipt.CMP_GE, value)


@pytest.fixture(scope="module", params=["cuda-vmm", "cuda-ipc"])
def setup(request):
    # Before the group: this module-scoped fixture runs ahead of conftest's per-test skip.
    count, reason = gpu_count()
    if count == 0:
        pytest.skip(f"needs a CUDA GPU: {reason}")
    with torch_communicator(request.param, 4 << 20) as (group, comm, stream):
        if group.time_sliced_gpus:   # the same on every rank: all skip alike
            pytest.skip("ranks take turns on a GPU: spinning kernels need MPS "
                        "(nvidia-cuda-mps-control -d)")
        yield group, comm, stream, ipt.device_view(comm)


def _heap(comm, count, dtype):
    return torch.from_dlpack(comm.empty((count,), dtype))


@pytest.mark.parametrize(("aligned", "fence_once"), [(False, False), (True, True)])
def test_every_data_function_moves_what_one_rank_wrote_to_another(comm, setup, aligned,
                                                                   fence_once):
    group, communicator, stream, view = setup
    size, rank = group.size, group.rank
    # The heap is mapped memory: every rank's base is at least 256-byte aligned.
    assert view.alignment() == 16
    align = view.alignment() if aligned else 0
    inbox, stored, outbox = (_heap(communicator, BLOCK, torch.int32) for _ in range(3))
    fetched = torch.empty(BLOCK, dtype=torch.int32, device="cuda")
    loaded = torch.empty_like(fetched)
    base = np.arange(BLOCK, dtype=np.int64)
    for step in range(1, 6):
        outbox.copy_(torch.from_numpy((base * 31 + 1000 * rank + step).astype(np.int32)))
        exchange[(1,)](inbox, stored, outbox, fetched, loaded, view.table,
                       TRITON_USER_SLOT_BASE, next(_EXCHANGES), BLOCK=BLOCK,
                       ALIGN=align, FENCE_ONCE=fence_once)
        stream.synchronize()
        behind = (rank - 1) % size
        theirs = (base * 31 + 1000 * behind + step).astype(np.int32)
        assert np.array_equal(inbox.cpu().numpy(), theirs)              # put
        assert np.array_equal(stored.cpu().numpy(), theirs * 3 + 1)     # store
        assert np.array_equal(fetched.cpu().numpy(), theirs)            # get
        assert np.array_equal(loaded.cpu().numpy(), theirs)             # load
        comm.Barrier()   # nobody puts the next step while a peer still reads this one
    view.raise_kernel_error()


def test_a_registered_tensor_is_reached_through_its_own_row(comm, setup):
    group, communicator, stream, _ = setup
    size, rank = group.size, group.rank
    # Memory of torch's caching allocator, not in the heap: shared by registration.
    registered = torch.zeros(BLOCK, dtype=torch.int32, device="cuda")
    source = torch.arange(BLOCK, dtype=torch.int32, device="cuda") * 7 + rank
    stream.synchronize()
    registration = communicator.register(registered)
    view = ipt.device_view(communicator, registration)
    assert view.row(registration) == 2
    put_into_registered[(1,)](registered, source, view.table, TRITON_USER_SLOT_BASE + 1, 1,
                              ROW=view.row(registration), BLOCK=BLOCK)
    stream.synchronize()
    behind = (rank - 1) % size
    assert np.array_equal(registered.cpu().numpy(), np.arange(BLOCK) * 7 + behind)
    comm.Barrier()
    communicator.unregister(registered)
    with pytest.raises(ipcshare.CollectiveError, match="was unregistered"):
        view.args()


def test_atomics_from_every_rank_at_once_give_the_exact_count(comm, setup):
    group, communicator, stream, view = setup
    size, rank = group.size, group.rank
    counters = _heap(communicator, 1, torch.int64)
    swapped = _heap(communicator, size + 3 * size, torch.int64)
    exchanged = _heap(communicator, size, torch.int64)
    for array in (counters, swapped, exchanged):
        array.zero_()
    stream.synchronize()
    comm.Barrier()
    count_at_every_rank[(PROGRAMS,)](counters, swapped, exchanged, view.table, ADDS=ADDS)
    stream.synchronize()
    comm.Barrier()
    assert int(counters.item()) == size * PROGRAMS * ADDS
    words = swapped.cpu().numpy()
    assert list(words[:size]) == [r + 1 for r in range(size)]    # every rank's swap held
    seen = words[size:].reshape(size, 3)
    assert list(seen[:, 0]) == [0] * size                         # our first swap saw 0
    assert list(seen[:, 1]) == [rank + 1] * size                  # the second failed
    assert list(seen[:, 2]) == [0] * size                         # exchange saw 0
    assert list(exchanged.cpu().numpy()) == [r + 100 for r in range(size)]
    comm.Barrier()


def test_a_thousand_graph_replays_of_barrier_all_need_no_host_reset(comm, setup):
    group, communicator, stream, view = setup
    window = communicator.window
    tick, mailbox, errors = (_heap(communicator, 1, torch.int64) for _ in range(3))
    for array in (tick, mailbox, errors):
        array.zero_()
    stream.synchronize()
    comm.Barrier()

    def epoch() -> int:
        pad = window.signal_pad(group.rank)
        word = window.engine.download(pad.slice(TRITON_EPOCH_SLOT * 8, 8))
        return int(word.view("<u8")[0])

    before = epoch()
    lockstep[(1,)](tick, mailbox, errors, view.table)   # compiles; warms the capture up
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        lockstep[(1,)](tick, mailbox, errors, view.table)
    for _ in range(REPLAYS):
        graph.replay()
    stream.synchronize()
    view.raise_kernel_error()
    assert int(errors.item()) == 0
    assert int(tick.item()) == REPLAYS + 1
    assert epoch() == before + 2 * (REPLAYS + 1)     # two barriers per call, counted on device
    assert comm.allgather(int(tick.item())) == [REPLAYS + 1] * group.size
    del graph
