"""A call that one rank's own checks refuse, on GPUs across two virtual nodes, through each
engine between nodes: every rank of every node raises the same one-line error in the call
itself (the group agrees before any step is queued), no element moves on any rank, the
next good call is right on every rank, and closing the communicator and the group takes
under a second. Each collective, an unknown op, a bound call refused twice, and (NCCL) a
refused call inside a CUDA graph capture, then a good call captured and replayed.

Run on a GPU node with an even number of ranks, e.g. on one GPU with ranks under MPS
(the MPI engine; NCCL needs a GPU per rank of a rail: 2 x 1 on 2 GPUs):
``mpiexec -n 4 python -m pytest --with-mpi -m mpi tests/gpu/test_gpu_refused_calls_across_nodes.py``
(and -n 2)."""

from __future__ import annotations

import gc

import pytest

import ipcshare
from ipcshare.runtime.errors import CollectiveError

from ..closing import assert_closes_within_a_second
from .test_inter_gpu import _needs, _time_sliced, two_nodes  # noqa: F401 - a fixture

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.mpi, pytest.mark.usefixtures("two_nodes")]

BLOCK = 8
ENGINES = ("mpi", "nccl")


def _open(engine: str):
    g = ipcshare.Group(backend="cuda-vmm")
    device = g.backend.device
    torch.cuda.set_device(device)
    c = g.communicator(max_bytes=1 << 16, inter=engine)
    return g, c, torch.cuda.Stream(device=device), f"cuda:{device}"


def _close(comm, c, g) -> None:
    """Close the communicator and the group, timed on every rank, once what caught
    errors held (views of window memory) is collected."""
    gc.collect()
    assert_closes_within_a_second(comm, c, g)


def _good_calls(c, me: int, n: int, cuda: str, stream) -> None:
    """An all-reduce and an all-gather, right on every rank."""
    x = torch.full((BLOCK,), float(me + 1), device=cuda)
    c.all_reduce(x, stream=stream)
    out = torch.empty(n * BLOCK, device=cuda)
    c.all_gather(out, torch.full((BLOCK,), float(me), device=cuda), stream=stream)
    stream.synchronize()
    assert bool((x == n * (n + 1) / 2).all()), x
    assert bool((out == torch.arange(n, device=cuda).repeat_interleave(BLOCK)).all()), out


def _calls(me: int, n: int, cuda: str):
    """name -> (the call on fresh tensors, the last rank's spoilt; the tensor it writes,
    prefilled with -7; the argument blamed)."""
    bad = int(me == n - 1)

    def filled(count):
        return torch.full((count,), -7.0, device=cuda)

    ones = torch.ones(n * BLOCK, device=cuda)
    tensor, output, gathered = filled(BLOCK), filled(BLOCK + bad), filled(n * BLOCK + bad)
    scattered, exchanged = filled(BLOCK + bad), filled(n * BLOCK + bad)
    return {
        "all_reduce op": (lambda c, s: c.all_reduce(tensor, op="prod" if bad else "sum",
                                                    stream=s), tensor, "op"),
        "all_reduce output": (lambda c, s: c.all_reduce(ones[:BLOCK], output=output, stream=s),
                              output, "output"),
        "all_gather": (lambda c, s: c.all_gather(gathered, ones[:BLOCK], stream=s), gathered,
                       "output"),
        "reduce_scatter": (lambda c, s: c.reduce_scatter(scattered, ones, stream=s),
                           scattered, "output"),
        "all_to_all": (lambda c, s: c.all_to_all(exchanged, ones, stream=s), exchanged,
                       "output"),
    }


def _check_same_error(comm, caught, argument: str) -> None:
    message = str(caught.value)
    messages = comm.allgather(message)
    assert len(set(messages)) == 1, messages
    assert "\n" not in message
    assert f"rank {comm.size - 1}'s {argument} failed its check there" in message, message
    assert message.endswith("found by every rank in the same call, no element moved")


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("collective", list(_calls(0, 2, "cpu")))
def test_a_call_one_rank_refuses_across_nodes_on_gpus(comm, engine, collective):
    _needs(engine, comm)
    if collective == "all_to_all" and _time_sliced(comm):
        pytest.skip("ranks here take turns on a GPU (no MPS): all-to-all is refused there")
    me, n = comm.rank, comm.size
    g, c, stream, cuda = _open(engine)
    with torch.cuda.stream(stream):
        _good_calls(c, me, n, cuda, stream)
        call, written, argument = _calls(me, n, cuda)[collective]
        with pytest.raises(CollectiveError) as caught:
            call(c, stream)     # raises in the call on every rank: nothing was queued
        _check_same_error(comm, caught, argument)
        stream.synchronize()
        assert bool((written == -7).all()), written
        _good_calls(c, me, n, cuda, stream)
    del caught
    _close(comm, c, g)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_bound_call_refused_across_nodes_on_gpus_raises_each_time(comm, engine):
    _needs(engine, comm)
    me, n = comm.rank, comm.size
    g, c, stream, cuda = _open(engine)
    with torch.cuda.stream(stream):
        out = torch.full((n * BLOCK + int(me == n - 1),), -7.0, device=cuda)
        bound = c.bind("all_gather", out, torch.ones(BLOCK, device=cuda), stream=stream)
        for _ in range(2):
            with pytest.raises(CollectiveError) as caught:
                bound()
            _check_same_error(comm, caught, "output")
        stream.synchronize()
        assert bool((out == -7).all()), out
        _good_calls(c, me, n, cuda, stream)
    del caught
    _close(comm, c, g)


def test_a_refused_call_in_a_capture_across_nodes_raises_on_every_rank(comm):
    """NCCL between nodes (calls can be captured): a call the last rank refuses inside
    every rank's capture raises on every rank at capture time (nothing of it is
    captured); a good call captured after it replays right on every rank."""
    _needs("nccl", comm)
    me, n = comm.rank, comm.size
    g, c, stream, cuda = _open("nccl")
    gc.collect()   # no graph freed by the collector during a capture (docs/COLLECTIVES.md)
    out = torch.full((n * BLOCK + int(me == n - 1),), -7.0, device=cuda)
    source = torch.ones(BLOCK, device=cuda)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(CollectiveError) as caught:
        with torch.cuda.graph(graph, stream=stream):
            c.all_gather(out, source, stream=stream)
    _check_same_error(comm, caught, "output")
    del caught, graph
    gc.collect()
    torch.cuda.synchronize()
    assert bool((out == -7).all()), out
    # The ranks are in step: a good call captured now replays right on every rank.
    x = torch.zeros(BLOCK, device=cuda)
    c.all_reduce(x, stream=stream)     # bound and agreed outside the capture first
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        c.all_reduce(x, stream=stream)
    for replay in range(2):
        x.fill_(me + replay)
        graph.replay()
        torch.cuda.synchronize()
        assert bool((x == n * (n - 1) / 2 + n * replay).all()), (replay, x)
    del graph
    _close(comm, c, g)
