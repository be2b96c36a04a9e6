"""Communicator.register on GPUs: torch's caching allocator (legacy IPC), torch's
expandable segments (cuMem POSIX FD, switched on at run time for new segments) and
cupy; a peer really reads the registered memory; errors name the rank and the cause.
Run under mpiexec with one GPU per rank (or shared GPUs)."""

from __future__ import annotations

import pytest

import ipcshare
from ipcshare.backends.device_buffer import DeviceArray
from ipcshare.collectives.algorithms import algorithm
from ipcshare.collectives.choice import choose
from ipcshare.runtime.errors import BackendError
from tests.sizing import max_bytes_for

pytestmark = [pytest.mark.gpu, pytest.mark.mpi]

torch = pytest.importorskip("torch")


def _offset_count(size: int) -> int:
    """Elements of each rank's input in the calls on registered tensors: a multiple of
    the ranks, not of 16-byte vectors."""
    return 4096 * size + 4 * size


@pytest.fixture(scope="module")
def setup():
    with ipcshare.Group(backend="cuda-vmm") as g:
        # The largest call: the all-gather of every rank's float32 input of
        # _offset_count(n) elements, n * 16,400 * n bytes (1,049,600 at 8 ranks).
        max_bytes = max_bytes_for(g.size, 4 * _offset_count(g.size), at_least=1 << 20)
        with g.communicator(max_bytes=max_bytes) as comm:
            torch.cuda.set_device(g.backend.device)
            yield g, comm


def _peer_values(registration, rank: int, count: int, dtype) -> list:
    """What this rank reads of rank ``rank``'s registered tensor, through its mapping."""
    view = torch.from_dlpack(registration.peer(rank))[:count * 4].view(dtype)
    return view.cpu().tolist()


def check_peers_read_the_registered_tensor(g, comm, tensor) -> None:
    """Register, overwrite after registering, read every peer's through the mapping."""
    registration = comm.register(tensor)
    try:
        tensor.fill_(1000 + g.rank)           # after registration: a copy would miss it
        torch.cuda.synchronize()
        g.barrier()
        for rank in range(g.size):
            assert _peer_values(registration, rank, 4, torch.float32) == [1000.0 + rank] * 4
        g.barrier()
        # A part of the registered tensor (within the communicator's max_bytes) as input.
        part = tensor.view(-1)[:4096]
        out = torch.empty(g.size * part.numel(), dtype=part.dtype, device=part.device)
        comm.all_gather(out, part)
        comm.synchronize()
        assert out.view(g.size, -1)[:, 0].tolist() == [1000.0 + r for r in range(g.size)]
    finally:
        comm.unregister(tensor)


def test_torch_caching_allocator_tensors_are_shared_by_legacy_ipc(setup):
    g, comm = setup
    tensor = torch.zeros(4099, dtype=torch.float32, device=f"cuda:{g.backend.device}")
    check_peers_read_the_registered_tensor(g, comm, tensor[3:])   # inside a block
    assert comm.registered == 0


def test_cupy_arrays_are_shared(setup):
    cupy = pytest.importorskip("cupy")
    g, comm = setup
    with cupy.cuda.Device(g.backend.device):
        array = cupy.zeros(2048, dtype=cupy.float32)
    check_peers_read_the_registered_tensor(g, comm, torch.from_dlpack(array))


def test_two_tensors_of_one_block_map_it_once(setup):
    g, comm = setup
    block = torch.zeros(1 << 16, dtype=torch.float32, device=f"cuda:{g.backend.device}")
    first, second = comm.register(block[:100]), comm.register(block[1000:1100])
    try:
        assert comm._registry.mappings == g.size - 1   # one per peer: the allocation, once
        assert g.backend.imports_mapped >= g.size - 1
        assert second.buffer_ptrs[g.rank] - first.buffer_ptrs[g.rank] == 4000
    finally:
        comm.unregister(block[1000:1100])
        comm.unregister(block[:100])
    assert comm._registry.mappings == 0


