"""Device memory across two virtual nodes through each engine between nodes (``--inter``):
the hierarchical all-gather, all-reduce, reduce-scatter and all-to-all, bit-exact, with
the engine named in the result. Run on a GPU node with an even number of ranks (2 x 1 on 2 GPUs,
2 x 2 on 4), e.g. ``mpiexec -n 2 python -m pytest --with-mpi tests/gpu/test_inter_gpu.py``."""

from __future__ import annotations

import socket

import numpy as np
import pytest

import ipcshare
from ipcshare.collectives.across_nodes.choice import nccl4py_missing, rail_gpu_clash
from ipcshare.collectives.across_nodes.hierarchy import typed_view
from ipcshare.patterns import make_pattern
from ipcshare.patterns.driver import run_pattern
from ipcshare.runtime.config import merge_options
from ipcshare.runtime.errors import CollectiveError, ConfigError
from ipcshare.topology.world import VIRTUAL_NODES_ENV

from ..node_runs import run_across_nodes

pytestmark = [pytest.mark.gpu, pytest.mark.mpi]


@pytest.fixture
def two_nodes(comm, monkeypatch):
    if comm.size % 2 or comm.size < 2:
        pytest.skip(f"two virtual nodes of equal size need an even number of ranks, not "
                    f"{comm.size}")
    monkeypatch.setenv(VIRTUAL_NODES_ENV, "2")


def _rails_clash(comm) -> str | None:
    """Where two ranks of one rail use the same GPU (what NCCL refuses), from the UUIDs
    that each rank's group really uses; None when every rail has GPUs of its own."""
    with ipcshare.Group(backend="cuda-vmm") as g:
        places = comm.allgather((g.world.local_rank, socket.gethostname(), g.backend.uuid))
    return rail_gpu_clash(places)


def _needs(engine: str, comm=None) -> None:
    missing = nccl4py_missing() if engine == "nccl" else None
    if missing is not None:
        pytest.skip(f"--inter nccl needs nccl4py: {missing}")
    clash = _rails_clash(comm) if engine == "nccl" else None
    if clash is not None:
        pytest.skip(f"NCCL needs one GPU per rank of a rail: {clash}")


def _run(collective: str, engine: str, **options):
    # options may name the reduction (op=...): the collective has its own name here
    return run_across_nodes(collective, "cuda-vmm", engine, **options)


@pytest.mark.parametrize("engine", ["nccl", "mpi"])
@pytest.mark.parametrize("op", ["allgather", "allreduce", "reducescatter", "alltoall"])
def test_device_memory_crosses_virtual_nodes_through_each_engine(comm, two_nodes, op, engine):
    _needs(engine, comm)
    if op == "alltoall" and _time_sliced(comm):
        pytest.skip("ranks here take turns on a GPU (no MPS): the all-to-all kernels inside "
                    "the node are refused there")
    result = _run(op, engine, min_bytes=4, max_bytes=9 << 20, step_factor=13)
    assert result.nodes == 2 and result.inter == engine
    assert comm.allgather(result.wrong_total) == [0] * comm.size


