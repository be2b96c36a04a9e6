"""Faults on the GPU backends: garbage handles really sent between ranks, a descriptor
of the wrong kind, and (in ``test_dead_peer_during_a_gpu_window_exchange``, run without
mpiexec) a rank SIGKILLed while its peers build a GPU window.

On a GPU node::

    mpiexec -n 2 python -m pytest --with-mpi -m "gpu and mpi" tests/gpu/test_gpu_faults.py
    python -m pytest -m "gpu and not mpi" tests/gpu/test_gpu_faults.py
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import ipcshare
from ipcshare.backends.base import Exported
from ipcshare.runtime.errors import BackendError, ExchangeError
from ipcshare.runtime.owned_fd import OwnedFd

from ..launchers import mpich_launcher
from ..resources import open_fd_count

BACKENDS = ["cuda-ipc", "cuda-vmm"]
SENDER = 1


def _needs_peers(comm):
    if comm.size == 1:
        pytest.skip("needs a peer to send garbage")


@pytest.mark.mpi
@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_corrupted_gpu_handle_bytes_are_rejected_before_any_import(comm, monkeypatch,
                                                                   backend):
    _needs_peers(comm)
    if comm.rank == SENDER:
        import ipcshare.exchange as exchange_module

        real = exchange_module.seal
        monkeypatch.setattr(exchange_module, "seal", lambda *a, **k: (
            lambda data: data[:-1] + bytes([data[-1] ^ 1]))(real(*a, **k)))
    with ipcshare.Group(backend=backend) as g:
        fds = open_fd_count()
        with pytest.raises(ExchangeError, match=rf"handle from rank {SENDER}@\S+ fails its "
                                                "checksum"):
            g.window(1 << 20)
        assert open_fd_count() == fds
        monkeypatch.undo()
        g.window(1 << 20).close()


@pytest.mark.mpi
@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_well_wrapped_garbage_fails_the_import_cleanly(comm, monkeypatch, backend):
    # Intact envelope, random handle inside: the backend's own parser or the driver
    # must refuse it with an error, never crash the interpreter.
    _needs_peers(comm)
    with ipcshare.Group(backend=backend) as g:
        if comm.rank == SENDER:
            real = g.backend.export

            def export(allocation):
                genuine = real(allocation)
                junk = genuine.payload[:14] + os.urandom(len(genuine.payload) - 14)
                return Exported(payload=junk, fd=genuine.fd)
            monkeypatch.setattr(g.backend, "export", export)
        with pytest.raises((BackendError, ExchangeError), match=r"failed on rank \d@"):
            g.window(1 << 20)
        monkeypatch.undo()
        g.window(1 << 20).close()


@pytest.mark.mpi
@pytest.mark.gpu
def test_a_memfd_in_place_of_a_cumem_descriptor_is_refused(comm, monkeypatch):
    _needs_peers(comm)
    with ipcshare.Group(backend="cuda-vmm") as g:
        if comm.rank == SENDER:
            real = g.backend.export

            def export(allocation):
                genuine = real(allocation)
                genuine.fd.close()
                fake = os.memfd_create("not-cumem")
                os.ftruncate(fake, 1 << 21)
                return Exported(payload=genuine.payload, fd=OwnedFd(fake))
            monkeypatch.setattr(g.backend, "export", export)
        with pytest.raises(BackendError, match=r"import failed on rank \d@"):
            g.window(1 << 20)


JOB = Path(__file__).parents[1] / "faults" / "dead_peer_job.py"
GFORKER = mpich_launcher("mpiexec.gforker")


@pytest.mark.gpu
@pytest.mark.skipif(GFORKER is None, reason="needs mpiexec.gforker (mpich)")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["descriptor-exchange", "handle-exchange", "pattern"])
def test_dead_peer_during_a_gpu_window_exchange(tmp_path, backend, mode):
    if backend == "cuda-ipc" and mode == "descriptor-exchange":
        pytest.skip("cuda-ipc handles are opaque bytes: there is no descriptor exchange")
    env = dict(os.environ, BACKEND=backend, IGNORE_SIGINT="1", GRACE="0.3",
               IPCSHARE_SOCKET_DIR=str(tmp_path))
    out = subprocess.run([GFORKER, "-n", "2", sys.executable, str(JOB), mode, "1",
                          str(tmp_path / "death")], capture_output=True, text=True,
                         timeout=180, env=env)
    lines = re.findall(r"SURVIVOR rank (\d+) detected after ([\d.]+) s: (.*)", out.stdout)
    assert [rank for rank, _s, _m in lines] == ["0"], out.stdout + out.stderr
    assert float(lines[0][1]) < 30 and "rank 1@" in lines[0][2]
    assert [p for p in tmp_path.iterdir() if p.name.startswith("ipcshare-")] == []
