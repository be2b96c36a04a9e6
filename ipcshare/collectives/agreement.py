"""What the ranks of one collective call must agree on (its signature), the digest that
travels in each call's header, and the error every rank raises when they do not agree."""

from __future__ import annotations

import dataclasses
import functools
import hashlib

from ..runtime.config import format_size
from ..runtime.errors import CollectiveError
from ..topology.world import describe_disagreement

__all__ = ["Signature", "disagreement_error"]


@dataclasses.dataclass(frozen=True)
class Signature:
    """One call as every rank must make it: the collective, the elements of its input,
    their dtype, the reduction (None for all-gather) and the algorithm that runs it.

    Placement (copied in or zero-copy) and in place / out of place are each rank's own
    business and not part of it; the shape is not either (arrays are flat element runs).
    An all-to-all-v's counts differ from rank to rank and call to call: its ``count`` is
    0, and the splits are checked each call (algorithms/host_all_to_all.py).
    """

    op: str
    count: int
    dtype: str
    itemsize: int
    redop: str | None
    algo: str

    @property
    def nbytes(self) -> int:
        return self.count * self.itemsize

    @functools.cached_property
    def digest(self) -> int:
        """A 64-bit digest, the same in every process (unlike ``hash``); computed once.
        Bit 63 is clear, so a digest is never a refused call's mark (call_marks.py)."""
        text = repr(dataclasses.astuple(self)).encode()
        return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1

    def describe(self) -> str:
        """``all_reduce of 1000 float32 (4000 bytes), op sum, algo one-shot``."""
        if self.op == "all_to_all_v":
            return f"all_to_all_v of {self.dtype} (counts by splits), algo {self.algo}"
        size = format_size(self.nbytes)
        text = f"{self.op} of {self.count} {self.dtype} ({self.nbytes} bytes"
        text += f" = {size})" if size != str(self.nbytes) else ")"
        if self.redop is not None:
            text += f", op {self.redop}"
        return f"{text}, algo {self.algo}"


def disagreement_error(descriptions: list[str]) -> CollectiveError:
    """The error of a call whose ranks disagree, from every rank's ``describe()``, e.g.
    ``ranks disagree on a collective call: ranks 0, 2 call all_reduce of 10 float32
    (40 bytes), op sum, algo one-shot, rank 1 all_reduce of 11 float32 ...``."""
    return CollectiveError("ranks disagree on a collective call: " + describe_disagreement(
        descriptions, verb=("calls", "call")))