@pytest.mark.parametrize("engine", ["nccl", "mpi"])
def test_calls_across_nodes_without_a_stream_follow_the_groups_stream(comm, two_nodes, engine):
    """Given no stream=, a communicator spanning nodes runs on the group's own stream, as
    one on one node does: a copy queued there just before a call is what the call reads,
    and a read queued there just after it sees the result. Until 2026-11-27 its steps
    ran on the node group's stream, racing both (612,906 wrong elements at 2 x 2)."""
    _needs(engine, comm)
    if _time_sliced(comm):
        pytest.skip("ranks here take turns on a GPU (no MPS): the all-to-all kernels inside "
                    "the node are refused there")
    n, me = comm.size, comm.rank
    count = 1 << 20                      # int32 elements per block: 4 MiB
    nbytes = n * count * 4
    wrong = 0
    with ipcshare.Group(backend="cuda-vmm") as g:
        group_engine = g.backend.engine()
        with g.communicator(max_bytes=nbytes, inter=engine) as c:
            assert int(c.stream) == int(group_engine.stream)
            w = g.window(3 * nbytes)
            try:
                staged, inp, out = (w.local.slice(i * nbytes, nbytes) for i in range(3))
                for round_ in range(3):
                    # Block q of rank r's input holds r * n + q (+ the round's base).
                    base = round_ * n * n
                    sent = np.repeat(np.arange(n, dtype=np.int32) + me * n + base, count)
                    group_engine.upload(staged, sent.view(np.uint8))
                    group_engine.copy(inp, staged)          # queued: the call must follow it
                    c.all_to_all(typed_view(out, c.memory, "int32"),
                                 typed_view(inp, c.memory, "int32"))
                    got = group_engine.download(out).view(np.int32)   # queued after the call
                    want = np.repeat(np.arange(n, dtype=np.int32) * n + me + base, count)
                    wrong += int((got != want).sum())
                    group_engine.copy(inp, staged)
                    c.all_reduce(typed_view(inp, c.memory, "int32"))
                    got = group_engine.download(inp).view(np.int32)
                    # Element of block q summed over the ranks: n(n-1)/2 * n + n(q + base).
                    want = np.repeat(n * np.arange(n, dtype=np.int32)
                                     + n * n * (n - 1) // 2 + n * base, count)
                    wrong += int((got != want).sum())
            finally:
                w.close()
    assert comm.allgather(wrong) == [0] * n


@pytest.mark.parametrize("op", ["allreduce", "reducescatter"])
@pytest.mark.parametrize("reduction,datatype", [("max", "bfloat16"), ("sum", "float16"),
                                                ("min", "int32")])
def test_nccl_rails_reduce_every_type_bit_exact(comm, two_nodes, op, reduction, datatype):
    _needs("nccl", comm)
    result = _run(op, "nccl", min_bytes=2, max_bytes=1 << 20, step_factor=32, op=reduction,
                  datatype=datatype)
    assert comm.allgather(result.wrong_total) == [0] * comm.size


def test_rails_sharing_a_gpu_refuse_nccl_on_every_rank_and_auto_takes_mpi(comm, two_nodes):
    if nccl4py_missing() is not None:
        pytest.skip(f"auto picks MPI anyway without nccl4py: {nccl4py_missing()}")
    clash = _rails_clash(comm)
    if clash is None:
        pytest.skip("every rank of each rail has a GPU of its own here (needs 2 ranks on 1 GPU)")
    with pytest.raises(ConfigError, match="NCCL needs one GPU per rank") as refused:
        _run("allreduce", "nccl", min_bytes=4, max_bytes=4096)
    assert clash in str(refused.value)
    result = _run("allreduce", "auto", min_bytes=4, max_bytes=1 << 20, step_factor=16)
    assert result.inter == "mpi"
    assert comm.allgather(result.wrong_total) == [0] * comm.size


def test_graphs_across_nodes_need_a_stream_ordered_engine(comm, two_nodes):
    opts = merge_options({"backend": "cuda-vmm", "iters": 2, "warmup": 1, "checks": 1,
                          "graph": True})
    pattern = make_pattern("allreduce", inter="mpi")
    try:
        with ipcshare.Group(backend="cuda-vmm") as g:
            with pytest.raises(ConfigError, match="--graph across nodes needs --inter nccl"):
                run_pattern(g, pattern, opts, emit=lambda _line: None, graph=True)
    finally:
        pattern.close()


@pytest.mark.parametrize("backend", ["cuda-vmm", "cuda-ipc"])
def test_a_communicator_across_virtual_nodes_on_torch_tensors(comm, two_nodes, backend):
    """Group.communicator on a group spanning two virtual nodes: the user's torch tensors
    on a torch stream, every collective, bit-exact (small integers: exact in every order)
    and the same on every rank; the engine between nodes as auto resolves it here."""
    torch = pytest.importorskip("torch")
    me, n = comm.rank, comm.size
    with ipcshare.Group(backend=backend) as g:
        device = g.backend.device
        torch.cuda.set_device(device)
        stream = torch.cuda.Stream(device=device)
        # The largest call: the all-gather's output of n inputs of 262,147 int32.
        with g.communicator(max_bytes=n * 262_147 * 4) as c, torch.cuda.stream(stream):
            assert c.inter == ("mpi" if _rails_clash_of(comm, g) else
                               "nccl" if nccl4py_missing() is None else "mpi")
            # All-to-all's kernels are refused where ranks take turns on a GPU (no MPS).
            taking_turns = bool(g.time_sliced_gpus)
            wrong = 0
            for count in (1, 4099, 262_147):
                base = torch.arange(count, device="cuda", dtype=torch.float32) % 7
                tensor = (base + me).to(torch.bfloat16)
                c.all_reduce(tensor, stream=stream)
                want = (base * n + n * (n - 1) // 2).to(torch.bfloat16)
                gathered = torch.empty(n * count, device="cuda", dtype=torch.int32)
                c.all_gather(gathered, torch.full((count,), me, device="cuda",
                                                  dtype=torch.int32), stream=stream)
                scattered = torch.empty(count, device="cuda", dtype=torch.float32)
                c.reduce_scatter(scattered, base.repeat(n) + me, op="max", stream=stream)
                stream.synchronize()
                if not taking_turns:
                    # All-to-all: block q of rank r's input holds r * n + q everywhere.
                    sent = (torch.arange(n, device="cuda", dtype=torch.int32) + me * n
                            ).repeat_interleave(count)
                    exchanged = torch.empty_like(sent)
                    c.all_to_all(exchanged, sent, stream=stream)
                    stream.synchronize()
                    wrong += int((exchanged != (torch.arange(n, device="cuda",
                                                             dtype=torch.int32)
                                                * n + me).repeat_interleave(count)).sum())
                wrong += int((tensor.view(torch.int16) != want.view(torch.int16)).sum())
                wrong += int((gathered != torch.arange(n, device="cuda", dtype=torch.int32)
                              .repeat_interleave(count)).sum())
                wrong += int((scattered != base + (n - 1)).sum())
    assert comm.allgather(wrong) == [0] * n


def _time_sliced(comm) -> bool:
    """Whether some GPU of this job runs several ranks' contexts by turns (no MPS)."""
    with ipcshare.Group(backend="cuda-vmm") as g:
        return bool(comm.allgather(bool(g.time_sliced_gpus)).count(True))


def _rails_clash_of(comm, g) -> str | None:
    return rail_gpu_clash(comm.allgather((g.world.local_rank, socket.gethostname(),
                                          g.backend.uuid)))


def test_capturing_a_call_across_nodes_with_a_host_blocking_engine_is_refused(comm, two_nodes):
    torch = pytest.importorskip("torch")
    with ipcshare.Group(backend="cuda-vmm") as g:
        device = g.backend.device
        torch.cuda.set_device(device)
        with g.communicator(max_bytes=1 << 16, inter="mpi") as c:
            tensor = torch.ones(1024, device="cuda", dtype=torch.float32)
            stream = torch.cuda.Stream(device=device)
            graph = torch.cuda.CUDAGraph()
            with pytest.raises(CollectiveError, match="inter='nccl' to capture it"):
                with torch.cuda.graph(graph, stream=stream):
                    c.all_reduce(tensor, stream=stream)
            # Outside a capture the same call runs, and gives every rank the sum.
            torch.cuda.synchronize()
            c.all_reduce(tensor, stream=stream)
            stream.synchronize()
            right = bool(torch.equal(tensor, torch.full_like(tensor, comm.size)))
    assert comm.allgather(right) == [True] * comm.size
