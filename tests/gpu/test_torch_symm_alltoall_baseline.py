"""The torch-symm baseline of the all-to-all case on GPUs: PyTorch symmetric memory's
all_to_all_vdev (splits on the device, NVSHMEM backend) verified with the case's expected
bytes at every split choice, in and out of place, eager and in CUDA graphs; sizes its
kernel cannot cut refused before it runs; a corrupted output counted wrong. Needs torch
with symmetric memory, all_to_all_vdev and NVSHMEM, one GPU per rank, one node; skips
with the reason where this torch lacks them.

Run it in a pytest process of its own (tools/gpu_check.py alltoall does): symmetric
memory's backend is set once per process, and NVSHMEM here would take the CUDA backend
from the all-reduce baseline's tests (tests/gpu/test_torch_symm_baseline.py)."""

from __future__ import annotations

import os

import pytest

import ipcshare
from ipcshare.baselines.torch_symm_alltoall import NBLOCKS_SETTING, vdev_refusal
from ipcshare.patterns.alltoall import AllToAll
from ipcshare.runtime.errors import ConfigError

# Its kernel takes one block per peer up to 64 KiB per rank (the 7 and 4099 elements per
# block), several at 1 MiB: even splits divide there, uneven ones may be refused.
from .test_gpu_alltoall_baselines import cases_and_plans, wrong_when_corrupted

pytestmark = [pytest.mark.gpu, pytest.mark.mpi]

SPLITS = ("even", "random", "skewed")
# What a torch without the op says (the baseline's refusals): a skip, not a failure.
_LACKS = ("which this torch", "NVSHMEM is not available", "this torch's all_to_all_vdev takes",
          "lacks")


@pytest.fixture(scope="module")
def symm(request):
    """One torch-symm all-to-all baseline for the module (one process group, made once)."""
    files = {str(item.path) for item in request.session.items}
    if len(files) > 1:
        pytest.skip("symmetric memory's backend is set once per process: run this file in a "
                    "pytest process of its own (tools/gpu_check.py alltoall does)")
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    from ipcshare.baselines.torch_symm_alltoall import TorchSymmAllToAllBaseline

    case = AllToAll(splits="even", datatype="float32")
    with ipcshare.Group(backend="cuda-vmm") as g:
        places = comm.allgather((g.world.hostname, g.backend.uuid))
        if len(set(places)) < len(places):
            pytest.skip("torch-symm needs one GPU per rank")
        if g.world.node_count > 1:
            pytest.skip("torch-symm runs on one node")
        try:
            baseline = TorchSymmAllToAllBaseline(g.world, case, g.backend.device)
        except ConfigError as exc:
            if any(words in str(exc) for words in _LACKS):
                pytest.skip(str(exc))
            raise
        with baseline:
            yield baseline


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("splits", SPLITS)
def test_all_to_all_vdev_is_verified_or_refused_before_it_runs(comm, symm, splits, graph):
    n = comm.size
    setting = os.environ.get(NBLOCKS_SETTING)
    for case, baseline, plan, mode in cases_and_plans(symm, splits, n):
        if vdev_refusal(case, plan, n, setting) is not None:
            with pytest.raises(ConfigError, match="traps on a remainder"):
                baseline.measure(plan, mode, iters=1, warmup=0, checks=1)
            continue
        seconds, wrong, path = baseline.measure(plan, mode, iters=4, warmup=1, checks=2,
                                                buffers=2, graph=graph)
        assert wrong == 0, (splits, case.datatype, plan.size, mode)
        assert seconds > 0 and path is None and baseline.wrong_paths == {}
    assert symm.version.startswith("PyTorch ") and "all_to_all_vdev" in symm.version


def test_a_corrupted_output_is_counted_wrong(comm, symm):
    wrong, receivers, _view = wrong_when_corrupted(symm, "random", comm.size)
    assert wrong == 3 * receivers
