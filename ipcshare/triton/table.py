"""The peer table a Triton kernel receives: one int64 array holding the rank, the world
size and, per rank, the base of its signal pad and of every shared memory the view
covers. The one owner of its layout; the device functions (``ipcshare.triton.device``)
read these constants, and the host builds the array here without Triton or a GPU."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

__all__ = ["HEADER_WORDS", "RANK_WORD", "WORLD_WORD", "ROWS_WORD", "TIMEOUT_WORD", "PAD_ROW",
           "WINDOW_ROW", "FIRST_REGISTRATION_ROW", "MAX_ALIGNMENT", "TableDescription",
           "pack_table", "row_offset", "translate_address"]

# Header words: [rank, world size, rows, timeout in ns]; then `rows` rows of `world size`
# words. The timeout is how long barrier_all waits for a peer before it records the peer
# in the pad's error word and gives up (0: forever).
HEADER_WORDS = 4
RANK_WORD, WORLD_WORD, ROWS_WORD, TIMEOUT_WORD = 0, 1, 2, 3
# Row 0: every rank's signal pad (word 0 of it), mapped here. Row 1: every rank's window
# (the communicator's window for comm.empty() arrays). Rows 2, 3, ...: registrations, in
# the order the view was given them.
PAD_ROW = 0
WINDOW_ROW = 1
FIRST_REGISTRATION_ROW = 2
# The most ``TableDescription.alignment`` reports: 16 bytes, the widest access a thread
# makes (a vector of four 32-bit words).
MAX_ALIGNMENT = 16


@dataclasses.dataclass(frozen=True)
class TableDescription:
    """What a view describes, independent of where it came from: this rank, and per rank
    the address (in this process) of its signal pad and of each shared memory, window
    first. Every address list is indexed by rank and includes this rank's own."""

    rank: int
    pads: tuple[int, ...]
    memories: tuple[tuple[int, ...], ...]
    timeout_ns: int = 0

    @property
    def world_size(self) -> int:
        return len(self.pads)

    def __post_init__(self) -> None:
        size = len(self.pads)
        if size == 0:
            raise ValueError("a peer table needs at least one rank")
        if not 0 <= self.rank < size:
            raise ValueError(f"rank {self.rank} is outside a world of {size}")
        if self.timeout_ns < 0:
            raise ValueError(f"timeout_ns={self.timeout_ns} is negative")
        if not self.memories:
            raise ValueError("a peer table needs the window's bases (row 1)")
        for index, bases in enumerate(self.memories):
            if len(bases) != size:
                raise ValueError(f"memory {index} names {len(bases)} bases for {size} ranks")
        for row, bases in enumerate((self.pads, *self.memories)):
            missing = [r for r, base in enumerate(bases) if base <= 0]
            if missing:
                raise ValueError(f"row {row} has no address for rank(s) {missing}: every "
                                 "rank must be mapped here (one node, peer access)")


    def alignment(self, row: int) -> int:
        """The largest power of two up to ``MAX_ALIGNMENT`` bytes that divides the distance
        from this rank's base of ``row`` to every rank's: what ``translate`` may promise
        Triton about the place it computes (its ``align``), so that loads and stores
        through it are vectorised. 16 for mappings (every base is at least 256-byte
        aligned); an array's own alignment or less for one at an arbitrary address.

        Raises:
            ValueError: no such row.
        """
        rows = (self.pads, *self.memories)
        if not 0 <= row < len(rows):
            raise ValueError(f"row {row} is not in this table (rows 0 to {len(rows) - 1})")
        here = rows[row][self.rank]
        distances = [abs(base - here) for base in rows[row]]
        return math.gcd(MAX_ALIGNMENT, *distances)   # a divisor of 16: a power of two


def row_offset(row: int, world_size: int) -> int:
    """Index of the first word of ``row`` in the table."""
    return HEADER_WORDS + row * world_size


def pack_table(description: TableDescription) -> np.ndarray:
    """The table as the device reads it: int64, header then rows (pads, window,
    registrations). Addresses are unsigned 64-bit values stored in int64 words."""
    size = description.world_size
    rows = (description.pads, *description.memories)
    table = np.zeros(row_offset(len(rows), size), dtype=np.int64)
    table[RANK_WORD] = description.rank
    table[WORLD_WORD] = size
    table[ROWS_WORD] = len(rows)
    table[TIMEOUT_WORD] = description.timeout_ns
    for row, bases in enumerate(rows):
        start = row_offset(row, size)
        table[start:start + size] = np.array(bases, dtype=np.uint64).view(np.int64)
    return table


def translate_address(table: np.ndarray, address: int, peer: int, row: int = WINDOW_ROW,
                      ) -> int:
    """Where ``address`` (in this rank's memory of ``row``) lies in ``peer``'s memory of
    that row, mapped here: ``address - base[me] + base[peer]``, as ``translate`` computes
    on the device."""
    size = int(table[WORLD_WORD])
    if not 0 <= peer < size:
        raise ValueError(f"peer rank {peer} is outside a world of {size}")
    if not 0 <= row < int(table[ROWS_WORD]):
        raise ValueError(f"row {row} is outside a table of {int(table[ROWS_WORD])} rows")
    bases = table[row_offset(row, size):row_offset(row + 1, size)].view(np.uint64)
    me = int(table[RANK_WORD])
    return (address - int(bases[me]) + int(bases[peer])) % (1 << 64)
