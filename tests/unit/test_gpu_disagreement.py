"""The line a GPU call whose ranks disagree raises (GpuPath._disagreement), from the digests
the kernel that found it left in the pad (record_disagreement in
kernels/src/collectives/call.cuh): word r holds rank r's digest where it differed from the
rank's own, its own at its rank, 0 where the same. No GPU: the pad is a numpy array. And
the host's meeting at a shape's first sight (GpuPath._agree), where a rank that refused its
call brings its guess of the peers' call and its refusal."""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest

from ipcshare.collectives.agreement import Signature
from ipcshare.collectives.call_marks import encode_mark
from ipcshare.collectives.gpu_path import GpuPath
from ipcshare.runtime.errors import CollectiveError
from ipcshare.window.layout import DISAGREEMENT_DIGESTS_SLOT, PAD_WORDS

SMALL = Signature("all_reduce", 1000, "float32", 4, "sum", "one-shot")
LARGE = Signature("all_reduce", 1004, "float32", 4, "sum", "one-shot")


class _Pad:
    def __init__(self) -> None:
        self.words = np.zeros(PAD_WORDS, np.uint64)

    def slice(self, offset: int, nbytes: int) -> np.ndarray:
        return self.words.view(np.uint8)[offset:offset + nbytes]


def _path(rank: int, size: int, digests: list[int], agreed: set[Signature]):
    """What _disagreement reads of a GpuPath: this rank's pad, as one kernel left it."""
    pad = _Pad()
    pad.words[DISAGREEMENT_DIGESTS_SLOT:DISAGREEMENT_DIGESTS_SLOT + size] = digests
    engine = SimpleNamespace(download=lambda view: view.copy())
    window = SimpleNamespace(signal_pad=lambda r: pad, engine=engine)
    return SimpleNamespace(window=window, rank=rank, size=size, _agreed=agreed)


def _recorded(rank: int, calls: list[Signature]) -> list[int]:
    """The words the kernel of ``rank`` leaves: each differing rank's digest, its own."""
    own = calls[rank].digest
    return [own if r == rank else (c.digest if c.digest != own else 0)
            for r, c in enumerate(calls)]


@pytest.mark.parametrize("calls", [[SMALL, LARGE], [SMALL, LARGE, SMALL],
                                   [LARGE, LARGE, SMALL, LARGE]])
def test_every_rank_names_every_ranks_call_alike(calls):
    lines = {str(GpuPath._disagreement(_path(rank, len(calls), _recorded(rank, calls),
                                              {SMALL, LARGE}), 7))
             for rank in range(len(calls))}
    assert len(lines) == 1
    line = lines.pop()
    assert line.startswith("ranks disagree on a collective call: ")
    assert line.endswith("(found on the GPU at call 7 of this communicator); every rank must "
                         "make the same calls in the same order")
    for call in calls:
        assert call.describe() in line
    if calls == [SMALL, LARGE, SMALL]:
        assert f"ranks 0, 2 call {SMALL.describe()}, rank 1 {LARGE.describe()}" in line


def test_a_digest_of_no_agreed_shape_is_named_by_its_value():
    other = Signature("all_reduce", 9, "float32", 4, "sum", "one-shot")
    line = str(GpuPath._disagreement(_path(0, 2, _recorded(0, [SMALL, other]), {SMALL}), 3))
    assert f"rank 1 a call of digest 0x{other.digest:016x} (a shape this rank never agreed)" \
        in line


def test_without_the_digests_the_call_number_alone():
    line = str(GpuPath._disagreement(_path(1, 2, [0, 0], {SMALL}), 12))
    assert line == ("rank 1: ranks disagree on a collective call (found on the GPU at call "
                    "12 of this communicator): every rank must make the same calls in the "
                    "same order")


# -- the host's meeting at a shape's first sight (GpuPath._agree) -------------------------

def _agree(notes: list, signature: Signature, refusal=None) -> set[Signature]:
    """Run ``_agree`` for this rank's ``signature`` where the group's meeting returns
    ``notes`` (every rank's, this rank's among them); the signatures agreed after it."""
    path = SimpleNamespace(_agreed=set(),
                           group=SimpleNamespace(collective=lambda _what, _mine: notes))
    GpuPath._agree(path, signature, refusal)
    return path._agreed


def test_a_refusing_rank_that_guessed_the_peers_call_goes_on_with_its_mark():
    mark = encode_mark(0, "output", "all_reduce")
    notes = [(SMALL.describe(), mark, "output has 9 elements"), SMALL.describe()]
    assert _agree(notes, SMALL, (mark, "output has 9 elements")) == {SMALL}


def test_a_wrong_guess_is_every_ranks_refusal_not_a_disagreement():
    """Rank 0 refused and guessed LARGE; the peers call SMALL: every rank raises rank 0's
    refusal (what its check said), not a disagreement with a call it never made."""
    mark = encode_mark(0, "output", "all_reduce")
    notes = [(LARGE.describe(), mark, "all_reduce: output has 1 element, not 1004"),
             SMALL.describe(), SMALL.describe()]
    for mine, refusal in ((LARGE, (mark, notes[0][2])), (SMALL, None)):
        with pytest.raises(CollectiveError) as raised:
            _agree(notes, mine, refusal)
        assert str(raised.value) == (
            "all_reduce: rank 0's output failed its check there (output has 1 element, not "
            "1004); found by every rank in the same call, no element moved")


def test_calls_that_differ_with_no_refusal_name_each_ranks_call():
    with pytest.raises(CollectiveError, match=r"^ranks disagree on a collective call: rank 0 "
                       rf"calls {re.escape(SMALL.describe())}, rank 1 "
                       rf"{re.escape(LARGE.describe())}$"):
        _agree([SMALL.describe(), LARGE.describe()], SMALL)
