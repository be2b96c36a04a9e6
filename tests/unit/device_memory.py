"""A model of device memory for tests of copy plans without a GPU: regions of bytes at
made-up addresses, far apart, that copies ``(dst, src, nbytes)`` read and write."""

from __future__ import annotations

import numpy as np


class DeviceMemory:
    """Regions of bytes at made-up device addresses, far apart."""

    def __init__(self) -> None:
        self.regions: list[tuple[int, np.ndarray]] = []

    def add(self, nbytes: int) -> int:
        base = (len(self.regions) + 1) << 40
        self.regions.append((base, np.zeros(nbytes, np.uint8)))
        return base

    def at(self, address: int, nbytes: int) -> np.ndarray:
        for base, data in self.regions:
            if base <= address and address + nbytes <= base + data.nbytes:
                return data[address - base:address - base + nbytes]
        raise AssertionError(f"{nbytes} bytes at {address:#x} fall outside every region")

    def copy(self, jobs: list[tuple[int, int, int]]) -> None:
        """Run copies that may run at once (one batch): every source is read before any
        destination is written."""
        reads = [self.at(src, nbytes).copy() for _dst, src, nbytes in jobs]
        for (dst, _src, nbytes), data in zip(jobs, reads, strict=True):
            self.at(dst, nbytes)[:] = data
