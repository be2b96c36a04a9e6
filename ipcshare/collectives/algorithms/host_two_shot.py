"""Host two-shot all-reduce: a reduce-scatter into the result areas, then an all-gather
from them."""

from __future__ import annotations

from .base import Algorithm, HostCall

__all__ = ["HostTwoShotAllReduce", "two_shot_chunks"]


def two_shot_chunks(count: int, size: int) -> list[tuple[int, int]]:
    """Each rank's ``(first, stop)`` elements: ceil(count / size) each, the last ranks
    fewer (possibly none)."""
    chunk = -(-count // size) if size else 0
    return [(min(r * chunk, count), min((r + 1) * chunk, count)) for r in range(size)]


class HostTwoShotAllReduce(Algorithm):
    """Rank r reduces chunk r of every input (in rank order, so every element gets the
    one-shot's bits) into its result area; after a barrier every rank copies every
    chunk from its owner's result area into its output.

    Two barriers, whatever the placement: inputs are all read before the middle one,
    and the result areas alternate between calls (parity), so a rank that runs ahead
    into the next call writes the other area while a slow peer still copies from this
    one; it cannot get two calls ahead, since the next call's entry barrier waits for
    that peer.
    """

    name = "two-shot"
    op = "all_reduce"
    memory = "host"

    def run(self, call: HostCall) -> None:
        assert call.reducer is not None
        itemsize = call.itemsize
        chunks = [(first * itemsize, stop * itemsize)
                  for first, stop in two_shot_chunks(call.count, call.size)]
        start, stop = chunks[call.rank]
        call.reducer([source[start:stop] for source in call.inputs],
                     call.results[call.rank][:stop - start])
        call.barrier()  # every chunk reduced, every input read
        for step in range(call.size):
            rank = (call.rank + step) % call.size
            start, stop = chunks[rank]
            call.output[start:stop] = call.results[rank][:stop - start]
