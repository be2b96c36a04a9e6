"""The allocator behind ``Communicator.empty()``: first fit over the window's heap,
blocks aligned, neighbours merged when freed."""

from __future__ import annotations

import bisect

__all__ = ["Heap"]


class Heap:
    """Blocks of ``[0, nbytes)`` handed out and taken back by offset. Local to a rank:
    peers learn where an input lies from each call's header, not from the heap."""

    def __init__(self, nbytes: int, align: int) -> None:
        self.nbytes = nbytes
        self.align = align
        # Free ranges as sorted (offset, length) pairs; used blocks by offset.
        self._free: list[tuple[int, int]] = [(0, nbytes)] if nbytes > 0 else []
        self._used: dict[int, int] = {}

    @property
    def free_bytes(self) -> int:
        return sum(length for _offset, length in self._free)

    @property
    def largest_free(self) -> int:
        """The largest run of free bytes: the largest array that can be had now."""
        return max((length for _offset, length in self._free), default=0)

    def allocate(self, nbytes: int) -> int | None:
        """The offset of a new block of at least ``nbytes`` (one alignment unit when 0),
        or None when no free range is large enough."""
        size = max(self.align, -(-nbytes // self.align) * self.align)
        for index, (offset, length) in enumerate(self._free):
            if length >= size:
                if length == size:
                    del self._free[index]
                else:
                    self._free[index] = (offset + size, length - size)
                self._used[offset] = size
                return offset
        return None

    def free(self, offset: int) -> None:
        """Give back the block at ``offset`` (allocated and not yet freed)."""
        size = self._used.pop(offset)
        index = bisect.bisect_left(self._free, (offset, 0))
        if index < len(self._free) and self._free[index][0] == offset + size:
            size += self._free.pop(index)[1]
        if index > 0 and sum(self._free[index - 1]) == offset:
            offset, previous = self._free.pop(index - 1)
            size += previous
            index -= 1
        self._free.insert(index, (offset, size))
