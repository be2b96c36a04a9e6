"""Data seeded by (iteration, rank): every rank can compute what every peer must hold."""

from __future__ import annotations

import numpy as np

__all__ = ["seeded_bytes", "seeded_small_integers", "poison", "count_wrong", "POISON_BYTE"]

POISON_BYTE = 0xA5
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def seeded_bytes(iteration: int, rank: int, nbytes: int, *, offset_words: int = 0) -> np.ndarray:
    """``nbytes`` pseudo-random bytes that depend only on (iteration, rank).

    A splitmix64 stream over word indices: cheap in numpy, and no two (iteration, rank)
    pairs share a block, so a block landing at the wrong place is caught.
    """
    words = -(-nbytes // 8)
    seed = np.uint64(((iteration & 0xFFFFFFFF) << 32) | (rank & 0xFFFFFFFF))
    with np.errstate(over="ignore"):
        x = np.arange(offset_words, offset_words + words, dtype=np.uint64)
        x *= _GOLDEN
        x += seed * _MIX2 + _GOLDEN
        x ^= x >> np.uint64(30)
        x *= _MIX1
        x ^= x >> np.uint64(27)
        x *= _MIX2
        x ^= x >> np.uint64(31)
    return x.view(np.uint8)[:nbytes]


def seeded_small_integers(iteration: int, rank: int, count: int, world_size: int) -> np.ndarray:
    """``count`` integers (int64) that depend only on (iteration, rank), small enough that
    any sum of ``world_size`` of them, in any order, is at most 256 in magnitude: exact in
    every reduction type (bfloat16 holds integers exactly up to 256), so every algorithm
    and every summation order must give the same bits. Ranks from 256 on give zeros."""
    bound = max(1, min(8, 256 // max(world_size, 1)))
    if rank >= 256:
        return np.zeros(count, np.int64)
    spread = seeded_bytes(iteration, rank, count).astype(np.int64)
    return spread % (2 * bound + 1) - bound


def poison(nbytes: int) -> np.ndarray:
    """Bytes to fill outputs with before a checked run."""
    return np.full(nbytes, POISON_BYTE, dtype=np.uint8)


def count_wrong(actual: np.ndarray, expected: np.ndarray, element_size: int) -> int:
    """Elements of ``element_size`` bytes whose bits differ (bit-exact comparison)."""
    if actual.nbytes != expected.nbytes:
        raise ValueError(f"comparing {actual.nbytes} bytes with {expected.nbytes}")
    if element_size in (1, 2, 4, 8) and actual.nbytes % element_size == 0:
        kind = f"u{element_size}"
        return int(np.count_nonzero(actual.view(kind) != expected.view(kind)))
    diff = (actual != expected).reshape(-1, element_size)
    return int(np.count_nonzero(diff.any(axis=1)))
