"""Stepped calls on a time-sliced GPU (collectives/time_sliced.py): who runs whose call,
where a guest's call lies for its leader, and the order of the steps on each side."""

from __future__ import annotations

import numpy as np
import pytest

from ipcshare.collectives.agreement import Signature
from ipcshare.collectives.algorithms import algorithm
from ipcshare.collectives.algorithms.gpu_kernel import GpuCall
from ipcshare.collectives.time_sliced import gpu_leaders, pack_place, place_guest_call
from ipcshare.window import layout

STAGING, RESULT = 4096, 8192


def test_the_lowest_rank_of_each_time_sliced_gpu_leads_it():
    leaders = gpu_leaders({"GPU-a": [0, 4], "GPU-b": [3, 1, 5]})
    assert leaders == {0: 0, 4: 0, 1: 1, 3: 1, 5: 1}
    assert gpu_leaders({}) == {}


def test_arrays_the_leader_reaches_are_used_where_they_lie():
    heap_in, heap_out = (0, 256, 0), (0, 1024, 0)
    placement = place_guest_call(heap_in, heap_out, may_alias=True, staging_offset=STAGING,
                                 result_offset=RESULT)
    assert not placement.copy_in and not placement.copy_out and not placement.copies_input
    assert placement.words(0xABC) == {layout.GUEST_DIGEST: 0xABC,
                                      layout.GUEST_INPUT: 256 << layout.GUEST_OFFSET_SHIFT,
                                      layout.GUEST_OUTPUT: 1024 << layout.GUEST_OFFSET_SHIFT}
    registered = (layout.GUEST_REGISTERED, 64, 3)
    placement = place_guest_call(registered, registered, may_alias=True,
                                 staging_offset=STAGING, result_offset=RESULT)
    assert placement.words(1)[layout.GUEST_INPUT] == pack_place(layout.GUEST_REGISTERED, 64, 3)


def test_an_input_peers_may_not_read_in_place_is_staged_by_the_leader():
    """In place with an algorithm whose output may not alias a read input: the leader
    copies the input into the guest's staging area first (no copy by the guest)."""
    placement = place_guest_call((layout.GUEST_REGISTERED, 0, 2), (layout.GUEST_REGISTERED, 0, 2),
                                 may_alias=False, staging_offset=STAGING, result_offset=RESULT)
    assert placement.input_flags == layout.GUEST_REGISTERED | layout.GUEST_LEADER_STAGES
    assert not placement.copy_in and not placement.copy_out
    assert placement.copies_input  # counted as a copy in, like the kernel's own staging


def test_the_users_own_memory_costs_the_guest_a_copy_each_way():
    placement = place_guest_call(None, None, may_alias=True, staging_offset=STAGING,
                                 result_offset=RESULT)
    assert placement.copy_in and placement.copy_out and placement.copies_input
    assert (placement.input_flags, placement.input_offset) == (0, STAGING)
    assert (placement.output_flags, placement.output_offset) == (0, RESULT)
    # An input in the heap and an output of the user's: only the way back is copied.
    placement = place_guest_call((0, 512, 0), None, may_alias=True, staging_offset=STAGING,
                                 result_offset=RESULT)
    assert not placement.copy_in and placement.copy_out


def test_the_guest_words_lie_in_the_user_region_apart_from_the_headers():
    from ipcshare.kernels.launcher import MAX_KERNEL_RANKS

    words = set(range(layout.GUEST_CALL_SLOT, layout.GUEST_CALL_SLOT + layout.GUEST_CALL_WORDS))
    words |= {layout.GUEST_READY_SLOT, layout.GUEST_DONE_SLOT, layout.GUEST_RESULT_SLOT}
    taken = {layout.USER_SLOT_BASE + w for w in range(2 * layout.HEADER_WORDS)}
    taken |= {layout.LL_CLEANED_SLOT, layout.LL_CLEANED_SLOT + 1}
    taken |= set(range(layout.DISAGREEMENT_DIGESTS_SLOT,
                       layout.DISAGREEMENT_DIGESTS_SLOT + MAX_KERNEL_RANKS))
    assert len(words) == layout.GUEST_CALL_WORDS + 3 and not words & taken
    assert layout.USER_SLOT_BASE <= min(words) and max(words) < layout.ERROR_SLOT
    fields = [layout.GUEST_DIGEST, layout.GUEST_INPUT, layout.GUEST_OUTPUT]
    assert fields == list(range(layout.GUEST_CALL_WORDS))


