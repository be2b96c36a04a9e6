"""Sizes of what a test allocates, from the world size it runs at: the same test runs at
1 to 8 ranks, and an all-gather's output or a reduce-scatter's input grows with the ranks."""

from __future__ import annotations

__all__ = ["max_bytes_for"]

# Rounded up to whole 64 KiB: a size that reads well in an error message.
_ROUND = 64 << 10


def max_bytes_for(world_size: int, per_rank_bytes: int, *, at_least: int = 0) -> int:
    """A communicator's ``max_bytes`` for calls whose largest array is ``per_rank_bytes``
    from each of ``world_size`` ranks (an all-gather's output, a reduce-scatter's input):
    ``world_size * per_rank_bytes`` rounded up to 64 KiB, and no less than ``at_least``
    (the size the test's other calls were written for).

    Raises:
        ValueError: ``world_size`` below 1 or ``per_rank_bytes`` below 0.
    """
    if world_size < 1 or per_rank_bytes < 0:
        raise ValueError(f"world_size={world_size}, per_rank_bytes={per_rank_bytes}: "
                         "expected at least 1 rank and 0 bytes")
    whole = -(-world_size * per_rank_bytes // _ROUND) * _ROUND
    return max(whole, at_least)
