"""Where everything lives in a communicator's window: the ``empty()`` heap, the staging
areas that inputs are copied into, the two-shot result areas, the buffers of the
low-latency protocol, and where the call headers lie in the signal pad (whose words
window.layout owns). One owner for the layout, so every path and algorithm agrees on it."""

from __future__ import annotations

import dataclasses

from ..window.layout import HEADER_WORDS, LL_CLEANED_SLOT, USER_SLOT_BASE, round_up

__all__ = ["ScratchLayout", "ALIGN", "HEADER_WORDS", "LL_MAX_BYTES", "LL_LINE_BYTES",
           "LL_LINE_PAYLOAD", "LL_CLEANED_SLOT", "LL128_LINE_BYTES", "LL128_LINE_PAYLOAD",
           "LL128_MAX_BYTES", "ll_payload_lines", "ll128_lines", "ll_slot_payload_lines",
           "ll128_slot_payload_lines", "split_row_words"]

# Regions and heap blocks start at multiples of this many bytes (every dtype aligned,
# and vector loads of the GPU kernels to come).
ALIGN = 256
# The low-latency protocol (kernels/include/ipcshare/ll.cuh) sends 8 payload bytes per
# 16-byte line, after one line carrying the call's digest. Its buffers hold inputs of up to
# LL_MAX_BYTES (it is meant for small calls, where latency, not bytes, sets the time).
LL_LINE_BYTES = 16
LL_LINE_PAYLOAD = 8
LL_MAX_BYTES = 2 << 20
# 128-byte lines (kernels/include/ipcshare/ll128.cuh): 120 payload bytes and a 64-bit flag,
# after a 128-byte head (the LL digest travels in the LL slot). Buffers of their own: an
# LL line read where an LL128 line left payload could take payload for its flag. They hold
# inputs (blocks, for all-to-all) of up to LL128_MAX_BYTES: the wire carries 1.07x the
# bytes, so LL128 stays worth its one NVLink trip for larger calls than LL, up to where the
# copy kernels reach the link's rate (an uneven all-to-all-v of 8 MiB at 2 ranks still
# missed the all-to-all-v's target with every copy kernel).
LL128_LINE_BYTES = 128
LL128_LINE_PAYLOAD = 120
LL128_MAX_BYTES = 8 << 20


def _align(value: int) -> int:
    return round_up(value, ALIGN)