def _unpack(place: int) -> tuple[int, int, int]:
    """What stepped.cuh's guest_place and guest_row read from a place word."""
    row_bits = layout.GUEST_OFFSET_SHIFT - layout.GUEST_ROW_SHIFT
    return (place & ((1 << layout.GUEST_ROW_SHIFT) - 1), place >> layout.GUEST_OFFSET_SHIFT,
            (place >> layout.GUEST_ROW_SHIFT) & ((1 << row_bits) - 1))


@pytest.mark.parametrize("flags", [0, layout.GUEST_REGISTERED, layout.GUEST_LEADER_STAGES,
                                   layout.GUEST_REGISTERED | layout.GUEST_LEADER_STAGES,
                                   layout.GUEST_IMPORTED | layout.GUEST_LEADER_STAGES])
def test_a_place_word_holds_flags_row_and_offset_apart(flags):
    from ipcshare.collectives.gpu_path import REGISTRATION_ROWS

    widest = 1 << (64 - layout.GUEST_OFFSET_SHIFT)
    # An imported place holds the leader's address: 57-bit virtual addresses fit.
    assert widest >= 1 << 55
    for offset in (0, 1, 4096, (1 << 40) + 17, (1 << 47) + 0x7F00_0000, widest - 1):
        for row in (0, 1, REGISTRATION_ROWS - 1):
            assert _unpack(pack_place(flags, offset, row)) == (flags, offset, row)
    with pytest.raises(ValueError, match="row 64"):
        pack_place(flags, 0, REGISTRATION_ROWS)
    with pytest.raises(ValueError, match="offset"):
        pack_place(flags, widest, 0)


class _Steps:
    """Records what the stepped algorithm asks of a time-sliced role."""

    def __init__(self, guest: bool, log: list) -> None:
        self.guest, self.log = guest, log

    def hand_over(self) -> None:
        self.log.append("hand over")

    def take_guests(self) -> None:
        self.log.append("take guests")

    def launch(self, entry: str, blocks: int) -> None:
        self.log.append(entry)

    def meet(self, turn: int) -> None:
        self.log.append(f"meet {turn}")

    def release_guests(self) -> None:
        self.log.append("release guests")


def _run(op: str, dtype: str, guest: bool) -> tuple[list, list]:
    itemsize = 1 if op == "all_gather" else np.dtype(dtype).itemsize
    signature = Signature(op, 1 << 16, dtype, itemsize, None if op == "all_gather" else "sum",
                          "stepped")
    own: list = []
    steps: list = []
    call = GpuCall(signature, 3, lambda entry, blocks: own.append(entry),
                   meet=lambda turn: own.append(f"meet {turn}"),
                   time_sliced=_Steps(guest, steps))
    algorithm("cuda", op, "stepped").run(call)
    return own, steps


@pytest.mark.parametrize("op,dtype", [("all_reduce", "float32"), ("reduce_scatter", "int32"),
                                      ("all_gather", "uint8")])
def test_a_guest_only_hands_its_call_over(op, dtype):
    own, steps = _run(op, dtype, guest=True)
    assert own == [] and steps == ["hand over"]


@pytest.mark.parametrize("op,dtype", [("all_reduce", "float32"), ("all_gather", "uint8")])
def test_the_leader_runs_every_step_for_its_gpu_between_taking_and_releasing_guests(op, dtype):
    own, steps = _run(op, dtype, guest=False)
    assert own == []  # every step goes through the role, which launches for all parties
    assert steps[0] == "take guests" and steps[-1] == "release guests"
    assert [s for s in steps if s.startswith("meet")] == ["meet 0", "meet 1"]
    assert steps[1].startswith("stage_and_publish_") and "stepped" in steps[3]


def test_only_the_stepped_algorithms_hand_calls_to_a_leader():
    for op, name in [("all_reduce", "one-shot"), ("all_reduce", "two-shot"),
                     ("all_reduce", "ll"), ("all_reduce", "ll-two-shot"),
                     ("all_reduce", "ll128"), ("all_reduce", "ll128-two-shot"),
                     ("all_reduce", "copy-engine"),
                     ("all_gather", "pull")]:
        assert not algorithm("cuda", op, name).leader_runs_time_sliced
    for op in ("all_reduce", "reduce_scatter", "all_gather"):
        assert algorithm("cuda", op, "stepped").leader_runs_time_sliced


