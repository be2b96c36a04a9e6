"""The host backend on its own: export, import, views, and garbage from peers."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest

from ipcshare.backends.host import HANDLE_FORMAT, HostBackend
from ipcshare.errors import BackendError
from ipcshare.exchange.fds import OwnedFd

from ..resources import mapping_count, open_fd_count


@pytest.fixture
def backend():
    with HostBackend() as b:
        yield b


def test_import_maps_the_same_memory(backend):
    local = backend.allocate(8192)
    exported = backend.export(local)
    peer = backend.import_peer(exported.payload, exported.fd, 8192)
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


def test_close_releases_descriptors_and_mappings(backend):
    fds, maps = open_fd_count(), mapping_count("memfd:ipcshare")
    for _ in range(50):
        local = backend.allocate(4096)
        exported = backend.export(local)
        peer = backend.import_peer(exported.payload, exported.fd, 4096)
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


def test_descriptor_smaller_than_announced_is_rejected(backend):
    small = backend.allocate(4096)
    exported = backend.export(small)
    payload = HANDLE_FORMAT.pack(b"IPCH", 1, 1 << 20, os.getpid())
    with pytest.raises(BackendError, match="fewer than the 1048576 announced"):
        backend.import_peer(payload, exported.fd, 1 << 20)
    exported.close()
    small.close()
