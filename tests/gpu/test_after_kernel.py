"""``--after-kernel``: an empty kernel on the stream before every operation, ours and the
NCCL baseline's. The operations still verify, the kernel really is launched before each
one, and the result document says how it was timed."""

from __future__ import annotations

import pytest

import ipcshare
from ipcshare.patterns import make_pattern
from ipcshare.patterns.driver import run_pattern
from ipcshare.runtime.config import merge_options
from ipcshare.runtime.errors import ConfigError, KernelCompileError

pytestmark = [pytest.mark.gpu, pytest.mark.mpi, pytest.mark.nvrtc]

_OPTIONS = {"backend": "cuda-vmm", "iters": 3, "warmup": 2, "checks": 2, "min_bytes": 1000,
            "max_bytes": 3 << 20, "step_factor": 57, "datatype": "uint8"}


def _count_empty_kernel_launches(group) -> list[int]:
    """Wrap the backend's kernel loader so launches of the empty kernel are counted."""
    calls = [0]
    load = group.backend.kernels

    def kernels(source):
        loaded = load(source)
        if source != "empty.cu":
            return loaded

        class Counting:
            def launcher(self, name, args, **where):
                launch = loaded.launcher(name, args, **where)

                def run():
                    calls[0] += 1
                    launch()
                return run
        return Counting()
    group.backend.kernels = kernels
    return calls


@pytest.mark.parametrize("algo", ["copy-engine", "push", "auto"])
def test_operations_after_a_kernel_verify_and_each_follows_one(comm, algo):
    if comm.size > 8 and algo != "copy-engine":
        pytest.skip("kernels take at most 8 ranks")
    options = merge_options({**_OPTIONS, "algo": algo})
    lines = []
    with ipcshare.Group(backend="cuda-vmm") as g:
        calls = _count_empty_kernel_launches(g)
        try:
            result = run_pattern(g, make_pattern("allgather", algo), options,
                                 emit=lines.append, after_kernel=True)
        except KernelCompileError as exc:  # the same on every rank
            pytest.skip(f"needs NVRTC: {exc}")
    assert comm.allgather(result.wrong_total) == [0] * comm.size
    assert result.after_kernel and result.to_dict()["after_kernel"] is True
    # checks + warm-up + timed operations, in both modes, at every size
    per_mode = options.checks + options.warmup + options.iters
    assert calls[0] == len(result.rows) * 2 * per_mode
    if comm.rank == 0:
        assert "before each: an empty kernel" in lines[0]


def test_without_the_flag_no_kernel_is_launched(comm):
    options = merge_options({**_OPTIONS, "algo": "copy-engine"})
    with ipcshare.Group(backend="cuda-vmm") as g:
        calls = _count_empty_kernel_launches(g)
        result = run_pattern(g, make_pattern("allgather", "copy-engine"), options,
                             emit=lambda _line: None)
    assert calls[0] == 0 and "after_kernel" not in result.to_dict()


def test_the_mpi_baseline_is_refused_on_every_rank(comm):
    from ipcshare.baselines.mpi import MpiBaseline

    options = merge_options({**_OPTIONS, "algo": "copy-engine"})
    with ipcshare.Group(backend="cuda-vmm") as g:
        with pytest.raises(ConfigError, match="the mpi baseline runs no kernels on a stream"):
            run_pattern(g, make_pattern("allgather"), options, emit=lambda _line: None,
                        baseline=MpiBaseline(g.world, "allgather"), after_kernel=True)


@pytest.mark.parametrize("name", ["torch", "nccl"])
def test_the_gpu_baselines_run_after_a_kernel_too(comm, name):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    if name == "nccl":
        pytest.importorskip("nccl.core", reason="--baseline nccl needs nccl4py")
    from ipcshare.baselines import gpu_baseline_class

    options = merge_options({**_OPTIONS, "algo": "copy-engine"})
    with ipcshare.Group(backend="cuda-vmm") as g:
        places = comm.allgather((g.world.hostname, g.backend.uuid))
        if len(set(places)) < len(places):
            pytest.skip("NCCL needs one GPU per rank")
        pattern = make_pattern("allgather")
        with gpu_baseline_class(name)(g.world, pattern, g.backend.device) as baseline:
            result = run_pattern(g, pattern, options,
                                 emit=lambda _line: None, baseline=baseline, after_kernel=True)
            # The driver leaves the baseline as it found it.
            assert baseline.after_kernel is False
            baseline.after_kernel = True
            assert baseline._operation(lambda: None).__name__ == "after_a_kernel"
            baseline.after_kernel = False
    assert result.wrong_total == 0 and result.baseline is not None
    assert all(row.wrong == 0 for row in result.baseline.rows)


def test_graphs_capture_the_kernel_with_each_operation(comm):
    if comm.size > 8:
        pytest.skip("kernels take at most 8 ranks")
    options = merge_options({**_OPTIONS, "algo": "push"})
    with ipcshare.Group(backend="cuda-vmm") as g:
        calls = _count_empty_kernel_launches(g)
        try:
            result = run_pattern(g, make_pattern("allgather", "push"), options,
                                 emit=lambda _line: None, graph=True, after_kernel=True)
        except KernelCompileError as exc:
            pytest.skip(f"needs NVRTC: {exc}")
    assert comm.allgather(result.wrong_total) == [0] * comm.size
    # Captured once per checked graph and once per operation of the timed graph.
    assert calls[0] >= len(result.rows) * 2 * (1 + options.iters)
    assert result.after_kernel and result.timing == "graph"
