"""The NCCL baselines of the all-to-all case on GPUs: NCCL called directly through nccl4py
(ncclAlltoAll on plain buffers and on symmetric windows of a zero-CTA communicator, the
faster reported, for even splits; grouped ncclSend / ncclRecv for random and skewed) and
NCCL through torch.distributed (all_to_all_single, with split sizes where uneven), each
verified with the case's own expected bytes at every split choice, in and out of place,
eager, in CUDA graphs and by latency samples; an output corrupted after the operation is
counted wrong on every path. Needs torch with CUDA, nccl4py for ``nccl``, and one GPU per
rank; sizes follow the world size (each rank's input holds n blocks)."""

from __future__ import annotations

import pytest

import ipcshare
from ipcshare.baselines import gpu_baseline_class
from ipcshare.patterns.alltoall import AllToAll
from ipcshare.runtime.config import DATATYPES
from ipcshare.runtime.errors import ConfigError

from .test_gpu_baselines import _needs

pytestmark = [pytest.mark.gpu, pytest.mark.mpi]

SPLITS = ("even", "random", "skewed")


@pytest.fixture(params=["nccl", "torch"])
def opened(request, comm):
    """(baseline name, the baseline opened on an even all-to-all case, its GPU group)."""
    name = request.param
    _needs(name)
    case = AllToAll(splits="even", datatype="float32")
    with ipcshare.Group(backend="cuda-vmm") as g:
        places = comm.allgather((g.world.hostname, g.backend.uuid))
        if len(set(places)) < len(places):
            with pytest.raises(ConfigError, match="needs one GPU per rank"):
                gpu_baseline_class(name, "alltoall")(g.world, case, g.backend.device)
            pytest.skip(f"--baseline {name} needs one GPU per rank")
        with gpu_baseline_class(name, "alltoall")(g.world, case, g.backend.device) as baseline:
            yield name, baseline


def cases_and_plans(first, splits: str, n: int):
    """(case, ``first`` timing it, plan, mode) of float32 and bfloat16 at each rank's input
    of 7 elements per block (odd), 4099 per block, and 1 MiB rounded to n blocks: in place
    too for uneven splits (the baselines copy the array aside), whatever the CLI runs on
    GPUs (all-to-all-v out of place only)."""
    for datatype in ("float32", "bfloat16"):
        case = AllToAll(splits=splits, datatype=datatype)
        baseline = first.for_pattern(case)
        item = DATATYPES[datatype][1]
        for size in (7 * n * item, 4099 * n * item, (1 << 20) // (n * item) * n * item):
            plan = case.plan(size, n, item)
            for mode in case.modes:
                yield case, baseline, plan, mode


def wrong_when_corrupted(first, splits: str, n: int) -> tuple[int, int, object]:
    """(wrong elements ``first`` counts, ranks that receive anything, its view) when the
    first byte of every output is flipped after each of 3 checked operations, on its
    stream: 4099 float32 elements per block, out of place."""
    case = AllToAll(splits=splits, datatype="float32")
    baseline = first.for_pattern(case)
    plan = case.plan(4099 * n * 4, n, 4)
    bind = baseline._bind

    def corrupting(path, inputs, output, plan, mode):
        operation = bind(path, inputs, output, plan, mode)

        def then_flip() -> None:
            operation()
            if output.numel():
                output[:1].bitwise_not_()
        return then_flip

    baseline._bind = corrupting
    wrong = baseline.measure(plan, "out-of-place", iters=2, warmup=0, checks=3)[1]
    return wrong, sum(1 for rank in range(n) if case.received_bytes(plan, rank, n)), baseline


def _paths(name: str, baseline, case) -> set:
    if name == "torch":
        return {None}
    # Symmetric windows only where NCCL runs an all-to-all on them (even splits, the
    # copy-engine path) and its zero-CTA communicator came up.
    return set(baseline._paths("out-of-place")) if case.splits == "even" else {"plain"}


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("splits", SPLITS)
def test_every_split_and_mode_is_verified_on_every_path(comm, opened, splits, graph):
    name, first = opened
    n = comm.size
    for case, baseline, plan, mode in cases_and_plans(first, splits, n):
        seconds, wrong, path = baseline.measure(plan, mode, iters=4, warmup=1, checks=2,
                                                buffers=2, graph=graph)
        assert wrong == 0, (name, splits, case.datatype, plan.size, mode)
        assert seconds > 0 and baseline.wrong_paths == {}
        paths = _paths(name, baseline, case)
        assert path in paths and set(baseline.path_results) == paths
        assert baseline.path_results[path] == min(baseline.path_results.values())
    samples, wrong, path = baseline.measure_latency(plan, "out-of-place", iters=5, warmup=1,
                                                    checks=1, graph=graph)
    assert wrong == 0 and len(samples) == 5 and path in _paths(name, baseline, case)
    baseline.after_kernel = True   # an empty kernel before each operation
    try:
        assert baseline.measure(plan, "out-of-place", iters=3, warmup=1, checks=2,
                                graph=graph)[1] == 0
    finally:
        baseline.after_kernel = False
    # Every rank picked the same path (from figures reduced over ranks).
    assert len(set(comm.allgather(path))) == 1
    if name == "nccl":
        assert first.version.startswith("NCCL ") and "nccl4py" in first.version


@pytest.mark.parametrize("splits", SPLITS)
def test_a_corrupted_output_is_counted_wrong_on_every_path(comm, opened, splits):
    """One byte of every rank's output flipped after each checked operation: one wrong
    element per rank that receives anything, per check, on every path; with no right
    path left, the count is every path's (and none is set aside as the wrong one)."""
    name, first = opened
    wrong, receivers, baseline = wrong_when_corrupted(first, splits, comm.size)
    assert wrong == 3 * receivers * len(_paths(name, baseline, baseline.case))
    assert baseline.wrong_paths == {}