# -- a call one rank's own checks refused, on a time-sliced GPU --------------------------
def _guest_steps(rank: int = 1, size: int = 3):
    """A guest's steps on a recorded stream: (steps, stream items, copy-engine jobs, kernel
    launches as (entry, blocks, the argument block they launch with))."""
    import ctypes
    from types import SimpleNamespace

    from ipcshare.collectives.scratch import ScratchLayout
    from ipcshare.collectives.time_sliced import GuestSteps, TimeSlicedRole
    from ipcshare.kernels.launcher import CollectiveArgs

    from .stream_model import Pad, StreamRecorder

    pads = {r: Pad(r) for r in range(size)}
    engine = StreamRecorder()
    copies: list = []
    launches: list = []

    def launch(entry, blocks, stream, address):
        args_at = ctypes.c_void_p.from_address(address).value
        launches.append((entry, blocks, CollectiveArgs.from_buffer_copy(
            (ctypes.c_char * ctypes.sizeof(CollectiveArgs)).from_address(args_at))))
    window = SimpleNamespace(signal_pad=lambda r: pads[r], local=SimpleNamespace(ptr=1 << 40))
    path = SimpleNamespace(window=window, rank=rank, size=size,
                           layout=ScratchLayout(1 << 20, 0, size, gpu=True),
                           group=SimpleNamespace(signal_timeout=1.0), launch=launch,
                           copier=lambda engine, jobs: (lambda: copies.append(jobs)))
    role = TimeSlicedRole(path, 0, [r for r in range(1, size)])
    return role, GuestSteps(role, engine, lambda step: step()), engine.items, copies, launches


def test_a_refused_guest_hands_over_its_mark_and_copies_nothing_of_the_users():
    from ipcshare.collectives.call_marks import encode_mark, is_mark
    from ipcshare.collectives.time_sliced import place_refused_call

    placement = place_refused_call(staging_offset=STAGING, result_offset=RESULT)
    assert not placement.copy_in and not placement.copy_out and not placement.copies_input
    mark = encode_mark(1, "output", "all_gather")
    words = placement.words(mark)
    assert is_mark(words[layout.GUEST_DIGEST])
    # Its own areas, in its window (flags 0: the leader reaches them there).
    assert words[layout.GUEST_INPUT] == pack_place(0, STAGING, 0)
    assert words[layout.GUEST_OUTPUT] == pack_place(0, RESULT, 0)

    role, steps, items, copies, launches = _guest_steps()
    steps.placement, steps.digest = role.place_refused(), mark
    steps.input = steps.output = (0, 0)
    algorithm("cuda", "all_gather", "stepped").run(GpuCall(
        Signature("all_gather", 64, "uint8", 1, None, "stepped"), 3, None, 1 << 20,
        time_sliced=steps))
    assert copies == [] and launches == []   # nothing of the user's memory is touched
    (kind, batch), = items
    call, scratch = layout.GUEST_CALL_SLOT, role.path.layout
    assert kind == "batch" and batch == [
        ("write", 1, call + layout.GUEST_DIGEST, mark),
        ("write", 1, call + layout.GUEST_INPUT, pack_place(0, scratch.staging_offset(0), 0)),
        ("write", 1, call + layout.GUEST_OUTPUT, pack_place(0, scratch.result_offset(0), 0)),
        ("write", 1, layout.GUEST_RESULT_SLOT, 0),
        ("write", 1, layout.GUEST_READY_SLOT, 1),
        ("wait", 1, layout.GUEST_DONE_SLOT, 1),
        ("write", 1, layout.GUEST_DONE_SLOT, 0)]


