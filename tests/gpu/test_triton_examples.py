"""The Triton examples as users run them: 2 ranks under mpiexec, each on its own GPU,
every size checked bit for bit in CUDA graph replays and timed beside NCCL.

Not under pytest-mpi (the test launches mpiexec itself); on a GPU node::

    python -m pytest -m "gpu and not mpi" tests/gpu/test_triton_examples.py -s
"""

from __future__ import annotations

import importlib.util
import re

import pytest

from ..example_runs import MPIEXEC, inside_an_mpi_job, run_example

pytestmark = pytest.mark.gpu

# "verified bit for bit", or how it was checked where a part is not bit for bit (the
# RMSNorm example: "verified (h bit for bit, y within one bfloat16 step of rms_norm)").
_LINE = re.compile(r"(?P<what>.+): verified (bit for bit|\([^)]+\)) in (?P<checks>\d+) graph "
                   r"replays; "
                   r"Triton (?P<ours>[\d.]+) us(, NCCL (?P<nccl>[\d.]+) us per call in CUDA "
                   r"graphs of \d+ calls; NCCL / Triton [\d.]+| per call \(NCCL skipped: .+\))")


@pytest.fixture(autouse=True)
def _needs_two_gpus_triton_torch_and_mpiexec(gpus):
    if inside_an_mpi_job():
        pytest.skip("launches mpiexec itself: run it outside mpiexec (see the module's "
                    "docstring)")
    if gpus < 2:
        pytest.skip(f"needs 2 GPUs (one per rank), found {gpus}")
    for module in ("torch", "triton"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"needs {module}")
    if MPIEXEC is None:
        pytest.skip("needs mpiexec")


def _verified(out, sizes: int) -> list[re.Match]:
    print(out.stdout)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    matches = [_LINE.fullmatch(line) for line in lines]
    assert len(lines) == sizes and all(matches), out.stdout
    # NCCL ran beside ours (2 GPUs of their own): every line carries its time.
    assert all(m["nccl"] is not None for m in matches), out.stdout
    return matches


@pytest.mark.parametrize("backend", ["cuda-vmm", "cuda-ipc"])
def test_the_triton_all_gather_verifies_beside_nccl(backend):
    out = run_example("triton_allgather", "--backend", backend, "--sizes", "4,8K,1M,4100",
                      "--iters", "5", n=2, timeout=600)
    _verified(out, 4)


def test_the_fused_all_reduce_rmsnorm_verifies_beside_nccl():
    out = run_example("triton_allreduce_rmsnorm", "--sizes", "8K,64K,4M", "--iters", "5",
                      n=2, timeout=600)
    _verified(out, 3)
    out = run_example("triton_allreduce_rmsnorm", "--hidden", "1000", "--sizes", "2000,200000",
                      "--iters", "3", n=2, timeout=600)
    _verified(out, 2)


def test_the_triton_ring_verifies_beside_nccl():
    out = run_example("triton_ring", "--sizes", "4,64K,16M", "--iters", "5", n=2, timeout=600)
    _verified(out, 3)
