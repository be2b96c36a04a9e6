"""The interface every collective algorithm fills in, and what a host algorithm is given.

An algorithm is a function over buffers: the path that runs calls on a kind of memory
(host now, GPUs later) validates the arrays, places the input where peers can read it,
publishes and checks each call's header and enters the first barrier; the algorithm
then moves and reduces bytes, and returns once this rank's output is complete and no
peer can still need anything this rank must leave untouched.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from ..reduction import Reducer

__all__ = ["Algorithm", "HostCall"]


class Algorithm(abc.ABC):
    """One way to run one collective (``op``: ``all_gather``, ``all_reduce``,
    ``reduce_scatter``, ``all_to_all`` or ``all_to_all_v``) on one kind of memory
    (``memory``: ``host`` or ``cuda``), called ``name`` by ``algo=``. Stateless: one
    instance serves every call of a path."""

    name: ClassVar[str] = ""
    op: ClassVar[str] = ""
    memory: ClassVar[str] = ""

    def unsupported(self, call: Any) -> str | None:
        """Why this algorithm cannot run ``call`` (e.g. too many ranks for a kernel), or
        None. Asked before anything collective happens; the answer must be the same on
        every rank for the same signature."""
        return None

    @abc.abstractmethod
    def run(self, call: Any) -> None:
        """Run ``call`` (a ``HostCall`` on host memory) after the entry barrier."""


# Not frozen: a frozen dataclass sets each field through object.__setattr__, and one is
# built per call.
@dataclasses.dataclass(eq=False, slots=True)
class HostCall:
    """One call on host memory, as a host algorithm sees it after the entry barrier
    (every rank's input is in place and visible).

    ``inputs[r]`` is rank r's input (uint8, in rank r's window, read in place);
    ``output`` is this rank's output (uint8; the user's array or a heap block);
    ``results[r]`` is rank r's result area of this call's parity (two-shot);
    ``count`` the input's elements and ``itemsize`` their size; ``reducer`` reduces
    (None for all-gather); ``in_place`` says the input is this rank's part of the output
    (or the output itself for all-reduce); ``aliased`` that, besides, that memory is read
    by peers (a zero-copy input written in place: write it only once they are done);
    ``hold_inputs`` that some rank's input is its user's own memory, so no rank may
    return while a peer may still read an input (the user may write it next);
    ``splits`` (all-to-all-v only) every rank's split rows as published for this call,
    an int64 array of shape ``(size, 2, size)``: ``splits[r, 0]`` rank r's
    ``input_splits``, ``splits[r, 1]`` its ``output_splits`` (``inputs[r]`` then holds
    ``sum(splits[r, 0])`` elements, and ``count`` is 0).
    """

    rank: int
    size: int
    count: int
    itemsize: int
    inputs: list[np.ndarray]
    output: np.ndarray
    results: list[np.ndarray]
    reducer: Reducer | None
    in_place: bool
    aliased: bool
    hold_inputs: bool
    barrier: Callable[[], None]
    splits: np.ndarray | None = None
