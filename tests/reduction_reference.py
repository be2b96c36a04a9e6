"""What a reduction must give, computed another way than the library does (float64 and
ml_dtypes instead of bit tricks), for the unit and the MPI tests of the collectives."""

from __future__ import annotations

import ml_dtypes
import numpy as np

NUMPY_DTYPES = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16),
                "bfloat16": np.dtype(ml_dtypes.bfloat16), "int32": np.dtype(np.int32)}
CANONICAL_NAN = {"float32": 0x7FC00000, "float16": 0x7E00, "bfloat16": 0x7FC0}
_BITS = {4: np.uint32, 2: np.uint16}


def seeded_values(dtype: str, count: int, seed: int, rank: int, *,
                  specials: bool = False) -> np.ndarray:
    """``count`` values of ``dtype`` that depend only on (seed, rank); with
    ``specials``, NaN, +-inf, +-0.0 and 1.0 at the first places, shifted by rank so
    every pairing of them meets."""
    rng = np.random.default_rng([seed, rank])
    numpy_dtype = NUMPY_DTYPES[dtype]
    if dtype == "int32":
        return rng.integers(-(1 << 31), 1 << 31, size=count, dtype=np.int64).astype(np.int32)
    values = (rng.standard_normal(count) * 100).astype(np.float32).astype(numpy_dtype)
    if specials and count:
        table = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0], np.float32)
        picks = table[(np.arange(min(count, 36)) // 6 * (rank + 1) + np.arange(min(count, 36)))
                      % len(table)]
        values[:len(picks)] = picks.astype(numpy_dtype)
    return values


def reference(dtype: str, op: str, inputs: list[np.ndarray]) -> np.ndarray:
    """The expected result of reducing ``inputs`` (in rank order) with ``op``."""
    numpy_dtype = NUMPY_DTYPES[dtype]
    if dtype == "int32":
        stack = np.stack([x.astype(np.int64) for x in inputs])
        if op == "sum":
            total = stack.sum(axis=0)
            return (total & 0xFFFFFFFF).astype(np.uint32).view(np.int32)
        return (stack.max(axis=0) if op == "max" else stack.min(axis=0)).astype(np.int32)
    if op == "sum":
        acc = inputs[0].astype(np.float32)
        with np.errstate(all="ignore"):
            for x in inputs[1:]:
                acc = acc + x.astype(np.float32)
            return acc.astype(numpy_dtype)
    stack = np.stack([x.astype(np.float64) for x in inputs])
    nan = np.isnan(stack).any(axis=0)
    clean = np.where(np.isnan(stack), 0.0, stack)
    best = clean.max(axis=0) if op == "max" else clean.min(axis=0)
    zero = best == 0
    if op == "max":  # +0.0 if any rank has +0.0 there
        sign_negative = ~((stack == 0) & ~np.signbit(stack)).any(axis=0)
    else:            # -0.0 if any rank has -0.0 there
        sign_negative = ((stack == 0) & np.signbit(stack)).any(axis=0)
    best = np.where(zero, np.where(sign_negative, -0.0, 0.0), best)
    result = best.astype(numpy_dtype)
    bits = result.view(_BITS[numpy_dtype.itemsize])
    bits[nan] = CANONICAL_NAN[dtype]
    return result


def mismatches(dtype: str, op: str, got: np.ndarray, want: np.ndarray) -> int:
    """Elements whose bits differ; for a float sum, two NaNs match whatever their
    payloads (the library leaves sum's NaN payload to the hardware)."""
    bits = _BITS[got.itemsize]
    differ = got.view(bits) != want.view(bits)
    if op == "sum" and dtype != "int32":
        differ &= ~(np.isnan(got.astype(np.float32)) & np.isnan(want.astype(np.float32)))
    return int(np.count_nonzero(differ))
