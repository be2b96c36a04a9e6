"""The host backend on its own: export, import, views, and garbage from peers."""

from __future__ import annotations

import os
import struct
import sys

import numpy as np
import pytest

from ipcshare.backends.host import HANDLE_FORMAT, HostBackend
from ipcshare.runtime.errors import BackendError
from ipcshare.runtime.owned_fd import OwnedFd

from ..resources import mapping_count, open_fd_count


@pytest.fixture
def backend():
    with HostBackend() as b:
        yield b


@pytest.fixture
def importer():
    """A second backend, standing for a peer process: a backend refuses to import
    memory it already maps, its own included."""
    with HostBackend() as b:
        yield b


def test_import_maps_the_same_memory(backend, importer):
    local = backend.allocate(8192)
    exported = backend.export(local)
    peer = importer.import_peer(exported.payload, exported.fd, 8192)
    np.asarray(peer.buffer())[100:108] = 42
    assert np.all(np.asarray(local.buffer())[100:108] == 42)
    assert peer.ptr != local.ptr  # a second mapping, same pages
    for thing in (peer, exported, local):
        thing.close()


def test_views_are_zero_copy_and_keep_memory_alive(backend):
    local = backend.allocate(4096)
    view = np.asarray(local.buffer(1024, 16))
    view[:] = 7
    assert bytes(local.buffer().memoryview()[1024:1026]) == b"\x07\x07"
    local.close()          # the numpy view still holds the mapping: no crash on access
    assert view[0] == 7
    del view


@pytest.mark.skipif(sys.version_info < (3, 12),
                    reason="the buffer protocol of Python classes (__buffer__) needs 3.12")
def test_a_host_buffer_speaks_the_buffer_protocol(backend):
    local = backend.allocate(4096)
    view = memoryview(local.buffer(8, 8))
    view[:] = b"ipcshare"
    assert bytes(local.buffer(8, 8)) == b"ipcshare" and not view.readonly
    view.release()
    local.close()


def test_close_releases_descriptors_and_mappings(backend, importer):
    fds, maps = open_fd_count(), mapping_count("memfd:ipcshare")
    for _ in range(50):
        local = backend.allocate(4096)
        exported = backend.export(local)
        peer = importer.import_peer(exported.payload, exported.fd, 4096)
        peer.close()
        exported.close()
        local.close()
        local.close()
    assert open_fd_count() == fds
    assert mapping_count("memfd:ipcshare") == maps


@pytest.mark.parametrize("payload,message", [
    (b"", "expected"),
    (b"x" * 5, "expected"),
    (struct.pack("!4sHQI", b"NOPE", 1, 4096, 1), "bad magic"),
    (struct.pack("!4sHQI", b"IPCH", 99, 4096, 1), "format 99"),
    (struct.pack("!4sHQI", b"IPCH", 1, 8192, 1), "announced 8192"),
])
def test_malformed_handles_are_rejected(backend, payload, message):
    local = backend.allocate(4096)
    exported = backend.export(local)
    with pytest.raises(BackendError, match=message):
        backend.import_peer(payload, exported.fd, 4096)
    exported.close()
    local.close()


def test_wrong_kind_of_descriptor_is_rejected(backend):
    payload = HANDLE_FORMAT.pack(b"IPCH", 1, 4096, os.getpid())
    r, w = os.pipe()
    with OwnedFd(r) as pipe_fd, OwnedFd(w):
        with pytest.raises(BackendError, match="not shared memory"):
            backend.import_peer(payload, pipe_fd, 4096)


def test_descriptor_smaller_than_announced_is_rejected(backend, importer):
    small = backend.allocate(4096)
    exported = backend.export(small)
    payload = HANDLE_FORMAT.pack(b"IPCH", 1, 1 << 20, os.getpid())
    with pytest.raises(BackendError, match="fewer than the 1048576 announced"):
        importer.import_peer(payload, exported.fd, 1 << 20)
    exported.close()
    small.close()


def _handle(nbytes):
    return HANDLE_FORMAT.pack(b"IPCH", 1, nbytes, os.getpid())


def test_a_regular_file_is_rejected(importer, tmp_path):
    path = tmp_path / "disk"
    path.write_bytes(b"\0" * 8192)
    with OwnedFd(os.open(path, os.O_RDWR)) as fd:
        with pytest.raises(BackendError, match="a file, not a memfd"):
            importer.import_peer(_handle(8192), fd, 8192)


def test_an_unsealed_memfd_is_rejected(importer):
    # Its owner could shrink it under our mapping: touching it would be a SIGBUS.
    with OwnedFd(os.memfd_create("hostile", os.MFD_ALLOW_SEALING)) as fd:
        os.ftruncate(fd.fileno(), 8192)
        with pytest.raises(BackendError, match="not sealed against shrinking"):
            importer.import_peer(_handle(8192), fd, 8192)


def test_a_socket_is_rejected(importer):
    import socket

    left, right = socket.socketpair()
    with left, right, OwnedFd(os.dup(left.fileno())) as fd:
        with pytest.raises(BackendError, match="a socket, not shared memory"):
            importer.import_peer(_handle(4096), fd, 4096)


def test_the_same_handle_imported_twice_is_rejected(backend, importer):
    fds = open_fd_count()
    local = backend.allocate(4096)
    exported = backend.export(local)
    first = importer.import_peer(exported.payload, exported.fd, 4096)
    with pytest.raises(BackendError, match="already mapped here"):
        importer.import_peer(exported.payload, exported.fd, 4096)
    first.close()
    # Once the first mapping is gone, the memory may be mapped again (a new window).
    importer.import_peer(exported.payload, exported.fd, 4096).close()
    exported.close()
    local.close()
    assert open_fd_count() == fds


def test_our_own_memory_sent_back_is_rejected(backend):
    local = backend.allocate(4096)
    exported = backend.export(local)
    with pytest.raises(BackendError, match="already mapped here"):
        backend.import_peer(exported.payload, exported.fd, 4096)
    exported.close()
    local.close()


def test_a_fabric_handle_is_refused_not_ignored():
    from ipcshare.backends import open_backend
    from ipcshare.runtime.errors import OptionError

    # The host backend shares memfd descriptors: it used to ignore the handle asked for.
    with pytest.raises(OptionError, match="^handle fabric: fabric handles export cuMem "
                                          "allocations of GPU memory: they need a GPU backend, "
                                          "cuda-vmm, and the backend is host$"):
        open_backend("host", handle="fabric")
