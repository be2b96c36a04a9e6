"""The Triton examples as users run them on a machine without a GPU: host memory, a GPU
backend with no GPU, and bad flags each end with one line per rank and a non-zero exit
status, no traceback, no hang (with or without Triton installed)."""

from __future__ import annotations

import pytest

from ..example_runs import MPIEXEC, inside_an_mpi_job, run_example
from .test_cli import socket_dir, without_gpu  # noqa: F401

pytestmark = [
    pytest.mark.skipif(MPIEXEC is None, reason="needs mpiexec (pip install mpich)"),
    pytest.mark.skipif(inside_an_mpi_job(), reason="launches mpiexec itself: run it outside "
                                                   "mpiexec")]

_EXAMPLES = ["triton_allgather", "triton_allreduce_rmsnorm", "triton_ring"]
# Host memory is refused first, with or without Triton installed.
_HOST_REFUSAL = ("this example runs Triton kernels on GPU memory: it needs a GPU per rank "
                 "(--backend cuda-ipc or cuda-vmm), not host memory")


def _errors(out, script):
    return [line for line in out.stderr.splitlines() if line.startswith(f"{script}.py: error:")]


@pytest.mark.parametrize("script", _EXAMPLES)
def test_host_memory_is_refused_in_one_line_on_every_rank(script, socket_dir):  # noqa: F811
    out = run_example(script, "--backend", "host", n=2)
    errors = _errors(out, script)
    assert out.returncode == 1 and len(errors) == 2, out.stderr
    assert all(line.endswith(_HOST_REFUSAL) for line in errors), errors
    assert "Traceback" not in out.stderr and out.stdout == ""
    assert list(socket_dir.iterdir()) == []


@without_gpu
@pytest.mark.parametrize("script", _EXAMPLES)
def test_a_gpu_backend_without_a_gpu_says_so_in_one_line(script, socket_dir):  # noqa: F811
    out = run_example(script, "--backend", "cuda-vmm", n=2)
    errors = _errors(out, script)
    assert out.returncode == 1 and len(errors) == 2, out.stderr
    assert all("backend 'cuda-vmm' needs a GPU" in line for line in errors)
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("script,flags,message", [
    ("triton_allgather", ["--iters", "0"], "--iters must be at least 1, got 0"),
    ("triton_ring", ["--checks", "0"], "--checks must be at least 1, got 0"),
    ("triton_allgather", ["--sizes", "6"], "--sizes must be positive multiples of 4 bytes"),
    ("triton_allreduce_rmsnorm", ["--hidden", "64", "--sizes", "100"],
     "--sizes must be positive multiples of 128 bytes"),
    ("triton_allreduce_rmsnorm", ["--hidden", "0"], "--hidden must be between 1 and 16384"),
    ("triton_ring", ["--sizes", "1Q"], "--sizes '1Q'"),
    ("triton_allgather", ["--result", "/no-such-folder/r.json"],
     "--result: cannot write '/no-such-folder/r.json': no directory '/no-such-folder'"),
])
def test_bad_flags_are_refused_on_every_rank(script, flags, message):
    out = run_example(script, *flags, n=2)
    errors = _errors(out, script)
    assert out.returncode == 2 and len(errors) == 2, out.stderr
    assert all(message in line for line in errors), errors
