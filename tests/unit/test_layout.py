"""The window layout has one owner (ipcshare.window.layout): the constants the CUDA
sources share with it must equal it, and the byte layout must keep its regions apart."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import ipcshare.kernels
from ipcshare.collectives.scratch import LL_LINE_BYTES, LL_LINE_PAYLOAD
from ipcshare.kernels.launcher import MAX_KERNEL_RANKS
from ipcshare.topology.peer_paths import all_direct
from ipcshare.window import layout

_KERNELS = Path(ipcshare.kernels.__file__).parent
_CONSTEXPR = re.compile(r"constexpr\s+(?:int|u64)\s+(k\w+)\s*=\s*([^;]+);")


def _constants(relative: str) -> dict[str, int]:
    """The ``constexpr`` integers of a kernel source, by name (``1ull`` and the like
    read as plain integers)."""
    text = (_KERNELS / relative).read_text()
    found = {}
    for name, value in _CONSTEXPR.findall(text):
        value = re.sub(r"(?<=\d)(?:ull|ul|u|ll)\b", "", value.strip(), flags=re.IGNORECASE)
        if re.fullmatch(r"0x[0-9a-fA-F]+|\d+", value):
            found[name] = int(value, 0)
    return found


def test_signal_header_matches_the_layout():
    header = _constants("include/ipcshare/signal.cuh")
    assert header["kPadWords"] == layout.PAD_WORDS == layout.SIGNAL_PAD_BYTES // 8
    assert header["kHostBarrierWords"] == layout.BARRIER_SLOTS
    assert header["kHostBarrierWords"] == layout.USER_SLOT_BASE
    assert layout.USER_SLOT_BASE + header["kUserWords"] == layout.KERNEL_SLOT_BASE
    assert header["kErrorWord"] == layout.ERROR_SLOT
    assert header["kKernelWordBase"] == layout.KERNEL_SLOT_BASE
    assert header["kEpochWordBase"] == layout.EPOCH_SLOT_BASE
    assert header["kMaxRanks"] == MAX_KERNEL_RANKS


def test_collective_call_header_matches_the_layout():
    source = _constants("src/collectives/args.cuh")
    assert source["kHeaderDigest"] == layout.HEADER_DIGEST
    assert source["kHeaderInput"] == layout.HEADER_INPUT
    assert source["kHeaderFlags"] == layout.HEADER_FLAGS
    assert source["kFlagZeroCopy"] == layout.FLAG_ZERO_COPY
    assert source["kHeaderRegistration"] == layout.HEADER_REGISTRATION
    assert source["kHeaderOutput"] == layout.HEADER_OUTPUT
    assert source["kHeaderOutputFlags"] == layout.HEADER_OUTPUT_FLAGS
    assert source["kHeaderOutputRegistration"] == layout.HEADER_OUTPUT_REGISTRATION
    assert source["kHeaderWords"] == layout.HEADER_WORDS
    assert source["kFlagRegistered"] == layout.FLAG_REGISTERED
    guest_words = {"kGuestDigest": layout.GUEST_DIGEST, "kGuestInput": layout.GUEST_INPUT,
                   "kGuestOutput": layout.GUEST_OUTPUT,
                   "kGuestRowShift": layout.GUEST_ROW_SHIFT,
                   "kGuestOffsetShift": layout.GUEST_OFFSET_SHIFT,
                   "kGuestRegistered": layout.GUEST_REGISTERED,
                   "kGuestLeaderStages": layout.GUEST_LEADER_STAGES,
                   "kGuestImported": layout.GUEST_IMPORTED,
                   "kGuestCallSlot": layout.GUEST_CALL_SLOT,
                   "kGuestResultSlot": layout.GUEST_RESULT_SLOT}
    assert {name: source[name] for name in guest_words} == guest_words
    assert source["kDisagreementDigests"] == layout.DISAGREEMENT_DIGESTS_SLOT


def test_low_latency_lines_match_the_scratch_layout():
    # The LL slots are sized in lines of these (collectives/scratch.py).
    lines = _constants("include/ipcshare/ll.cuh")
    assert lines["kLineBytes"] == LL_LINE_BYTES
    assert lines["kLinePayload"] == LL_LINE_PAYLOAD


def test_pad_regions_do_not_overlap():
    # [start, end) of every region, in pad words.
    regions = {
        "host barrier": (0, layout.BARRIER_SLOTS),
        "user": (layout.USER_SLOT_BASE, layout.ERROR_SLOT),
        "error": (layout.ERROR_SLOT, layout.ERROR_SLOT + 1),
        "one-shot kernels": (layout.KERNEL_SLOT_BASE, layout.RING_KERNEL_SLOT_BASE),
        "ring kernel": (layout.RING_KERNEL_SLOT_BASE, layout.FLAG_BARRIER_SLOT_BASE),
        "flag barriers": (layout.FLAG_BARRIER_SLOT_BASE,
                          layout.FLAG_BARRIER_SLOT_BASE + 2 * layout.FLAG_BARRIER_RANKS),
        "device barrier": (layout.DEVICE_BARRIER_SLOT_BASE,
                           layout.DEVICE_BARRIER_SLOT_BASE + MAX_KERNEL_RANKS),
        "epochs": (layout.EPOCH_SLOT_BASE, layout.PAD_WORDS),
    }
    spans = sorted(regions.values())
    for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
        assert end <= start
    assert spans[-1][1] <= layout.PAD_WORDS
    epochs = [layout.ONE_SHOT_EPOCH_SLOT, layout.RING_KERNEL_EPOCH_SLOT,
              layout.DEVICE_BARRIER_EPOCH_SLOT, layout.LL_EPOCH_SLOT]
    # Two words per family (the epoch and the blocks done), inside the epoch region.
    assert len({word // 2 for word in epochs}) == len(epochs)
    assert all(layout.EPOCH_SLOT_BASE <= word < layout.PAD_WORDS - 1 for word in epochs)


def test_user_words_of_the_collectives_stay_in_the_user_region():
    last = max(layout.USER_SLOT_BASE + 2 * layout.HEADER_WORDS, layout.LL_CLEANED_SLOT + 2)
    assert last <= layout.ERROR_SLOT
    # The guest words, the disagreement's digests and the guest's RESULT word, one after
    # another, below the words of ipcshare.triton.
    assert layout.GUEST_DONE_SLOT < layout.DISAGREEMENT_DIGESTS_SLOT
    assert (layout.DISAGREEMENT_DIGESTS_SLOT + MAX_KERNEL_RANKS == layout.GUEST_RESULT_SLOT
            < layout.TRITON_BARRIER_SLOT_BASE)
    assert layout.HEADER_REGISTRATION < layout.HEADER_OUTPUT_REGISTRATION < layout.HEADER_WORDS


@pytest.mark.parametrize("nbytes", [0, 1, 4095, 4096, 3 << 20])
@pytest.mark.parametrize("granularity", [4096, 2 << 20])
def test_window_bytes_hold_data_then_pad(nbytes, granularity):
    window = layout.WindowLayout.plan(nbytes, granularity, all_direct([0, 1]))
    assert window.pad_offset >= nbytes and window.pad_offset % layout.PAD_ALIGN == 0
    assert window.relay_offset >= window.pad_offset + layout.SIGNAL_PAD_BYTES
    assert window.relay_bytes == 0 and window.slot_bytes == 0
    assert window.total_bytes % granularity == 0
    assert window.total_bytes >= window.relay_offset


def test_round_up():
    assert [layout.round_up(v, 4096) for v in (0, 1, 4096, 4097)] == [0, 4096, 4096, 8192]
