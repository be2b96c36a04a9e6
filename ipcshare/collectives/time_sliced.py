"""Stepped calls on a time-sliced GPU: one context does the GPU work of every rank on it.

Without MPS the contexts of one GPU take turns in time slices. Measured with
``tools/probes/sharing/timeslice_probe.py`` on 1 x H100 (2026-11-24, docs/GPU.md): when a second
context runs a kernel or a copy in every round, each hand-over of the GPU costs about
140 µs; a context that only waits and writes with stream memory operations costs almost
nothing. So the stepped collectives run each rank's kernels and barriers in the context
of the lowest rank on its GPU (the leader); the other ranks there (its guests) only
describe their call and hand it over:

- a guest's stream: copy the input into staging area 0 if the leader cannot read it where
  it is; then, as one batch of stream memory operations, write the call's digest and
  where its input and output lie into its pad (``GUEST_CALL_SLOT``), set
  ``GUEST_READY_SLOT``, wait for ``GUEST_DONE_SLOT`` and clear it; then, if the leader
  could not write the output in place, copy it out of result area 0 with a kernel that
  copies only where the leader's work kernel did the call (``GUEST_RESULT_SLOT``): a
  copy-engine copy would run whatever happened, and a call that failed, for instance
  one a rank refused, must leave the output as it was;
- the leader's stream: wait for every guest's READY and clear it, the staging kernel for
  itself and for each guest, the first flag barrier for all of them, the work kernel for
  all, the second flag barrier for all, then set every guest's DONE. The barriers meet
  only the ranks of other GPUs: the ranks of this one are in order on this stream.

A call the guest's own checks refused (call_marks.py) is handed over like any other, with
its mark where the digest goes and its own staging and result areas as its places, and no
copy either way (``place_refused_call``): the leader's kernels find the mark in that
guest's row as they find any digest that differs, move no element, and record it for every
rank. A leader that refused runs its steps for itself and its guests with its own argument
block marked; its guests' rows keep their own digests, so they too find the mark.

The leader reaches a guest's input and output where it has them mapped: the guest's
window (arrays from ``Communicator.empty``, or the staging and result areas), registered
arrays (``Communicator.register``), and the guest's other allocations once handed over
(collectives/guest_imports.py: from about the third call on the same memory). Until then
a call costs the guest a copy, and so a hand-over of the GPU. The words are fixed per
call, so graphs of either side replay correctly.

Ordering: a guest describes its next call only after DONE, which the leader sets after
the second barrier (every rank is done with this call's inputs and outputs); the leader
clears READY before it sets DONE, and a guest clears DONE before it sets READY again, so
neither word is ever cleared over a newer store.
"""

from __future__ import annotations

import ctypes
import dataclasses
from collections.abc import Callable
from typing import Any

from ..window.layout import (
    FLAG_BARRIER_RANKS,
    FLAG_BARRIER_SLOT_BASE,
    GUEST_CALL_SLOT,
    GUEST_DIGEST,
    GUEST_DONE_SLOT,
    GUEST_IMPORTED,
    GUEST_INPUT,
    GUEST_LEADER_STAGES,
    GUEST_OFFSET_SHIFT,
    GUEST_OUTPUT,
    GUEST_READY_SLOT,
    GUEST_REGISTERED,
    GUEST_RESULT_SLOT,
    GUEST_ROW_SHIFT,
)

__all__ = ["COPY_OUT_ENTRY", "GuestPlacement", "TimeSlicedRole", "gpu_leaders", "pack_place",
           "place_guest_call", "place_refused_call"]

Sink = Callable[[Callable[[], None]], None]  # runs a step now, or records it (bind)

# The kernel a guest copies its result out of result area 0 with (stepped.cuh), and the
# bytes each of its blocks copies.
COPY_OUT_ENTRY = "guest_copy_out_bytes"
_COPY_OUT_BYTES_PER_BLOCK = 64 << 10


def gpu_leaders(time_sliced: dict[Any, list[int]]) -> dict[int, int]:
    """Every rank on a time-sliced GPU, mapped to the lowest rank on that GPU."""
    return {rank: min(ranks) for ranks in time_sliced.values() for rank in ranks}


@dataclasses.dataclass(frozen=True)
class GuestPlacement:
    """Where a guest's call lies for its leader (the words it writes: flags, offset and
    registration row of the input and of the output), and which copies the guest makes
    itself: the input into staging area 0 (``copy_in``), the output out of result area 0
    (``copy_out``)."""

    input_flags: int
    input_offset: int
    input_row: int
    output_flags: int
    output_offset: int
    output_row: int
    copy_in: bool
    copy_out: bool

    @property
    def copies_input(self) -> bool:
        """Whether the call copies the input (the guest itself, or the leader staging it)."""
        return self.copy_in or bool(self.input_flags & GUEST_LEADER_STAGES)

    def words(self, digest: int) -> dict[int, int]:
        """The call's words by ``GUEST_*`` index: the digest and the two places."""
        return {GUEST_DIGEST: digest,
                GUEST_INPUT: pack_place(self.input_flags, self.input_offset, self.input_row),
                GUEST_OUTPUT: pack_place(self.output_flags, self.output_offset,
                                         self.output_row)}


