"""How a call runs on host memory: the input placed where peers read it (copied into
the staging area, or in place when it lies in the heap), the call's header published in
the pad, one barrier, the headers compared, then the algorithm."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..backends.host import HostBuffer
from ..runtime.errors import SignalTimeout
from ..window.layout import (
    FLAG_REGISTERED,
    FLAG_ZERO_COPY,
    HEADER_DIGEST,
    HEADER_FLAGS,
    HEADER_INPUT,
    HEADER_REGISTRATION,
    HEADER_WORDS,
)
from .agreement import Signature, disagreement_error
from .algorithms import Algorithm, HostCall
from .arrays import ArrayRef
from .call_guard import CallGuard
from .call_marks import ArgumentProblem, encode_mark, is_mark, refused_error
from .reduction import Reducer
from .scratch import ScratchLayout

__all__ = ["HostPath"]


class _HeapBlock:
    """The owner of one ``empty()`` array's memory: numpy makes it the base of the array
    and of every view of it, so the block goes back to the heap when the last of them
    does. It holds the window's buffer, so the mapping outlives a closed communicator
    for as long as the arrays do."""

    __slots__ = ("_buffer", "__weakref__")

    def __init__(self, buffer: Any) -> None:
        self._buffer = buffer

    @property
    def __array_interface__(self) -> dict:
        return {"shape": (self._buffer.nbytes,), "typestr": "|u1",
                "data": (self._buffer.ptr, False), "version": 3}


class HostPath:
    """Calls on host shared memory over the group's window of ``layout.total_bytes``
    (collective: creating it creates the window).

    Why the scratch can be reused by the next call without an extra barrier: a rank
    writes into its window (staging copy, header) only for the call it is in; the
    staging areas, result areas and headers alternate between calls (parity), and a rank
    can be at most one call ahead of the slowest peer, since every call's entry barrier
    waits for all. So the area a rank writes is never one a peer still reads. What
    alternation cannot cover is the user's own memory (an input from the heap, which
    the user may overwrite once the call returns): the header says so, and algorithms
    then end with a barrier after the last read of an input.
    """

    memory = "host"

    def __init__(self, group: Any, layout: ScratchLayout, guard: CallGuard) -> None:
        self.group = group
        self.layout = layout
        self._guard = guard
        self.window = group.window(layout.total_bytes)
        window = self.window
        self.rank, self.size = window.rank, window.world_size
        self._local_ptr = window.local.ptr
        self._bytes = [np.asarray(window.peer(r)) for r in range(self.size)]
        self._pads = [np.asarray(window.signal_pad(r)).view(np.uint64) for r in range(self.size)]
        self._results = [[view[layout.result_offset(p):][:layout.result_bytes]
                          for view in self._bytes] for p in (0, 1)]
        # Every rank's all-to-all-v split rows of each parity: [input_splits, output_splits].
        self._split_rows = [[view[layout.splits_offset(p):][:16 * self.size].view(np.int64)
                             .reshape(2, self.size) for view in self._bytes] for p in (0, 1)]
        self._calls = 0
        self._reducers: dict[tuple[str, str], Reducer] = {}
        # Calls whose input was copied into the staging area (heap and registered
        # inputs are not).
        self.copies_in = 0
        # The communicator's registered arrays (set by it): inputs read in place.
        self.registry: Any = None

    @staticmethod
    def local_buffer(ref: ArrayRef) -> HostBuffer:
        """A buffer of this rank's own registered array."""
        return HostBuffer(memoryview(ref.bytes()), ref.ptr)

    def registered(self, registration: Any) -> None:
        """Registry's hook: nothing to do, host calls find registrations by number."""

    def unregistered(self, registration: Any) -> None:
        """Registry's hook: nothing to do."""

    def heap_array(self, offset: int, dims: tuple[int, ...], dtype: np.dtype
                   ) -> tuple[np.ndarray, Any]:
        """An array of ``dims`` and ``dtype`` at ``offset`` of this rank's window, and the
        block object that owns its memory (``weakref.finalize`` on it frees the block
        once the array and every view are gone)."""
        nbytes = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
        raw = np.asarray(_HeapBlock(self.window.local.slice(offset, nbytes)))
        return raw.view(dtype).reshape(dims), raw.base

    def run(self, signature: Signature, algorithm: Algorithm, input_ref: ArrayRef,
            output_ref: ArrayRef, *, in_place: bool, splits: np.ndarray | None = None) -> None:
        """Collective: run one call (arrays already validated on this rank). ``splits``
        (all-to-all-v): this rank's ``[input_splits, output_splits]``, validated, as an
        int64 array of shape (2, size); they are published for the peers with the header.

        Raises:
            CollectiveError: the ranks' signatures differ (on every rank); an earlier call
                failed on this rank, or another thread is in a call (call_guard.py).
            SignalTimeout / PeerDied: a peer did not come or died (the communicator then
                takes no more calls).
        """
        self._guarded(signature.describe, lambda: self._run(
            signature, algorithm, input_ref, output_ref, in_place=in_place, splits=splits))

    def refused_call(self, call: str, problem: ArgumentProblem, guess: Any = None, *,
                     stream: Any = None):
        """A call of ``call`` that this rank's checks refused (``problem``), as a
        function of no arguments that takes part in it with a mark: it publishes the
        mark where the header's digest goes, meets the peers and raises the error every
        rank raises in that call (``guess`` and ``stream``: GPU only).

        Raises (when called):
            CollectiveError: naming every refusing rank, its argument and what its check
                said; as ``run`` otherwise.
        """
        mark = encode_mark(self.rank, problem.argument, call)

        def refused() -> None:
            self._guarded(lambda: f"{call} (refused on rank {self.rank})",
                          lambda: self._meet(mark, 0, 0, None, lambda: problem.detail))
        return refused

    def _guarded(self, describe: Any, run: Any) -> None:
        """``run()`` as one call of this communicator: one at a time, and none after one
        failed (call_guard.py); ``describe()`` names the call in a timeout's error."""
        self._guard.enter()
        try:
            run()
        except SignalTimeout as exc:   # say which call waited, not only which barrier
            error = SignalTimeout(f"{describe()}: {exc}")
            self._guard.leave(error)
            raise error from exc
        except BaseException as exc:
            self._guard.leave(exc)
            raise
        self._guard.leave(None)

    def _run(self, signature: Signature, algorithm: Algorithm, input_ref: ArrayRef,
             output_ref: ArrayRef, *, in_place: bool, splits: np.ndarray | None) -> None:
        layout, parity = self.layout, self._calls & 1
        digest = signature.digest
        # What peers read of the input: all of it, or (all-to-all-v) what it sends.
        nbytes = (signature.nbytes if splits is None
                  else int(splits[0].sum()) * signature.itemsize)
        placed = input_ref.nbytes
        offset = input_ref.ptr - self._local_ptr
        zero_copy = layout.in_heap(offset, placed)
        flags = FLAG_ZERO_COPY if zero_copy else 0
        registration = (None if zero_copy or not placed or self.registry is None
                        else self.registry.find(input_ref.ptr, placed))
        if registration is not None:
            zero_copy, flags = True, FLAG_ZERO_COPY | FLAG_REGISTERED
            offset = input_ref.ptr - registration.ptr
        elif not zero_copy:
            offset = layout.staging_offset(parity)
            self._bytes[self.rank][offset:offset + nbytes] = input_ref.bytes()[:nbytes]
            self.copies_in += 1
        if splits is not None:
            self._split_rows[parity][self.rank][:] = splits
        headers = self._meet(digest, offset, flags, registration, signature.describe)
        sizes = [nbytes] * self.size
        table = None
        if splits is not None:
            # Each owner checked its rows against its input, so the sizes fit the inputs.
            table = np.array(self._split_rows[parity])
            sizes = [int(sent) * signature.itemsize for sent in table[:, 0, :].sum(axis=1)]
        reducer = None
        if signature.redop is not None:
            key = (signature.dtype, signature.redop)
            reducer = self._reducers.get(key)
            if reducer is None:
                reducer = self._reducers[key] = Reducer(*key)
        algorithm.run(HostCall(
            rank=self.rank, size=self.size, count=signature.count, itemsize=signature.itemsize,
            inputs=[self._input_view(rank, header, sizes[rank])
                    for rank, header in enumerate(headers)],
            output=output_ref.bytes(), results=self._results[parity], reducer=reducer,
            in_place=in_place, aliased=in_place and zero_copy,
            hold_inputs=any(header[HEADER_FLAGS] & FLAG_ZERO_COPY for header in headers),
            barrier=self.window.barrier, splits=table))

    def _meet(self, digest: int, offset: int, flags: int, registration: Any,
              describe: Any) -> list[list[int]]:
        """Publish this rank's header of the call (``digest``: its signature's, or the
        mark of a call this rank refused), meet every peer and return every rank's
        header, once they all carry the same digest (``describe()``: what this rank
        calls, or why it refused, for the error when they do not).

        Raises:
            CollectiveError: some rank refused the call (naming each and why) or the
                ranks' signatures differ; on every rank, which all see the same headers.
        """
        slot = self.layout.header_slot(self._calls & 1)
        pad = self._pads[self.rank]
        pad[slot + HEADER_DIGEST] = digest
        pad[slot + HEADER_INPUT] = offset
        pad[slot + HEADER_FLAGS] = flags
        pad[slot + HEADER_REGISTRATION] = 0 if registration is None else registration.index
        self._calls += 1
        self.window.barrier()  # every input and header in place
        headers = [[int(word) for word in peer[slot:slot + HEADER_WORDS]] for peer in self._pads]
        # A rank alone has only its own mark to compare with: a mark is never a match.
        marks = [header[HEADER_DIGEST] for header in headers if is_mark(header[HEADER_DIGEST])]
        if not marks and all(header[HEADER_DIGEST] == digest for header in headers):
            return headers
        # Every rank sees the same headers, so every rank comes here and meets once more
        # (an error path only): what each rank called, or why it refused.
        notes = self.group.collective("collective call", describe())
        if marks:
            raise refused_error(marks, notes)
        raise disagreement_error(notes)

    def bind_call(self, signature: Signature, algorithm: Algorithm, input_ref: ArrayRef,
                  output_ref: ArrayRef, *, in_place: bool, stream: Any = None,
                  splits: np.ndarray | None = None):
        """The call as a function of no arguments (``Communicator.bind``): host calls
        finish before they return, so binding saves the checks only."""
        run = self.run

        def call() -> None:
            run(signature, algorithm, input_ref, output_ref, in_place=in_place, splits=splits)
        return call

    def _input_view(self, rank: int, header: list[int], nbytes: int) -> np.ndarray:
        """Rank ``rank``'s input of this call, as this rank reads it: in its window, or
        in its registered array mapped here (the registration numbered alike on every
        rank)."""
        offset = header[HEADER_INPUT]
        if header[HEADER_FLAGS] & FLAG_REGISTERED:
            view = np.asarray(self.registry.by_index(header[HEADER_REGISTRATION]).peer(rank))
        else:
            view = self._bytes[rank]
        return view[offset:offset + nbytes]

    def close(self) -> None:
        """Close the window (collective over the node; idempotent)."""
        self._bytes, self._pads, self._results = [], [], [[], []]
        self._split_rows = [[], []]
        self.window.close()
