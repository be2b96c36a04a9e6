"""Finding the shared file behind a host array (/proc/self/maps) and refusing, with the
reason, memory another process cannot map."""

from __future__ import annotations

import mmap
import os

import numpy as np
import pytest

from ipcshare.backends.host_existing import (
    export_host_range,
    find_mapping,
    map_host_range,
    parse_maps_line,
)
from ipcshare.runtime.errors import BackendError


def test_a_maps_line_is_parsed():
    line = "7f00a000-7f00c000 rw-s 00003000 00:01 25      /memfd:user (deleted)\n"
    mapping = parse_maps_line(line)
    assert (mapping.start, mapping.end, mapping.file_offset) == (0x7F00A000, 0x7F00C000, 0x3000)
    assert mapping.shared and mapping.inode == 25 and mapping.path == "/memfd:user (deleted)"
    assert mapping.device == os.makedev(0, 1)
    assert not parse_maps_line("55d0-55e0 rw-p 00000000 00:00 0   [heap]").shared


def test_private_and_split_ranges_are_refused_with_the_reason(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text("1000-2000 rw-p 00000000 00:00 0     [heap]\n"
                    "2000-3000 rw-s 00000000 00:01 7     /memfd:a (deleted)\n"
                    "3000-4000 rw-s 00001000 00:01 7     /memfd:a (deleted)\n")
    with pytest.raises(BackendError, match=r"private mapping of \[heap\].*comm.empty\(\)"):
        find_mapping(0x1800, 16, maps=str(maps))
    with pytest.raises(BackendError, match="not contiguous in one shared mapping: it spans 2"):
        find_mapping(0x2F00, 0x200, maps=str(maps))
    with pytest.raises(BackendError, match="lies in no mapping"):
        find_mapping(0x9000, 8, maps=str(maps))
    # Private memory is named as the cause even where the array also crosses into the
    # next mapping (a large numpy array at the end of the heap).
    with pytest.raises(BackendError, match=r"private mapping of \[heap\].*comm.empty\(\)"):
        find_mapping(0x1F00, 0x200, maps=str(maps))
    assert find_mapping(0x3100, 8, maps=str(maps)).file_offset == 0x1000


def test_a_memfd_array_is_exported_and_mapped_again_without_a_copy():
    fd = os.memfd_create("unit", os.MFD_CLOEXEC)
    os.ftruncate(fd, 3 * mmap.PAGESIZE)
    mapping = mmap.mmap(fd, 3 * mmap.PAGESIZE, mmap.MAP_SHARED)
    try:
        array = np.frombuffer(mapping, np.int64, 600, mmap.PAGESIZE + 40)
        exported, offset = export_host_range(array.ctypes.data, array.nbytes)
        try:
            again = map_host_range(exported.payload, exported.fd)
        finally:
            exported.close()
        assert offset == 40
        view = np.frombuffer(again, np.int64, 600, offset)
        array[:] = np.arange(600)          # written after mapping: the same memory
        assert (view == np.arange(600)).all()
        del view
        again.close()
    finally:
        del array
        mapping.close()
        os.close(fd)


def test_numpy_memory_is_private():
    array = np.zeros(1 << 20, np.uint8)
    with pytest.raises(BackendError, match="which another process cannot map"):
        export_host_range(array.ctypes.data, array.nbytes)