def test_a_guests_result_leaves_result_area_0_by_a_kernel_that_asks_if_the_call_was_done():
    """The output of the user's own memory: copied in by the copy engine (into the guest's
    own staging area, harmless whatever the call does), copied out by guest_copy_out,
    which copies only where the leader's kernel set GUEST_RESULT_SLOT (a copy-engine copy
    would run even after a call that failed, e.g. one a rank refused)."""
    from ipcshare.collectives.time_sliced import COPY_OUT_ENTRY

    role, steps, items, copies, launches = _guest_steps(rank=2)
    base = role.path.window.local.ptr
    result = role.path.layout.result_offset(0)
    steps.placement = place_guest_call(None, None, may_alias=True,
                                       staging_offset=role.path.layout.staging_offset(0),
                                       result_offset=result)
    steps.digest, steps.input, steps.output = 0xABC, (0x7000, 256), (0x9010, 3 << 20)
    for _ in range(2):   # eager calls on the same arrays launch the same block
        steps.hand_over()
    assert [kind for kind, *_ in items] == ["batch", "batch"]
    assert copies == [[(base + role.path.layout.staging_offset(0), 0x7000, 256)]] * 2
    assert [entry for entry, _, _ in launches] == [COPY_OUT_ENTRY] * 2
    _, blocks, args = launches[0]
    assert 1 < blocks <= 128
    assert (args.output, args.count, args.rank) == (0x9010, 3 << 20, 2)
    assert (args.windows[2], args.result_offset[0]) == (base, result)
    assert args.pads[2] == role.path.window.signal_pad(2).ptr
    # The batch clears the word before READY: a stale 1 can never pass a failed call.
    batch = items[0][1]
    assert batch.index(("write", 2, layout.GUEST_RESULT_SLOT, 0)) < batch.index(
        ("write", 2, layout.GUEST_READY_SLOT, 1))


def test_the_stepped_kernels_say_a_guests_call_was_done_and_the_copy_out_asks():
    """stepped.cuh: after_meet sets the guest's GUEST_RESULT_SLOT only where no digest
    differed, guest_copy_out copies only where it is 1 (read from the source, so a
    change there fails here)."""
    import re
    from pathlib import Path

    import ipcshare.kernels

    source = (Path(ipcshare.kernels.__file__).parent / "src" / "collectives"
              / "stepped.cuh").read_text()
    after_meet = source[source.index("__device__ __forceinline__ void after_meet"):]
    after_meet = after_meet[:after_meet.index("\n}\n")]
    assert re.search(r"if \(a\.guest != nullptr && !call\.failed[^;]*\n\s*\*reinterpret_cast"
                     r"<volatile u64\*>\(a\.pads\[a\.rank\] \+ kGuestResultSlot\) = 1;",
                     after_meet), after_meet
    copy_out = source[source.index("void guest_copy_out"):]
    copy_out = copy_out[:copy_out.index("\n}\n")]
    asks = copy_out.index("if (own[kGuestResultSlot] != 1) return;")
    assert asks < copy_out.index("block_copy"), copy_out


def test_a_refused_leader_marks_its_own_block_and_keeps_its_guests_rows():
    """_place_refused on a leader: the mark where the digest goes, its own staging areas
    as arrays, and the guest mask its steps set untouched (the stepped kernels run every
    guest's row with that guest's own words; the mark differs from their digests, so
    every row finds it). On a guest: its steps carry the mark, its args are not used."""
    from types import SimpleNamespace

    from ipcshare.collectives.call_marks import encode_mark
    from ipcshare.collectives.gpu_path import GpuPath
    from ipcshare.collectives.scratch import ScratchLayout
    from ipcshare.kernels.launcher import CollectiveArgs

    scratch = ScratchLayout(1 << 20, 0, 3, gpu=True)
    signature = Signature("all_reduce", 64, "float32", 4, "sum", "stepped")
    path = SimpleNamespace(_local_ptr=1 << 40, layout=scratch, _table=SimpleNamespace(ptr=8),
                           size=3, _time_sliced=SimpleNamespace(
                               place_refused=lambda: "the refused placement"))
    args = CollectiveArgs()
    args.guest_mask, args.digest = 0b110, signature.digest
    mark = encode_mark(0, "output", "all_reduce")
    leader_steps = SimpleNamespace(guest=False)
    assert GpuPath._place_refused(path, args, signature, mark, leader_steps)
    assert (args.digest, args.guest_mask, args.zero_copy) == (mark, 0b110, 1)
    assert args.input == (1 << 40) + scratch.staging_offset(0)
    assert args.output == (1 << 40) + scratch.staging_offset(1)

    args = CollectiveArgs()
    args.digest = signature.digest
    guest_steps = SimpleNamespace(guest=True)
    mark = encode_mark(1, "output", "all_reduce")
    assert GpuPath._place_refused(path, args, signature, mark, guest_steps)
    assert guest_steps.placement == "the refused placement" and guest_steps.digest == mark
    assert guest_steps.input == guest_steps.output == (0, 0)
    assert args.digest == signature.digest
