"""A collective call that one rank's own checks refused, as that rank still makes it.

A rank that raised at once and skipped the call would shift every later call by one: its
next call would pair with its peers' refused one and hand back another call's data, and
its peers would wait for it in vain (found by a new user on host memory, 2026-12). So a
rank whose arguments fail a check still joins the call's first meeting, carrying a mark
where its signature's digest goes (the host path's header, the GPU kernels' header or
low-latency digest line). Every rank sees the mark in that meeting, no element moves,
and every rank raises the same error naming the rank and the argument; the ranks stay in
step, so the next good call is right everywhere.

Mark word (64 bits): ``MARK_TAG`` in bits 63..48, the argument's code (its index in
``ARGUMENTS`` plus one) in bits 47..40, the rank in bits 39..32, the collective's code (its
index in ``CALLS`` plus one) in bits 31..24; bits 23..0 are 0 in a header and the call's
number in a GPU error word (kernels/src/collectives/call.cuh records it there).
``Signature.digest`` keeps bit 63 clear, so no digest is ever a mark.
"""

from __future__ import annotations

from ..runtime.errors import CollectiveError

__all__ = ["ARGUMENTS", "CALLS", "CALL_NUMBER_BITS", "MARK_TAG", "ArgumentProblem", "blame",
           "decode_mark", "encode_mark", "is_mark", "refusal_error", "refused_error"]

# The mark's top 16 bits (kMarkTag in kernels/src/collectives/call.cuh): above the
# error-word codes of a disagreement (0xFFFF) and a splits problem (0xFFFE) in no order
# that matters, and never the top of a digest (bit 63 clear).
MARK_TAG = 0xFFFD
# What a mark can blame, by code (index + 1): append only, the kernels carry the codes.
ARGUMENTS = ("output", "input", "tensor", "output_splits", "input_splits", "op", "algo",
             "stream", "collective")
# The collectives a mark can name, by code (index + 1; 0: bind of an unknown collective).
CALLS = ("all_gather", "all_reduce", "reduce_scatter", "all_to_all", "all_to_all_v")
# The bits a mark leaves to the error word: the call's number there.
CALL_NUMBER_BITS = 0xFFFFFF


class ArgumentProblem(CollectiveError):
    """A check on this rank refused ``argument`` of a call (``detail``: what the check
    said). The call still runs, marked (``call_marks``); the communicator turns it into
    the error every rank raises."""

    def __init__(self, argument: str, detail: str) -> None:
        super().__init__(detail)
        self.argument = argument
        self.detail = detail


class blame:
    """``with blame(argument):`` turns a CollectiveError raised inside into an
    ``ArgumentProblem`` of ``argument`` (an ``ArgumentProblem`` passes as it is: the
    innermost blame names the argument). A class, not a generator: every call of the
    good path enters a few of these.

    Raises:
        ArgumentProblem: a check inside refused the call.
    """

    __slots__ = ("argument",)

    def __init__(self, argument: str) -> None:
        self.argument = argument

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type | None, error: BaseException | None, trace: object) -> None:
        if isinstance(error, CollectiveError) and not isinstance(error, ArgumentProblem):
            raise ArgumentProblem(self.argument, str(error)) from None


def encode_mark(rank: int, argument: str, call: str) -> int:
    """The mark of ``rank``'s call of ``call`` refused for ``argument``.

    Raises:
        ValueError: a rank outside 0..255 or an argument not in ``ARGUMENTS``.
    """
    if not 0 <= rank <= 0xFF:
        raise ValueError(f"rank={rank}: a mark names ranks 0 to 255")
    if argument not in ARGUMENTS:
        raise ValueError(f"argument={argument!r}: a mark names one of {', '.join(ARGUMENTS)}")
    code = CALLS.index(call) + 1 if call in CALLS else 0
    return ((MARK_TAG << 48) | ((ARGUMENTS.index(argument) + 1) << 40) | (rank << 32)
            | (code << 24))


def is_mark(word: int) -> bool:
    """Whether ``word`` (a header's digest or an error word) is a mark."""
    return word >> 48 == MARK_TAG


def decode_mark(word: int) -> tuple[int, str, str, int]:
    """(rank, argument, collective, the call's number in an error word) of a mark.

    Raises:
        ValueError: ``word`` is not a mark, or names no known argument.
    """
    if not is_mark(word):
        raise ValueError(f"0x{word:016x} is not a call's mark")
    code = (word >> 40) & 0xFF
    if not 1 <= code <= len(ARGUMENTS):
        raise ValueError(f"0x{word:016x}: a mark of unknown argument code {code}")
    call = (word >> 24) & 0xFF
    return ((word >> 32) & 0xFF, ARGUMENTS[code - 1],
            CALLS[call - 1] if 1 <= call <= len(CALLS) else "a collective call",
            word & CALL_NUMBER_BITS)


def refused_error(marks: list[int], details: list[str | None] | None = None, *,
                  where: str = "by every rank in the same call") -> CollectiveError:
    """The one-line error every rank raises for a call that ranks refused: ``marks`` are
    the refusing ranks' marks (any order; the call is named as the lowest of them names
    it), ``details`` (indexed by rank, where known) what each rank's check said, e.g.
    ``all_to_all_v: rank 0's output_splits failed its check there (output_splits add up to
    301 elements, more than output's 300); found by every rank in the same call, no element
    moved``."""
    decoded = sorted(decode_mark(mark) for mark in marks)
    call = decoded[0][2]
    return refusal_error(call, [
        (f"rank {rank}", argument,
         None if details is None or rank >= len(details) else details[rank])
        for rank, argument, _, _ in decoded], where=where)


def refusal_error(call: str, refusals: list[tuple[str, str, str | None]], *,
                  where: str = "by every rank in the same call") -> CollectiveError:
    """The one line of a refused ``call`` from ``(who, argument, detail)`` of each refusal
    (``who``: ``rank 2``, or ``every rank``; ``detail``: what the check said, where known),
    for one node's marks (``refused_error``) and for the agreement across nodes."""
    parts = []
    for who, argument, detail in refusals:
        text = f"{who}'s {argument} failed its check there"
        if detail:
            # The check's own text often starts with the call's name: said once, first.
            text += f" ({detail.removeprefix(f'{call}: ')})"
        parts.append(text)
    return CollectiveError(f"{call}: {'; '.join(parts)}; found {where}, no element moved")
