"""Garbage from a peer, really sent between ranks: every rank fails with one clear
error naming the sender, nothing is mapped, nothing leaks, and the group stays usable."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest

import ipcshare
from ipcshare.backends.base import Exported
from ipcshare.runtime.errors import BackendError, ExchangeError
from ipcshare.runtime.owned_fd import OwnedFd

from ..resources import mapping_count, open_fd_count

pytestmark = pytest.mark.mpi

SENDER = 1  # the rank that misbehaves


def _needs_peers(comm):
    if comm.size == 1:
        pytest.skip("needs a peer to send garbage")


def _tamper_sealed(monkeypatch, comm, change):
    """On the sending rank only, ``change`` the sealed handle bytes before they travel."""
    if comm.rank != SENDER:
        return
    import ipcshare.exchange as exchange_module

    real = exchange_module.seal
    monkeypatch.setattr(exchange_module, "seal", lambda *a, **k: change(real(*a, **k)))


def _flip_a_payload_byte(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 0x40])


@pytest.mark.parametrize("change,message", [
    (lambda data: data[:10], "is truncated: 10 bytes"),
    (lambda data: data[:-3], "truncated or padded"),
    (_flip_a_payload_byte, "fails its checksum"),
    (lambda data: b"JUNK" + data[4:], "bad magic"),
    (lambda data: b"", "is truncated: 0 bytes"),
])
def test_corrupted_handle_bytes_are_rejected_on_every_rank(comm, monkeypatch, change, message):
    _needs_peers(comm)
    _tamper_sealed(monkeypatch, comm, change)
    gc.collect()   # what earlier tests' tracebacks held goes now, not during the count
    with ipcshare.Group(backend="host", exchange="socket") as g:
        fds, maps = open_fd_count(), mapping_count("memfd:ipcshare")
        with pytest.raises(ExchangeError, match=rf"handle exchange failed on rank \d@.*"
                                                rf"handle from rank {SENDER}@\S+ .*{message}"):
            g.window(4096)
        assert mapping_count("memfd:ipcshare") == maps
        assert open_fd_count() == fds
        monkeypatch.undo()
        g.window(4096).close()  # the group is still usable


def test_a_handle_from_another_job_is_rejected(comm, monkeypatch):
    _needs_peers(comm)
    if comm.rank == SENDER:
        import ipcshare.exchange as exchange_module

        real = exchange_module.seal
        monkeypatch.setattr(exchange_module, "seal",
                            lambda payload, **k: real(payload, **{**k, "token": "00" * 8}))
    with ipcshare.Group(backend="host") as g:
        with pytest.raises(ExchangeError, match=rf"handle from rank {SENDER}@\S+ belongs to "
                                                "another job"):
            g.window(4096)


def test_a_replayed_handle_from_an_earlier_window_is_rejected(comm, monkeypatch):
    _needs_peers(comm)
    with ipcshare.Group(backend="host") as g:
        first = g.window(4096)
        if comm.rank == SENDER:  # send window 1's sealed handle again for window 2
            import ipcshare.exchange as exchange_module

            real = exchange_module.seal
            monkeypatch.setattr(exchange_module, "seal",
                                lambda payload, **k: real(payload, **{**k, "sequence": 1}))
        with pytest.raises(ExchangeError, match="belongs to exchange 1, this is exchange 2"):
            g.window(4096)
        first.close()


def _export_instead(monkeypatch, g, make_fd, nbytes_announced=None):
    """On the sending rank, export ``make_fd()`` in place of the window's memfd."""
    backend = g.backend
    real = backend.export

    def export(allocation):
        genuine = real(allocation)
        genuine.fd.close()
        payload = genuine.payload
        if nbytes_announced is not None:
            from ipcshare.backends.host import HANDLE_FORMAT

            payload = HANDLE_FORMAT.pack(b"IPCH", 1, nbytes_announced, os.getpid())
        return Exported(payload=payload, fd=OwnedFd(make_fd()))
    monkeypatch.setattr(backend, "export", export)


def _regular_file():
    import tempfile

    fd, path = tempfile.mkstemp()
    os.unlink(path)
    os.ftruncate(fd, 1 << 20)
    return fd


def _pipe():
    read, write = os.pipe()
    os.close(write)
    return read


def _small_sealed_memfd():
    import fcntl

    fd = os.memfd_create("small", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, 4096)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
    return fd


@pytest.mark.parametrize("exchange", ["socket", "pidfd"])
@pytest.mark.parametrize("make_fd,message", [
    (_regular_file, "a file, not a memfd"),
    (_pipe, "a pipe, not shared memory"),
    (_small_sealed_memfd, "holds 4096 bytes, fewer than"),
])
def test_a_descriptor_of_the_wrong_kind_or_size_is_rejected(comm, monkeypatch, exchange,
                                                            make_fd, message):
    _needs_peers(comm)
    with ipcshare.Group(backend="host", exchange=exchange) as g:
        g.window(4096).close()
        fds, maps = open_fd_count(), mapping_count("memfd:ipcshare")
        if comm.rank == SENDER:
            _export_instead(monkeypatch, g, make_fd)
        with pytest.raises(BackendError, match=rf"import failed on rank \d@.*{message}"):
            g.window(64 * 1024)
        assert open_fd_count() == fds
        assert mapping_count("memfd:ipcshare") == maps


def test_a_second_import_of_the_same_memory_is_rejected(comm, monkeypatch):
    _needs_peers(comm)
    with ipcshare.Group(backend="host") as g:
        first = g.window(8192)
        if comm.rank == SENDER:  # export window 1's memory again for window 2
            memory = first._allocations[comm.rank]
            _export_instead(monkeypatch, g, lambda: os.dup(memory.fd.fileno()),
                            nbytes_announced=None)
        with pytest.raises(BackendError, match="already mapped here"):
            g.window(8192)
        np.asarray(first.local)[0] = 1  # window 1 is untouched
        first.close()
