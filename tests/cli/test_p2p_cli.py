"""``ipcshare p2p`` where it cannot run: one clear line and a non-zero status, never a
traceback (the GPU runs are in tests/gpu/test_p2p_direct.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ipcshare.backends import gpu_count

P2P = [sys.executable, "-m", "ipcshare", "p2p"]


def run(args, **env):
    environment = {k: v for k, v in os.environ.items()
                   if k not in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE")}
    environment.update(env)
    return subprocess.run([*P2P, *args], capture_output=True, text=True, timeout=60,
                          env=environment)


@pytest.mark.skipif(gpu_count()[0] > 0, reason="a GPU is present here")
def test_without_gpus_p2p_refuses_in_one_line():
    out = run(["--no-ipc", "-b", "4K", "-e", "4K"])
    assert out.returncode == 1
    assert out.stdout == "" and "Traceback" not in out.stderr
    (line,) = out.stderr.splitlines()
    assert line.startswith("ipcshare: error: p2p needs 2 or more GPUs visible to this one "
                           "process, but ")
    assert line.endswith("run it on a node with several GPUs (and no CUDA_VISIBLE_DEVICES "
                         "narrowing it to one)")


def test_started_by_a_launcher_p2p_refuses_before_touching_a_gpu():
    out = run([], OMPI_COMM_WORLD_SIZE="2")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.strip() == (
        "ipcshare: error: p2p runs as one process over every GPU and starts the IPC half "
        "itself: run it without mpiexec / srun (OMPI_COMM_WORLD_SIZE=2)")


@pytest.mark.parametrize(("args", "message"), [
    (["-b", "0"], "-b/--minbytes 0: must be at least 1 byte"),
    (["-n", "0"], "-n/--iters 0: must be >= 1"),
    (["--json", "/nonexistent-dir/p2p.json", "--no-ipc"], "cannot write"),
])
def test_bad_options_are_one_line(args, message):
    out = run(args)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert len(out.stderr.splitlines()) == 1 and message in out.stderr


def test_p2p_is_in_the_help():
    out = subprocess.run([sys.executable, "-m", "ipcshare", "--help"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and "p2p" in out.stdout