def pack_place(flags: int, offset: int, row: int) -> int:
    """One word for a place (what guest_place in kernels/src/collectives/stepped.cuh reads back).

    Raises:
        ValueError: a row or offset the word cannot hold.
    """
    if not 0 <= row < 1 << (GUEST_OFFSET_SHIFT - GUEST_ROW_SHIFT):
        raise ValueError(f"registration row {row} does not fit a place word")
    if not 0 <= offset < 1 << (64 - GUEST_OFFSET_SHIFT):
        raise ValueError(f"offset {offset} does not fit a place word")
    return offset << GUEST_OFFSET_SHIFT | row << GUEST_ROW_SHIFT | flags


# (flags: GUEST_REGISTERED, GUEST_IMPORTED or 0; offset or the leader's address; row)
Location = tuple[int, int, int]


def place_guest_call(input_at: Location | None, output_at: Location | None, *,
                     may_alias: bool, staging_offset: int,
                     result_offset: int) -> GuestPlacement:
    """The placement of a guest's call whose input and output the leader can reach at
    ``input_at`` / ``output_at`` (None: it cannot, the array is the user's own memory).
    ``may_alias``: peers may read the input where it lies (else, in place, the leader
    stages it first; an imported input it always stages, as only the leader maps it).
    ``staging_offset`` / ``result_offset``: of areas 0 in the window."""
    if input_at is None:
        input_flags, input_offset, input_row, copy_in = 0, staging_offset, 0, True
    else:
        input_flags, input_offset, input_row = input_at
        copy_in = False
        if not may_alias or input_flags & GUEST_IMPORTED:
            input_flags |= GUEST_LEADER_STAGES
    if output_at is None:
        output_flags, output_offset, output_row, copy_out = 0, result_offset, 0, True
    else:
        (output_flags, output_offset, output_row), copy_out = output_at, False
    return GuestPlacement(input_flags, input_offset, input_row, output_flags, output_offset,
                          output_row, copy_in, copy_out)


def place_refused_call(*, staging_offset: int, result_offset: int) -> GuestPlacement:
    """The placement of a call that the guest's own checks refused: its staging and result
    areas 0 (``staging_offset`` / ``result_offset``, in its window, which the leader
    reaches) and no copy of the user's memory either way. Its mark fails every digest
    comparison, so no kernel stages, reads or writes either area."""
    return GuestPlacement(0, staging_offset, 0, 0, result_offset, 0, copy_in=False,
                          copy_out=False)


class TimeSlicedRole:
    """This rank's part in stepped calls when its GPU is time-sliced: the leader, or a
    guest of ``leader``. ``of(path, channel)`` is None for a rank with a GPU of its own,
    under MPS, or where 64-bit stream memory operations are missing (the call's words
    are). ``imports``: the guest's allocations its leader maps, or for the leader those
    of its guests (guest_imports.py; None without a channel)."""

    def __init__(self, path: Any, leader: int, guests: list[int], imports: Any = None) -> None:
        self.path = path
        self.leader = leader
        self.guests = guests
        self.guest = path.rank != leader
        self.imports = imports

    @classmethod
    def of(cls, path: Any, channel: Any = None) -> TimeSlicedRole | None:
        group = path.group
        if group.world.node_count != 1 or not path.window.engine.wide_signals:
            return None
        leaders = gpu_leaders(group.time_sliced_gpus)
        leader = leaders.get(path.rank)
        if leader is None:
            return None
        guests = sorted(rank for rank, lead in leaders.items()
                        if lead == leader and rank != leader)
        imports = None
        if channel is not None:
            imports = (_guest_imports(path, channel, leader) if path.rank != leader
                       else _leader_imports(path, channel))
        return cls(path, leader, guests, imports)

    # -- the guest's side --------------------------------------------------------------
    def locate(self, ptr: int, nbytes: int, may_post: Callable[[], bool]) -> Location | None:
        """Where the leader reaches ``nbytes`` of this rank's memory at ``ptr``: in its
        window, in a registered array with a row of the registrations table, or in an
        allocation the leader imported (``may_post()``: a new one may be handed over)."""
        path = self.path
        if nbytes <= 0:
            return None
        offset = ptr - path.window.local.ptr
        if path.layout.in_heap(offset, nbytes):
            return (0, offset, 0)
        row = path.registered_row(ptr, nbytes)
        if row is not None:
            return (GUEST_REGISTERED, row[1], row[0])
        if self.imports is None:
            return None
        address = self.imports.address(ptr, nbytes, may_post=may_post)
        return None if address is None else (GUEST_IMPORTED, address, 0)

    def place(self, signature: Any, algorithm: Any, input_ref: Any, output_ref: Any,
              in_place: bool, may_post: Callable[[], bool]) -> GuestPlacement:
        layout = self.path.layout
        return place_guest_call(
            self.locate(input_ref.ptr, signature.nbytes, may_post),
            self.locate(output_ref.ptr, output_ref.nbytes, may_post),
            may_alias=not in_place or algorithm.aliasing_safe,
            staging_offset=layout.staging_offset(0), result_offset=layout.result_offset(0))

    def place_refused(self) -> GuestPlacement:
        """The placement of a call this guest's checks refused (``place_refused_call``)."""
        layout = self.path.layout
        return place_refused_call(staging_offset=layout.staging_offset(0),
                                  result_offset=layout.result_offset(0))

    def guest_steps(self, engine: Any, sink: Sink) -> GuestSteps:
        return GuestSteps(self, engine, sink)

    # -- the leader's side -------------------------------------------------------------
    def leader_steps(self, engine: Any, args: Any, launch_own: Callable[[str, int], None],
                     sink: Sink) -> LeaderSteps:
        return LeaderSteps(self, engine, args, launch_own, sink)

    def serve(self, may_map: Callable[[], bool]) -> None:
        """The leader, at one of its calls: map what its guests handed over since."""
        if self.imports is not None and not self.guest:
            self.imports.serve(may_map)

    def close(self) -> None:
        """Drop (guest) or unmap (leader) the imports; after the window is closed, so no
        kernel of the node still reads them (idempotent)."""
        imports, self.imports = self.imports, None
        if imports is not None:
            imports.close()