def test_host_memory_and_pool_memory_are_refused_naming_the_rank_and_cause(setup):
    g, comm = setup
    offender = g.size - 1
    device = f"cuda:{g.backend.device}"
    good = torch.zeros(256, device=device)
    pinned = torch.zeros(256).pin_memory()
    with pytest.raises(BackendError) as raised:
        comm.register(pinned if g.rank == offender else good)
    assert f"rank {offender}@" in str(raised.value) and "pinned host memory" in str(raised.value)
    del raised
    # cudaMallocAsync memory (a stream-ordered pool) is not legacy-IPC capable.
    from cuda.bindings import driver

    stream = torch.cuda.current_stream().cuda_stream
    if g.rank == offender:
        err, ptr = driver.cuMemAllocAsync(1 << 20, stream)
        assert int(err) == 0
        torch.cuda.synchronize()
        pool_array = DeviceArray(int(ptr), 1 << 20, g.backend.device, None,
                                 shape=(1 << 18,), dtype="float32")
    try:
        with pytest.raises(BackendError) as raised:
            comm.register(pool_array if g.rank == offender else good)
        assert f"rank {offender}@" in str(raised.value)
        assert "not legacy-IPC capable" in str(raised.value)
        del raised
    finally:
        if g.rank == offender:
            driver.cuMemFreeAsync(ptr, stream)
            torch.cuda.synchronize()
    assert comm.registered == 0


@pytest.fixture
def expandable_segments():
    """torch's allocator with expandable segments (cuMem allocations) for new segments,
    switched back afterwards; skips where this torch cannot switch at run time."""
    settings = getattr(torch.cuda.memory, "_set_allocator_settings", None)
    if settings is None:
        pytest.skip("this torch cannot switch expandable segments at run time")
    torch.cuda.empty_cache()
    settings("expandable_segments:True")
    yield
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    settings("expandable_segments:False")


def test_torch_expandable_segments_are_shared_by_posix_fd(setup, expandable_segments):
    from cuda.bindings import driver

    g, comm = setup
    tensor = torch.zeros(3 << 20, dtype=torch.float32, device=f"cuda:{g.backend.device}")
    attribute = driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE
    err, legacy = driver.cuPointerGetAttribute(attribute, tensor.data_ptr())
    assert int(err) == 0 and not legacy, "expected a cuMem allocation of expandable segments"
    check_peers_read_the_registered_tensor(g, comm, tensor[:1 << 18])


# Calls on registered tensors: peers read them in place (no copy into the window).
_REDUCE_ALGOS = {"all_reduce": ("one-shot", "two-shot", "stepped", "push", "auto"),
                 "reduce_scatter": ("one-shot", "stepped", "push", "auto"),
                 "all_gather": ("pull", "stepped", "push", "auto")}


