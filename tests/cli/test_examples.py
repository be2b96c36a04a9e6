"""The examples as users run them on a machine without a GPU: the one-shot all-reduce on
host memory verifies and prints both timings at several world sizes; what cannot run
here (the CUDA-graph training step, the GPU kernel) and bad flags fail with one line per
rank, no traceback, no hang."""

from __future__ import annotations

import re

import pytest

from ..example_runs import MPIEXEC, inside_an_mpi_job, run_example
from .test_cli import socket_dir, without_gpu  # noqa: F401

pytestmark = [
    pytest.mark.skipif(MPIEXEC is None, reason="needs mpiexec (pip install mpich)"),
    pytest.mark.skipif(inside_an_mpi_job(), reason="launches mpiexec itself: run it outside "
                                                   "mpiexec")]

_REPORT = re.compile(r"one-shot all-reduce of (\d+) float32 on (\d+) rank\(s\): verified .*"
                     r"your numpy one-shot ([\d.]+) us per call, comm.all_reduce \(bound\) "
                     r"([\d.]+) us; ratio ([\d.]+)")


def _errors(out, script):
    return [line for line in out.stderr.splitlines()
            if line.startswith(f"{script}: error:")]


@pytest.mark.parametrize("n", [2, 3])
def test_the_one_shot_example_verifies_on_host_memory(n, socket_dir):  # noqa: F811
    out = run_example("allreduce_oneshot", "--backend", "host", "--count", "10001",
                      "--iters", "5", n=n)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 1, out.stdout   # rank 0 reports for all
    match = _REPORT.fullmatch(lines[0])
    assert match, lines[0]
    assert (int(match[1]), int(match[2])) == (10001, n)
    assert float(match[3]) > 0 and float(match[4]) > 0
    assert list(socket_dir.iterdir()) == []


def test_the_training_step_example_refuses_host_memory_in_one_line(socket_dir):  # noqa: F811
    out = run_example("torch_grad_allreduce_graph", "--backend", "host", n=2)
    errors = _errors(out, "torch_grad_allreduce_graph.py")
    assert out.returncode == 1 and len(errors) == 2, out.stderr
    assert all("needs GPUs (CUDA graphs and NCCL)" in line for line in errors)
    assert "Traceback" not in out.stderr and out.stdout == ""


@without_gpu
def test_the_gpu_kernel_example_without_a_gpu_says_so_in_one_line(socket_dir):  # noqa: F811
    out = run_example("allreduce_oneshot", "--backend", "cuda-vmm", n=2)
    errors = _errors(out, "allreduce_oneshot.py")
    assert out.returncode == 1 and len(errors) == 2, out.stderr
    assert all("backend 'cuda-vmm' needs a GPU" in line for line in errors)
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("script,flag", [("allreduce_oneshot", "--count"),
                                         ("torch_grad_allreduce_graph", "--steps")])
def test_bad_flags_are_refused_on_every_rank(script, flag):
    out = run_example(script, flag, "0", n=2)
    errors = _errors(out, f"{script}.py")
    assert out.returncode == 2 and len(errors) == 2, out.stderr
    assert all(f"{flag} must be at least 1, got 0" in line for line in errors)


_ACROSS = re.compile(r"(\d+) float32 per rank on (\d+) rank\(s\), (\d+) node\(s\) x (\d+) "
                     r"rank\(s\)(, between nodes: (\w+))?: all_reduce, all_gather, "
                     r"reduce_scatter verified; all_reduce [\d.]+ us per call \(host\)")


@pytest.mark.parametrize("n,nodes", [(4, 2), (2, 2), (2, 1)])
def test_the_across_nodes_example_verifies_on_virtual_nodes(n, nodes, monkeypatch,
                                                           socket_dir):  # noqa: F811
    monkeypatch.setenv("IPCSHARE_VIRTUAL_NODES", str(nodes))
    out = run_example("across_nodes", "--backend", "host", "--count", "10001", "--iters", "3",
                      n=n)
    assert out.returncode == 0, out.stderr
    match = _ACROSS.fullmatch(out.stdout.strip())
    assert match, out.stdout
    assert (int(match[2]), int(match[3]), int(match[4])) == (n, nodes, n // nodes)
    assert match[6] == ("mpi" if nodes > 1 else None)


def test_the_across_nodes_example_refuses_nccl_on_host_memory_in_one_line(
        monkeypatch, socket_dir):  # noqa: F811
    monkeypatch.setenv("IPCSHARE_VIRTUAL_NODES", "2")
    out = run_example("across_nodes", "--backend", "host", "--inter", "nccl", n=2)
    errors = _errors(out, "across_nodes.py")
    assert out.returncode == 1 and len(errors) == 2, out.stderr
    assert all("needs a GPU backend" in line for line in errors)
    assert "Traceback" not in out.stderr and out.stdout == ""
