"""``ipcshare allreduce`` and ``ipcshare reducescatter``: nccl-tests cases that call the
library's Communicator, under mpiexec, with good and bad input."""

from __future__ import annotations

import json

import pytest

from .test_cli import needs_mpiexec, run


@pytest.fixture
def socket_dir(socket_base, monkeypatch):
    monkeypatch.setenv("IPCSHARE_SOCKET_DIR", str(socket_base))
    return socket_base


@needs_mpiexec
@pytest.mark.parametrize(("command", "op", "dtype", "algo"), [
    ("allreduce", "sum", "bfloat16", "one-shot"),
    ("allreduce", "max", "float16", "two-shot"),
    ("allreduce", "min", "int32", "auto"),
    ("reducescatter", "sum", "float32", "auto"),
    ("reducescatter", "max", "bfloat16", "one-shot"),
])
def test_reductions_verify_and_report_nccl_tests_figures(tmp_path, socket_dir, command, op,
                                                         dtype, algo):
    n = 3
    # MPI reduces no 16-bit floats: its baseline joins the float32 and int32 runs.
    baseline = "mpi" if dtype in ("float32", "int32") else "none"
    out = run([command, "-b", "1K", "-e", "256K", "-f", "16", "-o", op, "-d", dtype, "--algo",
               algo, "-n", "3", "-w", "1", "-c", "2", "--baseline", baseline,
               "--json", str(tmp_path / "r.json")], n=n)
    assert out.returncode == 0, out.stderr
    assert "# Out of bounds values : 0 OK" in out.stdout
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["op"] == command and doc["world_size"] == n and doc["wrong_total"] == 0
    if baseline == "mpi":  # MPI checked against the same expected results
        assert [row["wrong"] for row in doc["baseline"]["rows"]] == [0] * len(doc["rows"])
    element = 4 if dtype in ("float32", "int32") else 2
    factor = 2 * (n - 1) / n if command == "allreduce" else (n - 1) / n
    for row in doc["rows"]:
        # all-reduce: size is each rank's array; reduce-scatter: each rank's input (n
        # outputs), so a multiple of n elements.
        assert row["size"] == row["count"] * element
        if command == "reducescatter":
            assert row["count"] % n == 0
        assert row["busbw"] == pytest.approx(row["algbw"] * factor, rel=1e-2, abs=2e-3)
    assert [row["size"] for row in doc["rows"]] == (
        [1024, 16384, 262144] if command == "allreduce" else [1020, 16380, 262140])


@needs_mpiexec
@pytest.mark.parametrize(("args", "message"), [
    (["reducescatter", "-d", "float64"],
     "the reducescatter op reduces float32, float16, bfloat16, int32, not -d float64"),
    (["allreduce", "--algo", "pull"],
     "the allreduce op has no 'pull' algorithm; choose one of: auto, hierarchical, one-shot, "
     "two-shot, ll, ll-two-shot, ll128, ll128-two-shot, stepped, copy-engine, push"),
    (["reducescatter", "--algo", "push"],
     "--algo push runs GPU kernels: it needs a GPU backend (cuda-ipc or cuda-vmm), not host"),
    (["reducescatter", "--algo", "two-shot"],
     "the reducescatter op has no 'two-shot' algorithm; choose one of: auto, hierarchical, "
     "one-shot"),
    (["allgather", "--algo", "one-shot"], "--algo one-shot runs all-reduce or reduce-scatter"),
    (["allreduce", "-d", "float16", "--baseline", "torch-symm"],
     "--baseline torch-symm reduces with -o sum on -d float32 or bfloat16 (what its kernels "
     "support), not -o sum -d float16; use --baseline nccl or torch"),
    (["allreduce", "-o", "max", "--baseline", "torch-symm"],
     "not -o max -d float32"),
    (["reducescatter", "--baseline", "torch-symm"],
     "--baseline torch-symm times all-reduce only"),
    (["allreduce", "-d", "bfloat16", "--baseline", "mpi"],
     "--baseline mpi reduces float32 and int32 (MPI has no 16-bit float types), not -d "
     "bfloat16"),
])
def test_bad_reduction_input_fails_on_every_rank(socket_dir, args, message):
    out = run(args, n=2, timeout=90)
    errors = [line for line in out.stderr.splitlines() if line.startswith("ipcshare: error:")]
    assert out.returncode == 1 and len(errors) == 2, out.stderr
    assert all(message in line for line in errors), out.stderr
    assert "Traceback" not in out.stderr


def test_an_unknown_reduction_is_a_usage_error():
    out = run(["allreduce", "-o", "prod"])
    assert out.returncode == 2 and "invalid choice: 'prod'" in out.stderr
    assert out.stderr.count("\n") == 1


@needs_mpiexec
def test_registered_arrays_verify_and_say_so(tmp_path, socket_dir):
    out = run(["allreduce", "-R", "1", "-b", "4K", "-e", "64K", "-f", "4", "-n", "2", "-w", "1",
               "-c", "2", "--json", str(tmp_path / "r.json")], n=2)
    assert out.returncode == 0, out.stderr
    assert "arrays: registered with the communicator (-R 1)" in out.stdout
    assert "# Out of bounds values : 0 OK" in out.stdout
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["registered"] is True and doc["wrong_total"] == 0


def test_registration_is_for_reductions_and_takes_0_or_1():
    out = run(["allreduce", "-R", "2"])
    assert out.returncode == 2 and "invalid choice: 2" in out.stderr
    out = run(["allgather", "-R", "1"])
    assert out.returncode == 2 and "unrecognized arguments: -R 1" in out.stderr
