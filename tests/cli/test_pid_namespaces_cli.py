"""Ranks in separate PID namespaces (one container per rank), on the host backend with
``unshare``: descriptors travel by SCM_RIGHTS, peers authenticated by uid and the job's
secret; where no path can join the ranks, every rank fails at once with the cause and fix."""

from __future__ import annotations

import json
import shutil
import subprocess
import time

import pytest

from .test_cli import IPCSHARE, MPIEXEC, needs_mpiexec, socket_dir  # noqa: F401


def _unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-p", "-f", "-m", "--mount-proc", "true"],
                           capture_output=True, timeout=30)
    return probe.returncode == 0


needs_unshare = pytest.mark.skipif(not _unshare_works(),
                                   reason="needs unshare -p -m (root or user namespaces)")
RUN = ["allgather", "--backend", "host", "-b", "1K", "-e", "64K", "-f", "8"]


def _rank(wrapper: str, args: list[str]) -> list[str]:
    """One MPMD slot: a rank in a PID namespace of its own, shaped by ``wrapper``."""
    own = {"pid": ["unshare", "-p", "-f", "--mount-proc"],
           "pid+tmp": ["unshare", "-p", "-f", "-m", "--mount-proc"],
           "pid+tmp+net": ["unshare", "-p", "-f", "-n", "-m", "--mount-proc"]}[wrapper]
    command = " ".join([*IPCSHARE, *args])
    if wrapper == "pid":
        return ["-n", "1", *own, *IPCSHARE, *args]
    # A private socket base (IPCSHARE_SOCKET_DIR, under /tmp): this rank cannot see the
    # socket directory that rank 0 made there. Only that directory is hidden, not all of
    # /tmp, where the checkout and its virtual environment may live.
    return ["-n", "1", *own, "sh", "-c",
            f'mount -t tmpfs none "$IPCSHARE_SOCKET_DIR" && exec {command}']


def _job(ranks: list[list[str]]):
    started = time.monotonic()
    command = [MPIEXEC]
    for i, slot in enumerate(ranks):
        command += ([":"] if i else []) + slot
    out = subprocess.run(command, capture_output=True, text=True, timeout=120)
    return out, time.monotonic() - started


@needs_mpiexec
@needs_unshare
@pytest.mark.parametrize("exchange", ["auto", "socket"])
@pytest.mark.parametrize("ranks", [2, 3])
def test_ranks_in_separate_pid_namespaces_share_memory(exchange, ranks, socket_dir, tmp_path):  # noqa: F811
    report = tmp_path / "r.json"
    args = [*RUN, "--exchange", exchange, "--json", str(report)]
    out, elapsed = _job([_rank("pid", args) for _ in range(ranks)])
    assert out.returncode == 0, out.stdout + out.stderr
    document = json.loads(report.read_text())
    assert document["exchange"] == "socket"  # pidfd cannot reach another PID namespace
    assert document["wrong_total"] == 0 and document["world_size"] == ranks
    assert "refused" not in out.stderr
    assert list(socket_dir.iterdir()) == []
    assert elapsed < 30  # before the fix: the 30 s exchange timeout, then an error


@needs_mpiexec
@needs_unshare
def test_pidfd_across_pid_namespaces_fails_at_once_on_every_rank(socket_dir):  # noqa: F811
    out, elapsed = _job([_rank("pid", [*RUN, "--exchange", "pidfd"]) for _ in range(2)])
    assert out.returncode != 0
    lines = [line for line in out.stderr.splitlines() if line.startswith("ipcshare: error:")]
    assert len(lines) == 2, out.stderr
    for line in lines:
        assert "different PID namespaces (rank 0 in pid:[" in line
        assert "shareProcessNamespace" in line and "socket exchange" in line
    assert "Traceback" not in out.stderr
    assert elapsed < 10


@needs_mpiexec
@needs_unshare
def test_a_rank_that_cannot_see_the_socket_directory_uses_abstract_sockets(socket_dir,  # noqa: F811
                                                                           tmp_path):
    report = tmp_path / "r.json"
    args = [*RUN, "--exchange", "socket", "--json", str(report)]
    out, _ = _job([_rank("pid", args), _rank("pid+tmp", args)])
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(report.read_text())["wrong_total"] == 0
    assert list(socket_dir.iterdir()) == []  # rank 0's directory, unused, was removed


@needs_mpiexec
@needs_unshare
def test_no_shared_directory_and_no_shared_network_fails_at_once_naming_the_fix(socket_dir):  # noqa: F811
    args = [*RUN, "--exchange", "socket"]
    out, elapsed = _job([_rank("pid", args), _rank("pid+tmp+net", args)])
    assert out.returncode != 0
    lines = [line for line in out.stderr.splitlines() if line.startswith("ipcshare: error:")]
    assert len(lines) == 2, out.stderr
    for line in lines:
        assert "rank 1 cannot see" in line and "different network namespaces" in line
        assert "IPCSHARE_SOCKET_DIR" in line
    assert elapsed < 10
    assert list(socket_dir.iterdir()) == []


def _gpu_count() -> int:
    from ipcshare.backends import gpu_count

    return gpu_count()[0]


@pytest.mark.gpu
@needs_mpiexec
@needs_unshare
@pytest.mark.parametrize("backend", ["cuda-vmm", "cuda-ipc"])
def test_gpu_ranks_in_separate_pid_namespaces(backend, socket_dir, tmp_path):  # noqa: F811
    """cuda-vmm passes POSIX descriptors, so it needs the socket path across namespaces.
    Legacy cudaIpc handles do not open in another PID namespace (measured on H200s,
    driver 580: cuIpcOpenMemHandle -> CUDA_ERROR_INVALID_CONTEXT), so cuda-ipc is refused
    at group setup on every rank, naming cuda-vmm as the way."""
    if _gpu_count() < 1:
        pytest.skip("needs a CUDA GPU")
    report = tmp_path / "r.json"
    args = ["allgather", "--backend", backend, "-b", "1K", "-e", "16M", "-f", "16",
            "--json", str(report)]
    out, elapsed = _job([_rank("pid", args) for _ in range(2)])
    print(f"{backend} across PID namespaces: rc {out.returncode} in {elapsed:.1f} s")
    print(out.stdout[-2000:], out.stderr[-2000:])
    if backend == "cuda-vmm":
        assert out.returncode == 0, out.stderr
        document = json.loads(report.read_text())
        assert document["wrong_total"] == 0 and document["exchange"] == "socket"
    else:
        assert out.returncode != 0
        lines = [line for line in out.stderr.splitlines() if line.startswith("ipcshare: error:")]
        assert len(lines) == 2 and "Traceback" not in out.stderr, out.stderr
        for line in lines:
            assert "does not work across PID namespaces" in line and "cuda-vmm" in line
        assert elapsed < 30
    assert list(socket_dir.iterdir()) == []
