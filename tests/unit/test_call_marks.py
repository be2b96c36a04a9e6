"""A refused call's mark (collectives/call_marks.py): its encoding round trip, that no
signature digest is ever a mark, that the kernels' tag is the same, and the error text
every rank raises."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import ipcshare.kernels
from ipcshare.collectives.agreement import Signature
from ipcshare.collectives.call_marks import (
    ARGUMENTS,
    CALL_NUMBER_BITS,
    CALLS,
    MARK_TAG,
    ArgumentProblem,
    blame,
    decode_mark,
    encode_mark,
    is_mark,
    refused_error,
)
from ipcshare.runtime.errors import CollectiveError

CALL_CUH = Path(ipcshare.kernels.__file__).parent / "src" / "collectives" / "call.cuh"
SPLIT_CHECKS_CUH = CALL_CUH.parent / "split_checks.cuh"
ARGS_CUH = CALL_CUH.parent / "args.cuh"


@given(rank=st.integers(0, 255), argument=st.sampled_from(ARGUMENTS),
       call=st.sampled_from(CALLS), number=st.integers(0, CALL_NUMBER_BITS))
def test_a_mark_round_trips_with_the_call_number_the_error_word_adds(rank, argument, call,
                                                                      number):
    mark = encode_mark(rank, argument, call)
    assert is_mark(mark) and mark & CALL_NUMBER_BITS == 0
    assert decode_mark(mark) == (rank, argument, call, 0)
    assert decode_mark(mark | number) == (rank, argument, call, number)


def test_marks_refuse_what_they_cannot_carry():
    with pytest.raises(ValueError, match="ranks 0 to 255"):
        encode_mark(256, "output", "all_gather")
    with pytest.raises(ValueError, match="argument='splits'"):
        encode_mark(0, "splits", "all_gather")
    with pytest.raises(ValueError, match="is not a call's mark"):
        decode_mark(0x1234)
    with pytest.raises(ValueError, match="unknown argument code 0"):
        decode_mark(MARK_TAG << 48)
    # An unknown collective (a bind of one) is named generically.
    assert decode_mark(encode_mark(1, "collective", "broadcast"))[2] == "a collective call"


@given(count=st.integers(0, 1 << 40), op=st.sampled_from(CALLS),
       algo=st.sampled_from(("pull", "ll", "one-shot", "copy-engine")))
def test_no_signature_digest_is_a_mark(count, op, algo):
    digest = Signature(op, count, "float32", 4, None, algo).digest
    assert digest >> 63 == 0 and not is_mark(digest)


def test_the_kernels_tag_marks_as_python_does_and_outranks_the_other_codes():
    text = CALL_CUH.read_text()
    tag = re.search(r"constexpr u64 kMarkTag = (0x[0-9A-Fa-f]+)ull;", text)
    assert tag and int(tag.group(1), 16) == MARK_TAG
    # The error word's low bits: the kernel keeps the call's epoch where the mark leaves
    # room, and compares calls on as many bits as the splits problem carries.
    assert f"(mark & ~0x{CALL_NUMBER_BITS:X}ull) | (epoch & 0x{CALL_NUMBER_BITS:X}ull)" in text
    # Distinct from the other codes of the error word's top 16 bits.
    splits = re.search(r"kSplitsProblem = (0x[0-9A-F]+)ull << 48", SPLIT_CHECKS_CUH.read_text())
    disagreement = re.search(r"kDisagreement = (0x[0-9A-F]+)ull << 48", ARGS_CUH.read_text())
    assert splits and disagreement
    assert MARK_TAG not in (int(splits.group(1), 16), int(disagreement.group(1), 16))


def test_blame_names_the_argument_of_the_innermost_check():
    with pytest.raises(ArgumentProblem) as caught, blame("output"):
        raise CollectiveError("output has 3 elements, expected 2 x 4")
    assert (caught.value.argument, caught.value.detail) == (
        "output", "output has 3 elements, expected 2 x 4")
    with pytest.raises(ArgumentProblem) as caught, blame("output"), blame("input_splits"):
        raise CollectiveError("x")
    assert caught.value.argument == "input_splits"
    with pytest.raises(ValueError), blame("output"):   # only CollectiveErrors are blamed
        raise ValueError("not a check")


def test_the_error_names_every_refusing_rank_lowest_first_with_what_its_check_said():
    marks = [encode_mark(2, "input", "all_to_all_v"),
             encode_mark(0, "output_splits", "all_to_all_v")]
    details = ["all_to_all_v: output_splits add up to 301 elements, more than output's 300",
               "all_to_all_v of int32 (counts by splits), algo pull",
               "input is a list: pass an array"]
    message = str(refused_error(marks, details))
    assert message == (
        "all_to_all_v: rank 0's output_splits failed its check there (output_splits add up "
        "to 301 elements, more than output's 300); rank 2's input failed its check there "
        "(input is a list: pass an array); found by every rank in the same call, no element "
        "moved")
    # On the GPU no rank knows another's detail: the rank, argument and call alone.
    assert str(refused_error([encode_mark(1, "algo", "all_reduce")],
                             where="on the GPU by every rank at call 7")) == (
        "all_reduce: rank 1's algo failed its check there; found on the GPU by every rank "
        "at call 7, no element moved")
