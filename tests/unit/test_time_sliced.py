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
    words = set(range(layout.GUEST_CALL_SLOT, layout.GUEST_CALL_SLOT + layout.GUEST_CALL_WORDS))
    words |= {layout.GUEST_READY_SLOT, layout.GUEST_DONE_SLOT}
    taken = {layout.USER_SLOT_BASE + w for w in range(2 * layout.HEADER_WORDS)}
    taken |= {layout.LL_CLEANED_SLOT, layout.LL_CLEANED_SLOT + 1}
    assert len(words) == layout.GUEST_CALL_WORDS + 2 and not words & taken
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
