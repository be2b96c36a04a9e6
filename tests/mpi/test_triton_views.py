"""ipcshare.triton's views over real windows on host memory, at any world size: the peer
table's addresses are the mappings themselves (translate of a local address lands on
the bytes the peer wrote, for a window, a communicator's heap and a registration), and
every refusal comes on every rank in one line: host memory, closed windows and
communicators, dropped registrations, wrong arguments. Needs neither Triton nor a GPU."""

from __future__ import annotations

import ctypes
import gc
import importlib.util
import mmap
import os

import numpy as np
import pytest

import ipcshare
import ipcshare.triton as ipt
from ipcshare import CollectiveError, Unsupported, WindowError
from ipcshare.triton import table as tt
from ipcshare.triton.view import addresses, describe

pytestmark = pytest.mark.mpi


def _read_int64(address: int) -> int:
    return int(np.frombuffer(ctypes.string_at(address, 8), np.int64)[0])


def _check_every_peer(comm, table, local: np.ndarray, row: int) -> None:
    """Each rank writes a value of its own into ``local`` (its memory of ``row``); every
    rank then reads every peer's through the translated address of its own element."""
    local[:] = np.arange(len(local), dtype=np.int64) * 1000 + comm.rank
    comm.Barrier()
    for peer in range(comm.size):
        for index in (0, len(local) // 2, len(local) - 1):
            mine = local.ctypes.data + 8 * index
            assert _read_int64(tt.translate_address(table, mine, peer, row)) == \
                index * 1000 + peer
    comm.Barrier()


def test_translate_lands_on_each_peers_window(comm):
    with ipcshare.Group(backend="host") as g, g.window(1 << 16) as w:
        table = tt.pack_table(addresses(w))
        assert list(table[:3]) == [g.rank, g.size, 2]
        _check_every_peer(comm, table, np.asarray(w.local).view(np.int64)[16:64],
                          tt.WINDOW_ROW)
        # The pads' row: every rank's pad as the window itself hands it out.
        for peer in range(g.size):
            assert tt.translate_address(table, w.signal_pad_ptrs[g.rank], peer,
                                        tt.PAD_ROW) == w.signal_pad_ptrs[peer]


def test_translate_lands_on_each_peers_heap_array_and_registration(comm):
    fd = os.memfd_create("triton-view", os.MFD_CLOEXEC)
    os.ftruncate(fd, 1 << 16)
    segment = mmap.mmap(fd, 1 << 16, mmap.MAP_SHARED)
    try:
        with ipcshare.Group(backend="host") as g, g.communicator(max_bytes=1 << 20) as c:
            heap_array = c.empty((100,), "int64")     # lies in the communicator's window
            mine = np.frombuffer(segment, np.int64, 64, 1024)
            registration = c.register(mine)
            table = tt.pack_table(addresses(c.window, registration))
            assert int(table[tt.ROWS_WORD]) == 3
            _check_every_peer(comm, table, heap_array, tt.WINDOW_ROW)
            _check_every_peer(comm, table, mine, tt.FIRST_REGISTRATION_ROW)
            c.unregister(mine)
            with pytest.raises(CollectiveError, match="registration 0 was unregistered"):
                describe(c, registration)
            del heap_array, mine, registration
            gc.collect()
    finally:
        segment.close()
        os.close(fd)


def test_host_memory_and_a_missing_triton_are_refused_in_one_line(comm):
    with ipcshare.Group(backend="host") as g, g.window(4096) as w:
        with pytest.raises(Unsupported) as caught:
            describe(w)
        assert "uses host memory (use a GPU backend: cuda-ipc or cuda-vmm)" in str(caught.value)
        with pytest.raises(Unsupported) as caught:
            ipt.device_view(w)
        message = str(caught.value)
        assert "\n" not in message
        if importlib.util.find_spec("triton") is None:
            assert message.startswith("ipcshare.triton needs Triton 3.0 or newer")
        else:
            assert "uses host memory" in message
    assert comm.allgather(message) == [message] * comm.size


def test_closed_windows_communicators_and_dropped_registrations_are_refused(comm):
    with ipcshare.Group(backend="host") as g:
        w = g.window(4096)
        w.close()
        with pytest.raises(WindowError, match="device_view of a closed window"):
            describe(w)
        c = g.communicator(max_bytes=1 << 20)
        c.close()
        with pytest.raises(CollectiveError, match="device_view of a closed communicator"):
            describe(c)


def test_arguments_of_the_wrong_kind_are_refused(comm):
    with ipcshare.Group(backend="host") as g, g.window(4096) as w, \
            g.communicator(max_bytes=1 << 20) as c:
        with pytest.raises(TypeError, match="takes a Window or a Communicator, not ndarray"):
            describe(np.zeros(4))
        with pytest.raises(TypeError, match="registrations belong to a communicator"):
            describe(w, object())
        with pytest.raises(TypeError, match="registration 0 is a object"):
            describe(c, object())
