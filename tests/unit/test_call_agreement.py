"""The error of a call across nodes that ranks refused (call_agreement.refusals_error):
one line, each refusing rank with its argument and its check's words, the call named
once, ranks past 255 (which a mark's 8 bits cannot name) alike, and every rank refusing
alike said once."""

from __future__ import annotations

from ipcshare.collectives.across_nodes.call_agreement import REFUSED, Refusal, refusals_error


def _calls(size: int) -> list[tuple]:
    return [("calls", "all_reduce of 8 float32 (32 bytes), op sum, algo hierarchical")] * size


def test_each_refusing_rank_is_named_with_its_argument_and_its_checks_words():
    notes = _calls(4)
    notes[1] = Refusal("all_reduce", "op", "op='prod' is not a reduction").note()
    notes[3] = Refusal("all_reduce", "tensor", "all_reduce: tensor is read-only").note()
    message = str(refusals_error(notes))
    assert message == ("all_reduce: rank 1's op failed its check there (op='prod' is not a "
                       "reduction); rank 3's tensor failed its check there (tensor is "
                       "read-only); found by every rank in the same call, no element moved")


def test_ranks_past_255_are_named():
    notes = _calls(300)
    notes[299] = Refusal("all_gather", "output", "output has 9 elements").note()
    assert str(refusals_error(notes)).startswith(
        "all_gather: rank 299's output failed its check there (output has 9 elements)")


def test_every_rank_refusing_alike_is_said_once():
    refusal = Refusal("all_to_all_v", "collective", "all_to_all_v ... is not built").note()
    message = str(refusals_error([refusal] * 3))
    assert message == ("all_to_all_v: every rank's collective failed its check there "
                       "(all_to_all_v ... is not built); found by every rank in the same "
                       "call, no element moved")
    # Alike on two ranks of three, the third calling: each named.
    message = str(refusals_error([refusal, refusal, _calls(1)[0]]))
    assert message.count("failed its check there") == 2 and "every rank's" not in message


def test_a_refusal_is_below_every_digest():
    from ipcshare.collectives.agreement import Signature

    digest = Signature("all_reduce", 8, "float32", 4, "sum", "hierarchical").digest
    assert REFUSED < 0 <= digest < 1 << 63