def _guest_imports(path: Any, channel: Any, leader: int) -> Any:
    from ..backends.device_existing import allocation_buffer_id, allocation_range
    from .guest_imports import GuestImports

    backend = path.group.backend

    def export(base: int, size: int) -> tuple[bytes, Any]:
        exported, _offset = backend.share_existing(base, size)
        return exported.payload, exported.fd

    return GuestImports(channel, leader, buffer_id=allocation_buffer_id,
                        address_range=allocation_range, export=export)


def _leader_imports(path: Any, channel: Any) -> Any:
    from ..exchange.pidfd import fetch_fd
    from .guest_imports import LeaderImports

    group = path.group
    exchange, pids = group.exchange, group.world.pids

    def take_fd(guest: int, number: int) -> Any:
        # A pid means the guest's process only where the ranks share a PID namespace.
        separated = exchange.pid_namespace_layout()
        if exchange.fd_path == "socket" or separated:
            raise ValueError("its cuMem descriptor would need a socket hand-over per "
                             f"allocation ({separated or 'descriptors travel by socket here'})")
        return fetch_fd(pids[guest], number)

    return LeaderImports(channel, open_allocation=group.backend.open_existing, fetch_fd=take_fd)


class GuestSteps:
    """A guest's call: described, handed to the leader, taken back. Set ``placement``,
    ``digest``, ``input`` and ``output`` (``(ptr, bytes)``) before each ``hand_over``."""

    guest = True

    def __init__(self, role: TimeSlicedRole, engine: Any, sink: Sink) -> None:
        path = role.path
        self._path, self._engine, self._sink = path, engine, sink
        self._pad = path.window.signal_pad(path.rank)
        self._timeout = path.group.signal_timeout
        self._what = (f"rank {path.rank} waiting for rank {role.leader}, which runs its "
                      "collective calls on the GPU they share, to finish one")
        # One batch of stream memory operations per distinct call: eager calls on the
        # same arrays reuse theirs.
        self._batches: dict[tuple, Callable[[], None]] = {}
        self._copies_out: dict[tuple[int, int, int], Callable[[], None]] = {}
        self.placement: GuestPlacement | None = None
        self.digest = 0
        self.input: tuple[int, int] = (0, 0)
        self.output: tuple[int, int] = (0, 0)

    def _hand_over_batch(self, words: dict[int, int]) -> Callable[[], None]:
        """Describe the call (and clear the word where the leader says it did it), set
        READY, wait for DONE and clear it: one stream operation."""
        key = tuple(sorted(words.items()))
        found = self._batches.get(key)
        if found is None:
            pad = self._pad
            steps = [("write", pad, GUEST_CALL_SLOT + index, word)
                     for index, word in sorted(words.items())]
            steps += [("write", pad, GUEST_RESULT_SLOT, 0),
                      ("write", pad, GUEST_READY_SLOT, 1),
                      ("wait", pad, GUEST_DONE_SLOT, 1, self._what),
                      ("write", pad, GUEST_DONE_SLOT, 0)]
            if len(self._batches) >= 64:
                self._batches.clear()
            found = self._batches[key] = self._engine.make_signal_batch(
                steps, timeout=self._timeout)
        return found

    def hand_over(self) -> None:
        placement, sink, base = self.placement, self._sink, self._path.window.local.ptr
        if placement.copy_in and self.input[1]:
            ptr, nbytes = self.input
            sink(self._path.copier(self._engine,
                                   [(base + placement.input_offset, ptr, nbytes)]))
        sink(self._hand_over_batch(placement.words(self.digest)))
        if placement.copy_out and self.output[1]:
            sink(self._copy_out(*self.output, placement.output_offset))

    def _copy_out(self, ptr: int, nbytes: int, offset: int) -> Callable[[], None]:
        """A launch of ``COPY_OUT_ENTRY`` on this stream: ``nbytes`` from ``offset`` of
        the window (result area 0) to ``ptr``, where the leader's work kernel did the
        call (it reads GUEST_RESULT_SLOT); one argument block per distinct output."""
        key = (ptr, nbytes, offset)
        found = self._copies_out.get(key)
        if found is None:
            from ..kernels.launcher import CollectiveArgs
            from .algorithms.gpu_kernel import MAX_BLOCKS

            path, me = self._path, self._path.rank
            args = CollectiveArgs()
            args.windows[me], args.pads[me] = path.window.local.ptr, self._pad.ptr
            args.rank, args.nranks = me, path.size
            args.result_offset[0] = args.result_offset[1] = offset
            args.output, args.count = ptr, nbytes
            params = (ctypes.c_void_p * 1)(ctypes.addressof(args))
            blocks = max(1, min(MAX_BLOCKS, -(-nbytes // _COPY_OUT_BYTES_PER_BLOCK)))
            launch, stream, address = path.launch, self._engine.stream, ctypes.addressof(params)

            def found() -> None:
                launch(COPY_OUT_ENTRY, blocks, stream, address)
            found.keep = (args, params)  # must outlive every launch
            if len(self._copies_out) >= 64:
                self._copies_out.clear()
            self._copies_out[key] = found
        return found


class LeaderSteps:
    """The leader's call steps for itself and its guests, made once per signature and
    stream: one launch of each kernel for every party (a row of blocks per guest, which
    the kernel finds by ``guest_mask``: as_party in kernels/src/collectives/stepped.cuh),
    the flag barriers for every party, and the READY / DONE words."""

    guest = False

    def __init__(self, role: TimeSlicedRole, engine: Any, args: Any,
                 launch_own: Callable[..., None], sink: Sink) -> None:
        path = role.path
        window, me, size = path.window, path.rank, path.size
        timeout = path.group.signal_timeout
        self._launch_own, self._sink = launch_own, sink
        args.guest_mask = sum(1 << guest for guest in role.guests)
        self._parties = 1 + len(role.guests)
        pads = {guest: window.signal_pad(guest) for guest in role.guests}
        self._take = engine.make_signal_batch(
            [step for guest in role.guests for step in (
                ("wait", pads[guest], GUEST_READY_SLOT, 1,
                 f"rank {me} waiting for rank {guest}, which shares its GPU, to hand over "
                 "its collective call"),
                ("write", pads[guest], GUEST_READY_SLOT, 0))], timeout=timeout)
        self._release = engine.make_signal_batch(
            [("write", pads[guest], GUEST_DONE_SLOT, 1) for guest in role.guests],
            timeout=timeout)
        # The ranks of this GPU meet in this stream's order: the barriers are only with
        # the ranks of other GPUs, for every party of this one (none: no barrier at all).
        parties = [me, *role.guests]
        others = [r for r in range(size) if r not in parties]

        def what_for(party: int) -> Callable[[int], str]:
            who = f"rank {me}" if party == me else f"rank {me} (for rank {party})"
            return lambda slot: (f"{who} in a collective call's stream barrier waiting for "
                                 f"rank {slot % FLAG_BARRIER_RANKS}")
        self._meetings = tuple(
            engine.make_party_flag_barrier(
                [(window.signal_pad(party), [window.signal_pad(r) for r in others],
                  base + party, [base + r for r in others], what_for(party))
                 for party in parties], timeout=timeout) if others else None
            for base in (FLAG_BARRIER_SLOT_BASE, FLAG_BARRIER_SLOT_BASE + FLAG_BARRIER_RANKS))

    def take_guests(self) -> None:
        self._sink(self._take)

    def launch(self, entry: str, blocks: int) -> None:
        """The kernel ``entry`` for this rank and every guest, in one launch."""
        self._launch_own(entry, blocks, self._parties)

    def meet(self, turn: int) -> None:
        if self._meetings[turn] is not None:
            self._sink(self._meetings[turn])

    def release_guests(self) -> None:
        self._sink(self._release)
