"""Element-wise reductions over every rank's data, in rank order, on host memory.

The semantics are the contract every algorithm and backend keeps, so that results are
bitwise identical on every rank, from run to run and across algorithms:

- Types: float32, float16, bfloat16, int32. Ops: sum, max, min.
- ``sum``: float32 additions in rank order 0, 1, ..., n-1 (``((x0 + x1) + x2) + ...``),
  16-bit types converted exactly to float32 first and rounded once at the end (round to
  nearest even, overflowing to infinity). An element's result depends only on that
  element's values, so a one-shot and a two-shot all-reduce (which cut the array in
  chunks) give the same bits. int32 sums wrap around modulo 2**32 (two's complement),
  which no order changes. A NaN input gives a NaN; its payload is what the float32
  addition of this machine gives (the same on every rank and run).
- ``max`` / ``min``: IEEE 754-2019 ``maximum`` / ``minimum``. A NaN on any rank gives
  the canonical quiet NaN (float32 0x7FC00000, float16 0x7E00, bfloat16 0x7FC0);
  otherwise -0.0 counts as less than +0.0, so ``max(-0.0, +0.0)`` is +0.0 and
  ``min(-0.0, +0.0)`` is -0.0 in any order. Infinities order as usual. The result is
  always one of the inputs (or the canonical NaN): no rounding happens.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from ..runtime.errors import CollectiveError

__all__ = ["REDUCE_DTYPES", "REDUCE_OPS", "Reducer", "check_reduction", "bfloat16_to_float32",
           "float32_to_bfloat16", "CANONICAL_NAN_BITS"]

REDUCE_DTYPES = ("float32", "float16", "bfloat16", "int32")
REDUCE_OPS = ("sum", "max", "min")
CANONICAL_NAN_BITS = {"float32": 0x7FC00000, "float16": 0x7E00, "bfloat16": 0x7FC0}
# Elements reduced at a time: the accumulator and one chunk of every source stay in a
# core's cache while the ranks' values are folded in.
_CHUNK_ELEMENTS = 1 << 15


@dataclasses.dataclass(frozen=True)
class _FloatBits:
    """An IEEE binary format seen as integers: its unsigned and signed bit types, the
    bits below the sign, and the bits of +infinity."""

    unsigned: type
    signed: type
    magnitude: int
    infinity: int
    width: int


_FLOAT_BITS = {
    "float32": _FloatBits(np.uint32, np.int32, 0x7FFFFFFF, 0x7F800000, 32),
    "float16": _FloatBits(np.uint16, np.int16, 0x7FFF, 0x7C00, 16),
    "bfloat16": _FloatBits(np.uint16, np.int16, 0x7FFF, 0x7F80, 16),
}


def check_reduction(dtype: str, op: object, name: str, *, call: str) -> None:
    """Raise unless ``op`` is a reduction this library runs and ``dtype`` a type it
    reduces; ``name`` is the array argument carrying ``dtype``, ``call`` the call.

    Raises:
        CollectiveError: naming the value and what is allowed.
    """
    if not isinstance(op, str) or op not in REDUCE_OPS:
        raise CollectiveError(f"op={op!r} is not a reduction {call} runs; choose one of: "
                              f"{', '.join(REDUCE_OPS)}")
    if dtype not in REDUCE_DTYPES:
        raise CollectiveError(f"{name} has dtype {dtype}: {call} reduces "
                              f"{', '.join(REDUCE_DTYPES)}")


def bfloat16_to_float32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 values (their uint16 bits) as float32: exact."""
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def float32_to_bfloat16(values: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 (uint16 bits): to nearest even, overflowing to
    infinity; a NaN keeps its sign and becomes the quiet NaN 0x7FC0 (as ml_dtypes)."""
    bits = values.view(np.uint32)
    rounded = (bits + ((bits >> np.uint32(16)) & np.uint32(1)) + np.uint32(0x7FFF)) >> np.uint32(16)
    out = rounded.astype(np.uint16)
    nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    if nan.any():
        out[nan] = (bits[nan] >> np.uint32(16)).astype(np.uint16) & np.uint16(0x8000) | np.uint16(
            0x7FC0)
    return out


def _total_order_key(bits: np.ndarray, kind: _FloatBits) -> np.ndarray:
    """Signed integers that order like the floats (IEEE totalOrder: -0.0 < +0.0): the
    magnitude bits of negative values flipped. Its own inverse."""
    signed = bits.view(kind.signed)
    shift = kind.signed(kind.width - 1)
    return signed ^ ((signed >> shift) & kind.signed(kind.magnitude))


def _is_nan(bits: np.ndarray, kind: _FloatBits) -> np.ndarray:
    return (bits.view(kind.unsigned) & kind.unsigned(kind.magnitude)) > kind.unsigned(
        kind.infinity)


class Reducer:
    """Reduces ``dtype`` values with ``op`` (``sum``, ``max``, ``min``) over sources in
    the given (rank) order, with the semantics of this module's docstring.

    Raises (constructor):
        CollectiveError: unknown dtype or op.
    """

    def __init__(self, dtype: str, op: str) -> None:
        check_reduction(dtype, op, "input", call="a reduction")
        self.dtype = dtype
        self.op = op
        self.itemsize = 2 if dtype in ("float16", "bfloat16") else 4
        self._fold = self._make_fold()

    def __call__(self, sources: Sequence[np.ndarray], out: np.ndarray) -> None:
        """Write the reduction of ``sources`` (uint8 byte arrays of one length, in rank
        order) into ``out`` (uint8, the same length). ``out`` may be one of the sources:
        each chunk is read from every source before it is written."""
        nbytes = out.nbytes
        if any(source.nbytes != nbytes for source in sources) or not sources:
            raise ValueError(f"reducing {[s.nbytes for s in sources]} bytes into {nbytes}")
        step = _CHUNK_ELEMENTS * self.itemsize
        with np.errstate(all="ignore"):
            for start in range(0, nbytes, step):
                stop = min(start + step, nbytes)
                self._fold([source[start:stop] for source in sources], out[start:stop])

    def _make_fold(self) -> Callable[[list[np.ndarray], np.ndarray], None]:
        if self.op == "sum":
            return _SUMS[self.dtype]
        if self.dtype == "int32":
            combine = np.maximum if self.op == "max" else np.minimum

            def fold_int(sources: list[np.ndarray], out: np.ndarray) -> None:
                acc = sources[0].view(np.int32).copy()
                for source in sources[1:]:
                    combine(acc, source.view(np.int32), out=acc)
                out.view(np.int32)[:] = acc
            return fold_int
        kind = _FLOAT_BITS[self.dtype]
        combine = np.maximum if self.op == "max" else np.minimum
        canonical = kind.unsigned(CANONICAL_NAN_BITS[self.dtype])

        def fold_float(sources: list[np.ndarray], out: np.ndarray) -> None:
            key = _total_order_key(sources[0], kind)
            nan = _is_nan(sources[0], kind)
            for source in sources[1:]:
                combine(key, _total_order_key(source, kind), out=key)
                nan |= _is_nan(source, kind)
            out.view(kind.signed)[:] = _total_order_key(key, kind)
            if nan.any():
                out.view(kind.unsigned)[nan] = canonical
        return fold_float


def _sum_float32(sources: list[np.ndarray], out: np.ndarray) -> None:
    acc = sources[0].view(np.float32).copy()
    for source in sources[1:]:
        np.add(acc, source.view(np.float32), out=acc)
    out.view(np.float32)[:] = acc


def _sum_float16(sources: list[np.ndarray], out: np.ndarray) -> None:
    acc = sources[0].view(np.float16).astype(np.float32)
    for source in sources[1:]:
        np.add(acc, source.view(np.float16), out=acc)
    out.view(np.float16)[:] = acc  # one rounding, to nearest even


def _sum_bfloat16(sources: list[np.ndarray], out: np.ndarray) -> None:
    acc = bfloat16_to_float32(sources[0].view(np.uint16))
    for source in sources[1:]:
        np.add(acc, bfloat16_to_float32(source.view(np.uint16)), out=acc)
    out.view(np.uint16)[:] = float32_to_bfloat16(acc)


def _sum_int32(sources: list[np.ndarray], out: np.ndarray) -> None:
    acc = sources[0].view(np.int32).copy()
    for source in sources[1:]:
        np.add(acc, source.view(np.int32), out=acc)  # wraps modulo 2**32
    out.view(np.int32)[:] = acc


_SUMS = {"float32": _sum_float32, "float16": _sum_float16, "bfloat16": _sum_bfloat16,
         "int32": _sum_int32}
