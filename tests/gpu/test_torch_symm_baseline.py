"""The torch-symm baseline on GPUs: PyTorch symmetric memory's one-shot and two-shot
all-reduce, verified with the all-reduce case's data, eager and in CUDA graphs (needs
torch with CUDA and NCCL, one GPU per rank, all on one node).

Run it in a pytest process of its own: symmetric memory keeps per-group state that a
process group destroyed and made again (by other baseline tests) would not refresh."""

from __future__ import annotations

import pytest

import ipcshare
from ipcshare.patterns import make_pattern
from ipcshare.runtime.errors import ConfigError

pytestmark = [pytest.mark.gpu, pytest.mark.mpi]


@pytest.fixture(scope="module")
def symm():
    """One torch-symm baseline for the module (one process group, made once)."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    pytest.importorskip("torch.distributed._symmetric_memory")
    from ipcshare.baselines.torch_symm import TorchSymmBaseline

    case = make_pattern("allreduce", op="sum", datatype="bfloat16")
    with ipcshare.Group(backend="cuda-vmm") as g:
        places = comm.allgather((g.world.hostname, g.backend.uuid))
        if len(set(places)) < len(places):
            with pytest.raises(ConfigError, match="needs one GPU per rank"):
                TorchSymmBaseline(g.world, case, g.backend.device)
            pytest.skip("torch-symm needs one GPU per rank")
        if g.world.node_count > 1:
            pytest.skip("torch-symm runs on one node")
        with TorchSymmBaseline(g.world, case, g.backend.device) as baseline:
            yield baseline


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("datatype", ["bfloat16", "float32"])
def test_one_shot_and_two_shot_are_verified_and_the_faster_reported(comm, symm, datatype,
                                                                    graph):
    n = comm.size
    case = make_pattern("allreduce", op="sum", datatype=datatype)
    baseline = symm.for_pattern(case)
    element = 2 if datatype == "bfloat16" else 4
    for size in (1024, 64 << 10, 1 << 20, 6 * n * 1024):
        plan = case.plan(size, n, element)
        for mode, paths in (("out-of-place", {"one-shot", "two-shot"}),
                            ("in-place", {"two-shot"})):
            seconds, wrong, path = baseline.measure(plan, mode, iters=4, warmup=1, checks=2,
                                                    buffers=2, graph=graph)
            assert wrong == 0, (datatype, size, mode)
            assert seconds > 0 and path in paths
            assert set(baseline.path_results) == paths
    samples, wrong, path = baseline.measure_latency(plan, "out-of-place", iters=5, warmup=1,
                                                    checks=1, graph=graph)
    assert wrong == 0 and len(samples) == 5 and path in ("one-shot", "two-shot")
    baseline.after_kernel = True
    try:
        _seconds, wrong, _path = baseline.measure(plan, "out-of-place", iters=3, warmup=1,
                                                  checks=2, graph=graph)
    finally:
        baseline.after_kernel = False
    assert wrong == 0
    assert symm.version.startswith("PyTorch ") and "multicast off" in symm.version


def test_sizes_its_kernels_cannot_take_are_refused(comm, symm):
    case = make_pattern("allreduce", op="sum", datatype="bfloat16")
    plan = case.plan(2 * 3, comm.size, 2)  # 3 elements: 6 bytes
    with pytest.raises(ConfigError, match="multiple of 4 bytes"):
        symm.for_pattern(case).measure(plan, "out-of-place", iters=1, warmup=0, checks=1)
