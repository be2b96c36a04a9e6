"""A call that one rank's own checks refuse is still one call for every rank (host
backend): that rank takes part with a mark, every rank raises the same one-line error
naming the rank and the argument in that call, no element moves, the next good call is
right on every rank, and closing the communicator and the group takes under a second.
Every argument check that can differ between ranks, and ranks that disagree on a call's
shape (the error names what each rank called). Size-agnostic: at one rank the lone rank
refuses its own call. Each case on a group of its own."""

from __future__ import annotations

import gc
import re

import numpy as np
import pytest

import ipcshare
from ipcshare.runtime.errors import CollectiveError

from ..closing import assert_closes_within_a_second

pytestmark = pytest.mark.mpi

# Elements of each rank's input block.
BLOCK = 8


@pytest.fixture(autouse=True)
def _collect_what_tracebacks_held():
    # A caught error's traceback holds views of the window until collected.
    yield
    gc.collect()


def _a2av(c, me, n, *, out_extra=0, splits_len=0, send_extra=0):
    """An all-to-all-v of BLOCK elements to each rank, this rank's arguments spoiled as
    asked: output_splits adding up to ``out_extra`` more than the output holds, input
    splits of ``splits_len`` more counts, ``send_extra`` more sent than the input holds."""
    out = np.full(n * BLOCK, -1, np.int32)
    inp = np.full(n * BLOCK, me + 1, np.int32)
    receives = [BLOCK] * n
    receives[0] += out_extra
    sends = [BLOCK] * (n + splits_len)
    sends[-1] += send_extra
    c.all_to_all_v(out, inp, receives, sends)
    return out


def _gather(c, me, n, *, output=None, input=None, **kwargs):
    out = np.full(n * BLOCK, -1, np.float32) if output is None else output
    inp = np.full(BLOCK, me + 1, np.float32) if input is None else input
    c.all_gather(out, inp, **kwargs)
    return out


def _reduce(c, me, n, **kwargs):
    x = np.full(BLOCK, me + 1, np.float32)
    c.all_reduce(x, **kwargs)
    return x


# name -> (the bad call, given (communicator, rank, ranks, whether this rank spoils it);
#          the argument blamed; a pattern the check's own text matches)
CASES = {
    "output_splits past the output": (
        lambda c, me, n, bad: _a2av(c, me, n, out_extra=int(bad)),
        "output_splits", r"output_splits add up to \d+ elements, more than output's"),
    "input_splits of a wrong length": (
        lambda c, me, n, bad: _a2av(c, me, n, splits_len=int(bad)),
        "input_splits", r"input_splits has \d+ counts, expected one per rank"),
    "input_splits past the input": (
        lambda c, me, n, bad: _a2av(c, me, n, send_extra=int(bad)),
        "input_splits", r"input_splits add up to"),
    "all_gather output one element long": (
        lambda c, me, n, bad: _gather(c, me, n, output=np.zeros(n * BLOCK + bad, np.float32)),
        "output", r"output has \d+ elements, expected \d+ x 8"),
    "all_gather input of another dtype": (
        lambda c, me, n, bad: _gather(c, me, n, input=np.zeros(
            BLOCK, np.float64 if bad else np.float32)),
        "output", r"takes one dtype"),
    "input not contiguous": (
        lambda c, me, n, bad: _gather(c, me, n, input=np.zeros(
            2 * BLOCK, np.float32)[::2] if bad else None),
        "input", r"not contiguous"),
    "output read-only": (
        lambda c, me, n, bad: _gather(c, me, n, output=_read_only(n) if bad else None),
        "output", r"read-only"),
    "input whose array protocol fails": (
        lambda c, me, n, bad: _gather(c, me, n, input=_Broken() if bad else None),
        "input", r"input \(_Broken\) cannot be read as an array here: ValueError: this buffer "
                 r"was released"),
    "input not an array": (
        lambda c, me, n, bad: _gather(c, me, n, input=[1.0] * BLOCK if bad else None),
        "input", r"input is a list"),
    "overlapping, not in place": (
        lambda c, me, n, bad: _overlapping_gather(c, me, n, bad),
        "output", r"overlaps output but is not in place"),
    "unknown op": (
        lambda c, me, n, bad: _reduce(c, me, n, op="prod" if bad else "sum"),
        "op", r"op='prod' is not a reduction"),
    "unknown algo": (
        lambda c, me, n, bad: _reduce(c, me, n, algo="ring" if bad else "auto"),
        "algo", r"algo='ring' is not an algorithm of all_reduce"),
    "a stream on host memory": (
        lambda c, me, n, bad: _reduce(c, me, n, stream=7 if bad else None),
        "stream", r"has no streams"),
    "reduce_scatter output of a wrong size": (
        lambda c, me, n, bad: c.reduce_scatter(np.zeros(BLOCK + bad, np.float32),
                                               np.ones(n * BLOCK, np.float32)),
        "output", r"input has \d+ elements, expected \d+ x \d+"),
    "all_to_all blocks of unequal length": (
        lambda c, me, n, bad: c.all_to_all(np.zeros(n * BLOCK + bad, np.int32),
                                           np.zeros(n * BLOCK + bad, np.int32)),
        "input", r"not a multiple of"),
}


