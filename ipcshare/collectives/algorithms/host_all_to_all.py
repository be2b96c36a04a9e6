"""Host all-to-all and all-to-all-v: each rank pulls, from every rank's input, the part
addressed to it, into its own output; and the checks of the splits (on the calling rank,
and the ranks' rows against each other, which every rank makes alike)."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from ...runtime.errors import CollectiveError
from ..arrays import in_device_memory
from .base import Algorithm, HostCall

__all__ = ["HostAllToAll", "HostAllToAllV", "check_splits", "split_mismatches",
           "splits_disagreement"]

# Mismatched pairs spelled out in the disagreement error; the rest are counted.
_NAMED_PAIRS = 4


def check_splits(splits: Any, name: str, *, ranks: int, count: int, array: str,
                 call: str = "all_to_all_v") -> tuple[int, ...]:
    """``splits`` as a tuple of ``ranks`` element counts, each at least 0, adding up to
    at most ``count`` (the elements of the array called ``array``). ``splits`` is a
    Python sequence of ints or a 1-D numpy integer array. Pure: nothing collective.

    Raises:
        CollectiveError: naming ``name`` and what is wrong with it.
    """
    if isinstance(splits, np.ndarray):
        if splits.ndim != 1 or splits.dtype.kind not in "iu":
            raise CollectiveError(
                f"{call}: {name} is a numpy array of dtype {splits.dtype} and shape "
                f"{splits.shape}: pass one int per rank (a list, or a 1-D integer array)")
        values: Sequence[Any] = splits.tolist()
    elif isinstance(splits, (str, bytes)) or not isinstance(splits, Sequence):
        device = in_device_memory(splits)
        hint = (" (splits in device memory are read by the GPU kernels: a communicator "
                "on host memory takes host counts)" if device else "")
        raise CollectiveError(f"{call}: {name} is a {type(splits).__name__}: pass a "
                              f"sequence of one int per rank{hint}")
    else:
        values = splits
    if len(values) != ranks:
        raise CollectiveError(f"{call}: {name} has {len(values)} counts, expected one per "
                              f"rank ({ranks})")
    counts = []
    for index, value in enumerate(values):
        if isinstance(value, (bool, np.bool_)):
            raise CollectiveError(f"{call}: {name}[{index}]={value!r}: expected an int")
        try:
            number = operator.index(value)
        except TypeError:
            raise CollectiveError(f"{call}: {name}[{index}]={value!r}: expected an int "
                                  "(an element count)") from None
        if number < 0:
            raise CollectiveError(f"{call}: {name}[{index}]={number}: counts are elements, "
                                  "at least 0")
        counts.append(number)
    total = sum(counts)
    if total > count:
        raise CollectiveError(f"{call}: {name} add up to {total} elements, more than "
                              f"{array}'s {count}")
    return tuple(counts)


def split_mismatches(table: np.ndarray) -> list[tuple[int, int, int, int]]:
    """The pairs whose counts differ, as ``(receiver, sender, expected, sent)`` in
    receiver then sender order, from every rank's rows: ``table[r, 0]`` is rank r's
    ``input_splits``, ``table[r, 1]`` its ``output_splits``. Rank q expects
    ``table[q, 1, r]`` elements from rank r, which sends it ``table[r, 0, q]``."""
    sent = table[:, 0, :].T        # sent[q, r]: what rank r sends to rank q
    expected = table[:, 1, :]      # expected[q, r]: what rank q expects from rank r
    return [(int(q), int(r), int(expected[q, r]), int(sent[q, r]))
            for q, r in zip(*np.nonzero(sent != expected), strict=True)]


def splits_disagreement(table: np.ndarray) -> str | None:
    """The one-line error of ranks whose splits do not match (None when they do): the
    same text on every rank, since every rank reads the same rows."""
    pairs = split_mismatches(table)
    if not pairs:
        return None
    named = "; ".join(
        f"rank {q} expects {want} elements from rank {r} (output_splits[{r}]={want}), "
        f"which sends it {got} (input_splits[{q}]={got})"
        for q, r, want, got in pairs[:_NAMED_PAIRS])
    more = len(pairs) - _NAMED_PAIRS
    tail = f"; and {more} more pair{'s' if more > 1 else ''}" if more > 0 else ""
    return f"ranks disagree on all_to_all_v's splits: {named}{tail}"


def _deliver(call: HostCall, parts: list[tuple[int, np.ndarray]]) -> None:
    """Write each ``(byte offset, source)`` into the output, then meet the peers when
    they may still read an input: when the output is this rank's own input read in
    place by peers (``aliased``), only after they are done."""
    if call.aliased:
        parts = [(offset, source.copy()) for offset, source in parts]
        call.barrier()  # every peer has read our input, which the output overwrites
        for offset, source in parts:
            call.output[offset:offset + source.nbytes] = source
        return
    for offset, source in parts:
        call.output[offset:offset + source.nbytes] = source
    if call.hold_inputs:
        call.barrier()  # nobody still reads an input its owner may now overwrite


class HostAllToAll(Algorithm):
    """Pull: rank q copies block q of every rank's input (in that rank's window) into
    block r of its output, starting with the next rank so ranks spread their reads. One
    barrier (the path's); one more when some input is its user's own memory, and then an
    in-place output that is such an input is written after it."""

    name = "pull"
    op = "all_to_all"
    memory = "host"

    def run(self, call: HostCall) -> None:
        block = call.count * call.itemsize // call.size
        mine = call.rank * block
        parts = []
        for step in range(call.size):
            rank = (call.rank + step) % call.size
            parts.append((rank * block, call.inputs[rank][mine:mine + block]))
        _deliver(call, parts)


class HostAllToAllV(Algorithm):
    """Pull with per-call counts: every rank's split rows (``call.splits``) are checked
    against each other first, alike on every rank, so ranks that disagree all raise
    before any byte moves; then rank q copies from rank r's input the ``input_splits[q]``
    elements that follow the ones r sends to lower ranks, to the place in its output
    after what lower ranks sent it. Output elements past ``sum(output_splits)`` are left
    as they were. Barriers as ``HostAllToAll``.

    Raises:
        CollectiveError: the ranks' splits do not match (on every rank).
    """

    name = "pull"
    op = "all_to_all_v"
    memory = "host"

    def run(self, call: HostCall) -> None:
        table = call.splits
        assert table is not None
        problem = splits_disagreement(table)
        if problem is not None:
            raise CollectiveError(problem)
        me, itemsize = call.rank, call.itemsize
        received = table[me, 1]
        places = np.concatenate(([0], np.cumsum(received)[:-1])) * itemsize
        parts = []
        for step in range(call.size):
            rank = (me + step) % call.size
            start = int(table[rank, 0, :me].sum()) * itemsize
            nbytes = int(received[rank]) * itemsize
            parts.append((int(places[rank]), call.inputs[rank][start:start + nbytes]))
        _deliver(call, parts)