def _run_call(comm, collective: str, source, algo: str, n: int):
    """One call of ``collective`` on ``source`` (out of place) and its output."""
    if collective == "all_reduce":
        out = torch.empty_like(source)
        comm.all_reduce(source, output=out, algo=algo)
    elif collective == "reduce_scatter":
        out = torch.empty(source.numel() // n, dtype=source.dtype, device=source.device)
        comm.reduce_scatter(out, source, algo=algo)
    else:
        out = torch.empty(n * source.numel(), dtype=source.dtype, device=source.device)
        comm.all_gather(out, source, algo=algo)
    return out


def _copies_input(comm, g, collective: str, algo: str, largest_nbytes: int) -> bool:
    """Whether ``algo`` (``auto`` resolved as the communicator resolves it, by the call's
    largest array) copies an unregistered input in: the one-shot family stages it; ll
    and push never do, since no peer reads it."""
    if algo == "auto":
        algo = choose(comm.memory, collective, largest_nbytes, g.size,
                      shared_gpus=bool(g.time_sliced_gpus))
    return algorithm(comm.memory, collective, algo).stages_input


def _expected(collective: str, count: int, me: int, n: int, device):
    """What every rank's input ``arange(count) % 11 + rank`` gives: exact in float32."""
    base = torch.arange(count, device=device, dtype=torch.float32) % 11
    if collective == "all_reduce":
        return base * n + n * (n - 1) // 2
    if collective == "reduce_scatter":
        block = count // n
        return (base * n + n * (n - 1) // 2)[me * block:(me + 1) * block]
    return torch.cat([base + r for r in range(n)])


@pytest.mark.parametrize("collective,algo", [(c, a) for c, algos in _REDUCE_ALGOS.items()
                                             for a in algos])
def test_calls_read_registered_tensors_in_place_at_any_offset(setup, collective, algo):
    g, comm = setup
    me, n = g.rank, g.size
    device = f"cuda:{g.backend.device}"
    count = _offset_count(n)
    # Each rank's input starts at a different offset of its registered tensor: peers find
    # it through the call's header, not by assuming their own offset.
    holder = torch.zeros(count + 64 * (me + 1), dtype=torch.float32, device=device)
    source = holder[64 * (me + 1):]
    source.copy_(torch.arange(count, device=device, dtype=torch.float32) % 11 + me)
    comm.register(holder)
    try:
        before = comm.copies_in
        out = _run_call(comm, collective, source, algo, n)
        comm.synchronize()
        zero_copy = comm.copies_in == before
        right = bool(torch.equal(out, _expected(collective, count, me, n, device)))
    finally:
        comm.unregister(holder)
    # Unregistered: the same call copies the input in again where its algorithm stages
    # inputs, with the same result.
    before = comm.copies_in
    again = _run_call(comm, collective, source, algo, n)
    comm.synchronize()
    largest = max(source.numel(), out.numel()) * source.element_size()
    copied = comm.copies_in == before + _copies_input(comm, g, collective, algo, largest)
    assert (right, zero_copy, bool(torch.equal(again, out)), copied) == (True,) * 4
    assert comm.registered == 0


@pytest.mark.parametrize("op", ["all_reduce", "all_gather"])
@pytest.mark.parametrize("where", ["heap", "registered", "rank 0 only", "in place"])
def test_push_stores_into_outputs_the_peers_can_reach(setup, where, op):
    """Where a rank's output lies in its heap or in a registered array, its peers store
    their reduced chunks (all-gather: their blocks) into it directly (the header says
    where) and it copies nothing; elsewhere they go through its result area (inbox).
    Outputs at a different offset on each rank, one rank reachable and the other not, and
    in place on a registered tensor
    (peers store into the input's chunks after this rank has pushed them out); three
    calls with new data each."""
    g, comm = setup
    me, n = g.rank, g.size
    device = f"cuda:{g.backend.device}"
    count = 4096 * n + 4 * n + 3  # chunks that do not end on 16-byte vectors
    part = count // n  # all-gather: each rank's block of the output
    if op == "all_gather":
        count = part * n
    holder = torch.zeros(count + 64 * (me + 1), dtype=torch.float32, device=device)
    reachable = holder[64 * (me + 1):]
    if where != "heap":
        comm.register(holder)
    try:
        if where == "heap":
            out = torch.from_dlpack(comm.empty((count,), "float32"))
        elif where == "rank 0 only" and me != 0:
            out = torch.zeros(count, dtype=torch.float32, device=device)
        else:
            out = reachable
        for call in range(3):
            inputs = [torch.arange(count, dtype=torch.float32) % (13 + call) + r * 1000
                      for r in range(n)]
            if op == "all_gather":
                want = torch.cat([values[:part] for values in inputs]).to(device)
                if where == "in place":
                    out[me * part:(me + 1) * part].copy_(inputs[me][:part].to(device))
                    comm.all_gather(out, out[me * part:(me + 1) * part], algo="push")
                else:
                    comm.all_gather(out, inputs[me][:part].to(device), algo="push")
            else:
                want = sum(inputs[1:], inputs[0]).to(device)
                if where == "in place":
                    out.copy_(inputs[me].to(device))
                    comm.all_reduce(out, algo="push")
                else:
                    source = inputs[me].to(device)
                    comm.all_reduce(source, output=out, algo="push")
            comm.synchronize()
            assert torch.equal(out, want), (where, call)
    finally:
        if where != "heap":
            comm.unregister(holder)


def test_graph_replays_of_a_call_on_registered_tensors_see_new_data(setup):
    g, comm = setup
    me, n = g.rank, g.size
    device = f"cuda:{g.backend.device}"
    tensor = torch.zeros(1 << 14, dtype=torch.float32, device=device)
    out = torch.empty_like(tensor)
    comm.register(tensor)
    try:
        stream = torch.cuda.Stream(device=device)
        bound = comm.bind("all_reduce", tensor, output=out, algo="one-shot", stream=stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            bound()
        wrong = 0
        for step in range(50):
            tensor.fill_(float(step * 10 + me))
            torch.cuda.synchronize()
            graph.replay()
            torch.cuda.synchronize()
            wrong += int((out != float(step * 10 * n + n * (n - 1) // 2)).sum())
        comm.synchronize(stream)
        del graph
    finally:
        comm.unregister(tensor)
    assert wrong == 0


def test_unregister_takes_the_registration_register_returned(setup):
    g, comm = setup
    tensor = torch.full((4096,), float(g.rank), device=f"cuda:{g.backend.device}")
    before = comm.registered
    first = comm.register(tensor)
    second = comm.register(tensor)
    comm.unregister(first)   # that registration, not the array's latest
    assert first.closed and not second.closed and comm.registered == before + 1
    out = torch.empty(g.size * tensor.numel(), device=tensor.device)
    comm.all_gather(out, tensor)   # still read through the live registration
    comm.synchronize()
    assert out.view(g.size, -1)[:, 0].tolist() == [float(r) for r in range(g.size)]
    comm.unregister(second)
    assert comm.registered == before