class _Broken:
    """An object that claims an array protocol and fails it (as a closed one may)."""

    @property
    def __array_interface__(self):
        raise ValueError("this buffer was released")


def _read_only(n):
    out = np.zeros(n * BLOCK, np.float32)
    out.flags.writeable = False
    return out


def _overlapping_gather(c, me, n, bad):
    out = np.zeros(n * BLOCK + 1, np.float32)
    # In place is block `me` of the output; one element off overlaps it otherwise.
    start = me * BLOCK + int(bad)
    return c.all_gather(out[:n * BLOCK], out[start:start + BLOCK])


def _spoilers(n: int) -> list[int]:
    """The ranks that spoil a call: the first one, and the last one too from 3 ranks up
    (the error then names both, the lowest first)."""
    return [0] if n < 3 else [0, n - 1]


def _check_good_calls(c, me, n) -> None:
    """The next good calls are right on every rank: an all-to-all-v (each rank sends
    rank + 1) and an all-reduce."""
    out = _a2av(c, me, n)
    assert np.array_equal(out, np.repeat(np.arange(1, n + 1, dtype=np.int32), BLOCK)), out
    x = _reduce(c, me, n)
    assert np.all(x == n * (n + 1) / 2), x


@pytest.mark.parametrize("case", list(CASES))
def test_a_call_one_rank_refuses_is_every_ranks_error_in_that_call(comm, case):
    bad_call, argument, said = CASES[case]
    me, n = comm.rank, comm.size
    if n == 1 and case == "all_to_all blocks of unequal length":
        pytest.skip("needs 2 ranks: every length is a multiple of 1")
    spoilers = _spoilers(n)
    g = ipcshare.Group(backend="host")
    c = g.communicator(max_bytes=1 << 14)
    _check_good_calls(c, me, n)   # a call before it, so it is not the first
    with pytest.raises(CollectiveError) as caught:
        bad_call(c, me, n, me in spoilers)
    message = str(caught.value)
    messages = comm.allgather(message)
    assert all(text == messages[0] for text in messages), messages
    assert "\n" not in message
    for rank in spoilers:
        assert re.search(rf"rank {rank}'s {argument} failed its check there \(.*{said}",
                         message), message
    assert message.endswith("found by every rank in the same call, no element moved")
    # Still in step: the next good calls are right on every rank, twice over.
    _check_good_calls(c, me, n)
    _check_good_calls(c, me, n)
    assert_closes_within_a_second(comm, c, g)


def test_a_refused_call_moves_no_element(comm):
    """The peers' outputs of the refused call are untouched."""
    me, n = comm.rank, comm.size
    with ipcshare.Group(backend="host") as g, g.communicator(max_bytes=1 << 14) as c:
        out = np.full(n * BLOCK, -7, np.int32)
        inp = np.full(n * BLOCK, me + 1, np.int32)
        receives = [BLOCK] * n
        receives[0] += int(me == 0)
        with pytest.raises(CollectiveError, match="rank 0's output_splits"):
            c.all_to_all_v(out, inp, receives, [BLOCK] * n)
        assert np.all(out == -7), out


def test_a_bound_call_one_rank_refused_raises_on_every_rank_each_time(comm):
    """comm.bind checks once: a rank whose bind its checks refuse gets a bound call that
    takes part, marked, each time the ranks call it."""
    me, n = comm.rank, comm.size
    with ipcshare.Group(backend="host") as g:
        c = g.communicator(max_bytes=1 << 14)
        out = np.zeros(n * BLOCK + int(me == 0), np.float32)
        bound = c.bind("all_gather", out, np.full(BLOCK, me + 1, np.float32))
        assert "refused" in bound.description if me == 0 else "refused" not in bound.description
        for _ in range(2):
            with pytest.raises(CollectiveError) as caught:
                bound()
            messages = comm.allgather(str(caught.value))
            assert len(set(messages)) == 1, messages
            assert re.match(r"all_gather: rank 0's output failed its check there \(output has "
                            rf"{n * BLOCK + 1} elements, expected {n} x {BLOCK}", messages[0])
        _check_good_calls(c, me, n)
        assert_closes_within_a_second(comm, c, g)


def test_ranks_that_disagree_on_a_count_are_named_with_each_ranks_value(comm):
    """No rank refuses its own call, but the calls differ: the error, the same on every
    rank in that call, names what each rank called."""
    if comm.size < 2:
        pytest.skip("needs 2 ranks")
    me, n = comm.rank, comm.size
    with ipcshare.Group(backend="host") as g:
        c = g.communicator(max_bytes=1 << 14)
        count = BLOCK + int(me == n - 1)
        with pytest.raises(CollectiveError) as caught:
            c.all_reduce(np.ones(count, np.float32))
        messages = comm.allgather(str(caught.value))
        assert len(set(messages)) == 1, messages
        assert f"all_reduce of {BLOCK} float32" in messages[0]
        assert f"rank {n - 1} all_reduce of {BLOCK + 1} float32" in messages[0]
        _check_good_calls(c, me, n)
        assert_closes_within_a_second(comm, c, g)