def ll_payload_lines(nbytes: int) -> int:
    """Lines that carry ``nbytes`` of payload, the last one partly (ll.cuh's
    ``payload_lines``)."""
    return -(-nbytes // LL_LINE_PAYLOAD)


def ll128_lines(nbytes: int) -> int:
    """128-byte lines that carry ``nbytes`` of payload (ll128.cuh's ``ll128_lines``)."""
    return -(-nbytes // LL128_LINE_PAYLOAD)


def _largest_chunk(max_bytes: int, world_size: int) -> int:
    """Bytes of the largest two-shot chunk of an input of up to ``max_bytes``: ceil(count
    / n) elements rounded up to 16 bytes (two_shot_chunks.cuh) is at most ceil(bytes / n)
    plus 7 bytes of a partial element of up to 8, rounded up to 16."""
    return round_up(-(-max_bytes // world_size) + 7, 16)


def ll128_slot_payload_lines(max_bytes: int, world_size: int) -> int:
    """128-byte lines an LL128 slot holds after its head, for inputs (all-to-all: blocks)
    of up to ``max_bytes`` over ``world_size`` ranks: the whole input, or the LL128
    two-shot's two regions of a full chunk each, whichever is more."""
    whole = ll128_lines(max_bytes)
    if world_size < 2 or max_bytes <= 0:
        return whole
    return max(whole, 2 * ll128_lines(_largest_chunk(max_bytes, world_size)))


def split_row_words(world_size: int) -> int:
    """Words of a rank's split row on GPUs (all_to_all.cuh's ``split_row_words``): its
    sends, the receives it expects, whether it said them, its input's and its output's
    elements."""
    return 2 * world_size + 3


def ll_slot_payload_lines(max_bytes: int, world_size: int) -> int:
    """Lines a slot holds after its digest line, for inputs of up to ``max_bytes`` over
    ``world_size`` ranks: the whole input behind a split row (the one-shot kernels send
    the input alone; the LL all-to-all-v sends the sender's split row, a line a word,
    then its block, which may be the whole input), or the LL two-shot's two regions of a
    chunk each (``_largest_chunk``), whichever is more. Small inputs need the two regions
    (2 floats at 4 ranks: 1 line whole, 2 x 2 lines in chunks), so without them a
    communicator sized for its call refused the two-shot's smallest calls."""
    whole = ll_payload_lines(max_bytes)
    if world_size < 2 or max_bytes <= 0:
        return whole
    chunk = _largest_chunk(max_bytes, world_size)
    return max(whole + split_row_words(world_size), 2 * (chunk // LL_LINE_PAYLOAD))


@dataclasses.dataclass(frozen=True)
class ScratchLayout:
    """The window of a communicator for calls of up to ``max_bytes`` (the largest array
    of a call) over ``world_size`` ranks, with ``heap_bytes`` for ``empty()``:

    ``[heap][staging 0][staging 1][result 0][result 1][LL 0][LL 1][splits 0][splits 1]``
    ``[LL128 0][LL128 1]``

    Staging ``p`` holds the copied-in input of calls of parity ``p`` (staging 0 is also
    the copy-engine all-reduce's inbox: one chunk per source rank); result ``p`` holds this
    rank's reduced chunk in a two-shot all-reduce (the copy-engine one gathers every
    rank's chunk in result 0, so it is as large as an input);
    LL ``p`` holds one slot per source rank, where that rank's lines of low-latency calls
    of parity ``p`` land (a digest line, then the input, up to ``ll_max_bytes``; the LL
    all-to-all-v puts the sender's split row before its block, the LL two-shot two
    regions of a chunk's lines, which must fit in as many);
    splits ``p`` holds this rank's ``input_splits`` then ``output_splits`` (int64, one per
    rank each) of an all-to-all-v call of parity ``p``, which every peer reads after the
    entry barrier (the per-call check that the ranks' splits match); on GPUs three more
    words follow (kernels/src/collectives/all_to_all.cuh); LL128 ``p`` holds one slot
    per source rank for the 128-byte lines of the ``ll128`` calls of parity ``p`` (a
    128-byte head, then an input of up to ``ll128_max_bytes``, or the LL128 two-shot's
    two regions of a chunk's lines).
    """

    max_bytes: int
    heap_bytes: int
    world_size: int
    # A GPU window: it holds LL buffers, and result areas as large as an input.
    gpu: bool = False

    @property
    def heap_offset(self) -> int:
        return 0

    @property
    def staging_bytes(self) -> int:
        # The inbox's n chunks, each rounded up to 16 bytes, may pass the input's end by
        # 16 bytes per rank.
        return _align(self.max_bytes + 16 * self.world_size)

    @property
    def result_bytes(self) -> int:
        # Two-shot: ceil(count / n) elements, which the GPU kernels round up to 16 bytes,
        # plus an element of up to 8 bytes that ceil() on elements can add to ceil() on
        # bytes. Copy-engine (GPU windows): the whole reduced input.
        chunk = _align(-(-self.max_bytes // self.world_size) + 32)
        return max(chunk, _align(self.max_bytes)) if self.gpu else chunk

    def staging_offset(self, parity: int) -> int:
        return _align(self.heap_bytes) + parity * self.staging_bytes

    def result_offset(self, parity: int) -> int:
        return self.staging_offset(2) + parity * self.result_bytes

    @property
    def ll_max_bytes(self) -> int:
        """The largest input a low-latency call may have with this window (0: none)."""
        return min(self.max_bytes, LL_MAX_BYTES) if self.gpu else 0

    @property
    def ll_slot_bytes(self) -> int:
        if not self.gpu:
            return 0
        lines = 1 + ll_slot_payload_lines(self.ll_max_bytes, self.world_size)
        return _align(lines * LL_LINE_BYTES)

    def ll_offset(self, parity: int) -> int:
        return self.result_offset(2) + parity * self.world_size * self.ll_slot_bytes

    @property
    def splits_bytes(self) -> int:
        # Host: [input_splits, output_splits]; GPU kernels add three words (whether the
        # output_splits were given, the input's and the output's elements).
        return _align(8 * split_row_words(self.world_size))

    def splits_offset(self, parity: int) -> int:
        return self.ll_offset(2) + parity * self.splits_bytes

    @property
    def ll128_max_bytes(self) -> int:
        """The largest input (all-to-all: block) an ``ll128`` call may have (0: none)."""
        return min(self.max_bytes, LL128_MAX_BYTES) if self.gpu else 0

    @property
    def ll128_slot_bytes(self) -> int:
        if not self.gpu:
            return 0
        lines = ll128_slot_payload_lines(self.ll128_max_bytes, self.world_size)
        return _align(LL128_LINE_BYTES * (1 + lines))

    def ll128_offset(self, parity: int) -> int:
        return self.splits_offset(2) + parity * self.world_size * self.ll128_slot_bytes

    @property
    def total_bytes(self) -> int:
        return self.ll128_offset(2)

    def in_heap(self, offset: int, nbytes: int) -> bool:
        """Whether ``[offset, offset + nbytes)`` of the window lies in the heap."""
        return 0 <= offset and offset + nbytes <= self.heap_bytes and nbytes > 0

    @staticmethod
    def header_slot(parity: int) -> int:
        """The first pad word of the header of calls of ``parity``."""
        return USER_SLOT_BASE + parity * HEADER_WORDS
