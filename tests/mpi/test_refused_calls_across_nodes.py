"""A call that one rank's own checks refuse is one call for every rank on a communicator
spanning (virtual) nodes too: every rank of every node raises the same one-line error
naming the rank and the argument in that call, no element moves on any rank (the
first step of an all-reduce writes the output, so the ranks agree before it), the next
good calls are right on every rank, and closing the communicator and the group takes
under a second (timed after each kind of error; the table's cases share one
communicator). Ranks whose well-formed calls differ from node to node raise naming each
rank's call, also for a shape the ranks agreed on before. Host backend, MPI between
nodes; 2 virtual nodes (2 x 1 at -n 2, 2 x 2 at -n 4). The refusing ranks: one on the
second node, or the first and the last (one on each node)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import ipcshare
from ipcshare.runtime.errors import CollectiveError
from ipcshare.topology.world import VIRTUAL_NODES_ENV

from ..closing import assert_closes_within_a_second
from .test_failed_calls_across_nodes import two_nodes  # noqa: F401 - autouse: 2 nodes
from .test_refused_calls import BLOCK, _gather, _reduce
from .test_refused_calls import CASES as ONE_NODE_CASES

pytestmark = pytest.mark.mpi


def _open():
    g = ipcshare.Group(backend="host")
    return g, g.communicator(max_bytes=1 << 14, inter="mpi")


@pytest.fixture(scope="module")
def shared():
    """One group and communicator for the cases of the table (each leaves them in step,
    which the next good calls check; the other tests time the closes)."""
    import os

    from mpi4py import MPI

    if MPI.COMM_WORLD.size not in (2, 4):
        pytest.skip(f"2 even virtual nodes need 2 or 4 ranks here, not {MPI.COMM_WORLD.size}")
    saved = os.environ.get(VIRTUAL_NODES_ENV)
    os.environ[VIRTUAL_NODES_ENV] = "2"
    try:
        g, c = _open()
    finally:
        if saved is None:
            del os.environ[VIRTUAL_NODES_ENV]
        else:
            os.environ[VIRTUAL_NODES_ENV] = saved
    yield c
    c.close()
    g.close()


def _a2a(c, me, n, *, extra=0):
    out = np.full(n * BLOCK + extra, -1, np.int32)
    c.all_to_all(out, np.full(n * BLOCK + extra, me + 1, np.int32))
    return out


# The one node's cases whose checks read the same across nodes, and those of its own:
# name -> (the bad call, given (communicator, rank, ranks, whether this rank spoils it);
#          the argument blamed; a pattern the check's own text matches)
CASES = {name: ONE_NODE_CASES[name] for name in (
    "all_gather output one element long", "all_gather input of another dtype",
    "input not contiguous", "output read-only", "input whose array protocol fails",
    "input not an array", "overlapping, not in place", "unknown op",
    "a stream on host memory", "reduce_scatter output of a wrong size")}
CASES.update({
    "all_reduce another algo": (
        lambda c, me, n, bad: _reduce(c, me, n, algo="one-shot" if bad else "auto"),
        "algo", r"algo='one-shot': a communicator spanning nodes runs the hierarchical"),
    "all_reduce over max_bytes": (
        lambda c, me, n, bad: c.all_reduce(np.ones(BLOCK + bad * (1 << 12), np.float32)),
        "tensor", r"max_bytes=16384"),
    "all_to_all blocks of unequal length": (
        lambda c, me, n, bad: _a2a(c, me, n, extra=int(bad)),
        "input", r"not a multiple of"),
    "all_to_all_v on one rank, all_to_all on the others": (
        lambda c, me, n, bad: (c.all_to_all_v(np.zeros(n, np.int32), np.zeros(n, np.int32),
                                              [1] * n, [1] * n) if bad else _a2a(c, me, n)),
        "collective", r"all_to_all_v on a communicator spanning nodes is not built"),
})

SPOILERS = {"one rank of the second node": lambda n: [n - 1],
            "one rank of each node": lambda n: [0, n - 1]}


def _check_good_calls(c, me, n) -> None:
    """The next good calls are right on every rank: an all-reduce, an all-gather and an
    all-to-all (each rank sends rank + 1)."""
    x = _reduce(c, me, n)
    assert np.all(x == n * (n + 1) / 2), x
    out = _gather(c, me, n)
    assert np.array_equal(out, np.repeat(np.arange(1, n + 1, dtype=np.float32), BLOCK)), out
    out = _a2a(c, me, n)
    assert np.array_equal(out, np.repeat(np.arange(1, n + 1, dtype=np.int32), BLOCK)), out


def _same_on_every_rank(comm, message: str) -> str:
    messages = comm.allgather(message)
    assert all(text == messages[0] for text in messages), messages
    assert "\n" not in message
    return message


@pytest.mark.parametrize("spoilers", list(SPOILERS))
@pytest.mark.parametrize("case", list(CASES))
def test_a_call_one_rank_refuses_is_every_ranks_error_across_nodes(comm, shared, case,
                                                                    spoilers):
    bad_call, argument, said = CASES[case]
    me, n, c = comm.rank, comm.size, shared
    spoiling = SPOILERS[spoilers](n)
    if len(spoiling) == n:
        pytest.skip("every rank would refuse (test_every_rank_refusing_alike_is_said_once)")
    _check_good_calls(c, me, n)   # calls before it: the agreed shapes are not new
    with pytest.raises(CollectiveError) as caught:
        bad_call(c, me, n, me in spoiling)
    message = _same_on_every_rank(comm, str(caught.value))
    for rank in spoiling:
        assert re.search(rf"rank {rank}'s {argument} failed its check there \(.*{said}",
                         message), message
    assert len(re.findall("failed its check there", message)) == len(set(spoiling))
    assert message.endswith("found by every rank in the same call, no element moved")
    _check_good_calls(c, me, n)
    _check_good_calls(c, me, n)


def _outputs(me, n):
    """Each collective's call on fresh arrays that the last rank spoils (an output one
    element long; a read-only tensor in place; or a well-formed all-reduce of one element
    more); the array the call writes (prefilled with -7); what the error says."""
    bad = int(me == n - 1)
    tensor = np.full(BLOCK, -7, np.float32)
    tensor.flags.writeable = not bad
    longer = np.full(BLOCK + bad, -7, np.float32)
    output = np.full(BLOCK + bad, -7, np.float32)
    gathered = np.full(n * BLOCK + bad, -7, np.float32)
    scattered = np.full(BLOCK + bad, -7, np.float32)
    exchanged = np.full(n * BLOCK + bad, -7, np.float32)
    refused = rf"rank {n - 1}'s (output|tensor) failed its check there"
    return {
        "all_reduce in place": (lambda c: c.all_reduce(tensor), tensor, refused),
        "all_reduce of another count": (lambda c: c.all_reduce(longer), longer,
                                        rf"ranks disagree .* rank {n - 1} all_reduce of 9"),
        "all_reduce out of place": (
            lambda c: c.all_reduce(np.ones(BLOCK, np.float32), output=output), output,
            refused),
        "all_gather": (lambda c: c.all_gather(gathered, np.ones(BLOCK, np.float32)),
                       gathered, refused),
        "reduce_scatter": (lambda c: c.reduce_scatter(scattered, np.ones(n * BLOCK,
                                                                          np.float32)),
                           scattered, refused),
        "all_to_all": (lambda c: c.all_to_all(exchanged, np.ones(n * BLOCK, np.float32)),
                       exchanged, refused),
    }


@pytest.mark.parametrize("collective", list(_outputs(0, 2)))
def test_a_refused_call_across_nodes_moves_no_element(comm, collective):
    """The last rank spoils the call: every rank's output of that call is untouched, on
    both nodes."""
    me, n = comm.rank, comm.size
    g, c = _open()
    call, written, said = _outputs(me, n)[collective]
    with pytest.raises(CollectiveError, match=said):
        call(c)
    assert np.all(written == -7), written
    _check_good_calls(c, me, n)
    assert_closes_within_a_second(comm, c, g)


def test_a_bound_call_one_rank_refused_raises_across_nodes_each_time(comm):
    me, n = comm.rank, comm.size
    g, c = _open()
    out = np.zeros(n * BLOCK + int(me == n - 1), np.float32)
    bound = c.bind("all_gather", out, np.full(BLOCK, me + 1, np.float32))
    assert ("refused" in bound.description) == (me == n - 1), bound.description
    for _ in range(2):
        with pytest.raises(CollectiveError) as caught:
            bound()
        message = _same_on_every_rank(comm, str(caught.value))
        assert re.match(rf"all_gather: rank {n - 1}'s output failed its check there \(output "
                        rf"has {n * BLOCK + 1} elements, expected {n} x {BLOCK}", message)
    assert np.all(out == 0)
    _check_good_calls(c, me, n)
    # A good bound call runs after it, right on every rank.
    good = np.zeros(BLOCK, np.float32)
    bound = c.bind("all_reduce", good)
    for call in range(2):
        good[:] = me + call
        bound()
        assert np.all(good == n * (n - 1) / 2 + n * call), good
    assert_closes_within_a_second(comm, c, g)


@pytest.mark.parametrize("agreed_before", [False, True], ids=["new shape", "shape seen"])
def test_nodes_that_disagree_on_a_count_are_named_with_each_ranks_value(comm,
                                                                        agreed_before):
    """Well-formed calls of 8 elements on the first node, 9 on the second: every rank
    raises naming both, in that call, also where every rank made the call of 8 before
    (each call is agreed, not only a shape's first)."""
    me, n = comm.rank, comm.size
    g, c = _open()
    if agreed_before:
        _reduce(c, me, n)
    second_node = me >= n // 2
    with pytest.raises(CollectiveError) as caught:
        c.all_reduce(np.ones(BLOCK + int(second_node), np.float32))
    message = _same_on_every_rank(comm, str(caught.value))
    first, second = ("rank 0", "rank 1") if n == 2 else ("ranks 0-1", "ranks 2-3")
    assert message.startswith(f"ranks disagree on a collective call: {first} call"), message
    assert f"call{'s' if n == 2 else ''} all_reduce of {BLOCK} float32" in message
    assert f", {second} all_reduce of {BLOCK + 1} float32" in message
    _check_good_calls(c, me, n)
    assert_closes_within_a_second(comm, c, g)


def test_every_rank_refusing_alike_is_said_once(comm):
    """all_to_all_v is not built across nodes: every rank's call refuses it, and the
    error says it once for every rank."""
    me, n = comm.rank, comm.size
    g, c = _open()
    data = np.zeros(n, np.float32)
    with pytest.raises(CollectiveError) as caught:
        c.all_to_all_v(data, data.copy(), [1] * n, [1] * n)
    message = _same_on_every_rank(comm, str(caught.value))
    assert message.startswith("all_to_all_v: every rank's collective failed its check there "
                              "(all_to_all_v on a communicator spanning nodes is not built")
    assert message.count("not built") == 1
    _check_good_calls(c, me, n)
    assert_closes_within_a_second(comm, c, g)


def test_a_call_whose_scratch_finds_no_room_on_one_rank_is_every_ranks_error(comm):
    """The last rank's empty() arrays fill its node heap, where a call's scratch goes:
    that rank refuses the call as a check would, every rank raises naming it, and once
    the arrays are gone the next good calls are right on every rank."""
    me, n = comm.rank, comm.size
    g, c = _open()
    hog = []
    if me == n - 1:
        with pytest.raises(CollectiveError, match="heap's largest free piece"):
            while True:
                hog.append(c.empty((1024,), "uint8"))
    with pytest.raises(CollectiveError) as caught:
        _gather(c, me, n)
    message = _same_on_every_rank(comm, str(caught.value))
    assert re.match(rf"all_gather: rank {n - 1}'s scratch failed its check there \(empty\(.*"
                    r"heap's largest free piece", message), message
    del caught, hog
    _check_good_calls(c, me, n)
    assert_closes_within_a_second(comm, c, g)
