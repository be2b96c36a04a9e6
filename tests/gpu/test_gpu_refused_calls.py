"""A call that one rank's own checks refuse, on GPUs: that rank still launches the call's
kernels, with its mark where the digest goes and its scratch as arrays; every rank's
kernels find the mark, no element moves, and every rank raises the same one-line error
naming the rank and the argument: the refusing rank in the call itself, the others at
synchronize(). The next good call is right on every rank, and closing the communicator
and the group takes under a second. Every algorithm of every collective, bound calls,
CUDA graphs (the mark replays), and an array of another device.

Run under mpiexec, ranks sharing one GPU under MPS (docs/GPU.md), e.g.
``mpiexec -n 3 python -m pytest --with-mpi -m mpi tests/gpu/test_gpu_refused_calls.py``
(and -n 4). Ranks that take turns on a GPU (no MPS) are skipped here: their stepped calls,
which a leader runs for its guests, have tests/gpu/test_gpu_refused_calls_time_sliced.py."""

from __future__ import annotations

import gc
import re

import pytest

from ipcshare.collectives.algorithms import algorithm_names
from ipcshare.runtime.errors import CollectiveError

from ..closing import assert_closes_within_a_second
from .torch_communicator import torch_communicator

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.mpi]

# Elements of each rank's block.
BLOCK = 8
COLLECTIVES = ("all_gather", "all_reduce", "reduce_scatter", "all_to_all", "all_to_all_v")


@pytest.fixture(scope="module")
def shared():
    with torch_communicator("cuda-vmm", 1 << 20) as (group, comm, stream):
        yield group, comm, stream


@pytest.fixture
def setup(shared):
    group, _comm, _stream = shared
    if group.time_sliced_gpus:
        pytest.skip("ranks here take turns on a GPU (no MPS), where a leader runs the "
                    "stepped calls of its guests: test_gpu_refused_calls_time_sliced.py")
    return shared


class Call:
    """One collective on fresh tensors: ``run(spoil, algo)`` makes the call (this rank's
    argument ``argument`` spoilt where ``spoil``), ``expected()`` is what a good call
    leaves in the output."""

    def __init__(self, op: str, comm, me: int, n: int, device: int, stream) -> None:
        self.op, self.comm, self.me, self.n, self.stream = op, comm, me, n, stream
        cuda = f"cuda:{device}"
        self.input = torch.full((n * BLOCK,), float(me + 1), device=cuda)
        self.output = torch.full((n * BLOCK,), -7.0, device=cuda)
        self.small = torch.full((BLOCK,), -7.0, device=cuda)
        self.cuda = cuda
        self.argument = {"all_gather": "output", "all_reduce": "output",
                         "reduce_scatter": "output", "all_to_all": "output",
                         "all_to_all_v": "output_splits"}[op]

    def reset(self) -> None:
        self.output.fill_(-7.0)
        self.small.fill_(-7.0)

    def long(self, tensor):
        return torch.full((tensor.numel() + 1,), -7.0, device=self.cuda)

    def run(self, spoil: bool, algo: str):
        comm, n = self.comm, self.n
        kwargs = {"stream": self.stream}
        if self.op == "all_gather":
            out = self.long(self.output) if spoil else self.output
            return comm.all_gather(out, self.input[:BLOCK], algo=algo, **kwargs)
        if self.op == "all_reduce":
            out = self.long(self.small) if spoil else self.small
            return comm.all_reduce(self.input[:BLOCK], output=out, algo=algo, **kwargs)
        if self.op == "reduce_scatter":
            out = self.long(self.small) if spoil else self.small
            return comm.reduce_scatter(out, self.input, algo=algo, **kwargs)
        if self.op == "all_to_all":
            out = self.long(self.output) if spoil else self.output
            return comm.all_to_all(out, self.input, algo=algo, **kwargs)
        receives = [BLOCK] * n
        receives[0] += int(spoil)
        return comm.all_to_all_v(self.output, self.input, receives, [BLOCK] * n, algo=algo,
                                 **kwargs)

    def written(self):
        """The output the good call writes, and what it must hold."""
        n = self.n
        ranks = torch.arange(1, n + 1, dtype=torch.float32, device=self.cuda)
        if self.op == "all_reduce":
            return self.small, torch.full_like(self.small, n * (n + 1) / 2)
        if self.op == "reduce_scatter":
            return self.small, torch.full_like(self.small, n * (n + 1) / 2)
        return self.output, ranks.repeat_interleave(BLOCK)


def _raise_where(call, comm, stream) -> tuple[str, CollectiveError]:
    """Make ``call`` then synchronize: where it raised ("call" or "synchronize") and what."""
    try:
        call()
    except CollectiveError as exc:
        return "call", exc
    with pytest.raises(CollectiveError) as caught:
        comm.synchronize(stream)
    return "synchronize", caught.value


def _check_refused(mpi, comm, op: str, argument: str, where: str, error) -> None:
    message = str(error)
    messages = mpi.allgather(message)
    assert len(set(messages)) == 1, messages
    assert "\n" not in message
    assert re.fullmatch(rf"{op}: rank 0's {argument} failed its check there; found on the GPU "
                        r"by every rank at call \d+ of this communicator, no element moved",
                        message), message
    # The refusing rank raises in the call, and says what its check found in a note.
    assert where == ("call" if comm.rank == 0 else "synchronize"), where
    if comm.rank == 0:
        assert any("check said" in note for note in getattr(error, "__notes__", ())), error


def _cases():
    return [(op, algo) for op in COLLECTIVES for algo in algorithm_names("cuda", op)]


@pytest.mark.parametrize(("op", "algo"), _cases())
def test_a_call_rank_0_refuses_is_every_ranks_error_on_the_gpu(comm, setup, op, algo):
    group, communicator, stream = setup
    me, n = communicator.rank, communicator.size
    call = Call(op, communicator, me, n, group.backend.device, stream)
    call.run(False, algo)   # its first call: every rank agrees on its shape
    communicator.synchronize(stream)
    call.reset()
    torch.cuda.synchronize()
    where, error = _raise_where(lambda: call.run(me == 0, algo), communicator, stream)
    _check_refused(comm, communicator, op, call.argument, where, error)
    output, expected = call.written()
    if me != 0:
        # No element moved, copy engines too (their guard: copy_engine.cuh).
        assert bool(torch.all(output == -7.0)), output
    for _ in range(2):   # still in step: the next good calls are right everywhere
        call.reset()
        call.run(False, algo)
        communicator.synchronize(stream)
        assert torch.equal(output, expected), (output, expected)


def _argument_cases(cm, call, n):
    """name -> (the call, given whether this rank spoils it; the argument blamed): each
    argument check that can differ between ranks, on one rank (algo auto)."""
    cuda, block = call.cuda, call.input[:BLOCK]
    return {
        "unknown op": (lambda bad: cm.all_reduce(block, output=call.small,
                                                 op="prod" if bad else "sum",
                                                 stream=call.stream), "op"),
        "unknown algo": (lambda bad: cm.all_reduce(block, output=call.small,
                                                   algo="ring" if bad else "auto",
                                                   stream=call.stream), "algo"),
        "input of another dtype": (lambda bad: cm.all_gather(
            call.output, block.double() if bad else block, stream=call.stream), "output"),
        "input not contiguous": (lambda bad: cm.all_gather(
            call.output, call.input[:2 * BLOCK:2] if bad else block, stream=call.stream),
            "input"),
        "overlapping, not in place": (lambda bad: cm.all_reduce(
            call.input[:BLOCK], output=call.input[1:BLOCK + 1] if bad else call.small,
            stream=call.stream), "output"),
        "input_splits of a wrong length": (lambda bad: cm.all_to_all_v(
            call.output, call.input, [BLOCK] * n, [BLOCK] * (n + int(bad)),
            stream=call.stream), "input_splits"),
        "device input_splits of another dtype": (lambda bad: cm.all_to_all_v(
            call.output, call.input, [BLOCK] * n,
            torch.full((n,), BLOCK, dtype=torch.float32 if bad else torch.int32, device=cuda),
            stream=call.stream), "input_splits"),
        "all_to_all_v in place": (lambda bad: cm.all_to_all_v(
            call.input if bad else call.output, call.input, [BLOCK] * n, [BLOCK] * n,
            stream=call.stream), "output"),
    }


@pytest.mark.parametrize("case", ["unknown op", "unknown algo", "input of another dtype",
                                  "input not contiguous", "overlapping, not in place",
                                  "input_splits of a wrong length",
                                  "device input_splits of another dtype",
                                  "all_to_all_v in place"])
def test_each_argument_check_rank_0_fails_is_every_ranks_error(comm, setup, case):
    group, communicator, stream = setup
    me, n = communicator.rank, communicator.size
    call = Call("all_to_all_v", communicator, me, n, group.backend.device, stream)
    make, argument = _argument_cases(communicator, call, n)[case]
    make(False)   # the call's first sight: every rank agrees on its shape
    communicator.synchronize(stream)
    op = {"unknown op": "all_reduce", "unknown algo": "all_reduce",
          "overlapping, not in place": "all_reduce", "input of another dtype": "all_gather",
          "input not contiguous": "all_gather"}.get(case, "all_to_all_v")
    where, error = _raise_where(lambda: make(me == 0), communicator, stream)
    _check_refused(comm, communicator, op, argument, where, error)
    for _ in range(2):   # still in step
        call.reset()
        call.run(False, "auto")
        communicator.synchronize(stream)
        output, expected = call.written()
        assert torch.equal(output, expected), (output, expected)


def test_a_bound_call_rank_0_refuses_raises_on_every_rank_each_time(comm, setup):
    group, communicator, stream = setup
    me, n = communicator.rank, communicator.size
    call = Call("all_gather", communicator, me, n, group.backend.device, stream)
    call.run(False, "auto")
    communicator.synchronize(stream)
    out = call.long(call.output) if me == 0 else call.output
    bound = communicator.bind("all_gather", out, call.input[:BLOCK], stream=stream)
    for _ in range(2):
        where, error = _raise_where(bound, communicator, stream)
        _check_refused(comm, communicator, "all_gather", "output", where, error)
    call.run(False, "auto")
    communicator.synchronize(stream)
    output, expected = call.written()
    assert torch.equal(output, expected)


def _capture_status(stream) -> str:
    """The capture status of ``stream`` (a torch stream): none, active or invalidated."""
    from ipcshare.backends.cuda_streams import capture_invalidated, stream_capturing

    handle = stream.cuda_stream
    if not stream_capturing(handle):
        return "none"
    return "invalidated" if capture_invalidated(handle) else "active"


def _captured(mpi, graph, stream, steps, mode: str = "global") -> None:
    """Capture ``steps`` ((name, callable) in order) into ``graph`` on ``stream`` in
    capture mode ``mode``, then agree across ranks that every rank captured them: else
    fail on every rank (before any replay, so no rank is left waiting for one that has
    no graph to replay), naming each failed rank's first step that found the capture
    invalidated and the error it raised."""
    failure = None
    # A CUDA graph of an earlier test may still be alive in a reference cycle (its test's
    # frame and a pytest.raises traceback), and torch no longer collects before a capture:
    # freed by the garbage collector during this capture, its reset would invalidate it.
    gc.collect()
    try:
        with torch.cuda.graph(graph, stream=stream, capture_error_mode=mode):
            for name, step in steps:
                try:
                    step()
                except Exception as exc:
                    failure = f"{name} raised {type(exc).__name__}: {exc}"
                    raise
                status = _capture_status(stream)
                if status != "active":
                    failure = f"capture {status} after {name}"
                    break
    except Exception as exc:
        failure = failure or f"ending the capture raised {type(exc).__name__}: {exc}"
    failures = mpi.allgather(failure)
    if any(failures):
        pytest.fail("capture failed: " + "; ".join(
            f"rank {rank}: {what}" for rank, what in enumerate(failures) if what))


def _check_replays(mpi, communicator, graph, stream) -> None:
    for _ in range(2):
        graph.replay()
        message = _synchronize_error(communicator, stream)
        assert len(set(mpi.allgather(message))) == 1
        assert message.startswith("all_to_all_v: rank 0's output_splits failed its check")


def _check_next_call_right(call, communicator, stream, algo: str) -> None:
    """The ranks are still in step: the next good call is right everywhere."""
    call.reset()
    call.run(False, algo)
    communicator.synchronize(stream)
    output, expected = call.written()
    assert torch.equal(output, expected)


def _synchronize_error(communicator, stream) -> str:
    """The error synchronize() raises, as text (no traceback kept: it would hold the
    caller's frame, and with it a graph, in a cycle)."""
    with pytest.raises(CollectiveError) as caught:
        communicator.synchronize(stream)
    return str(caught.value)


@pytest.mark.parametrize("algo", algorithm_names("cuda", "all_to_all_v"))
def test_a_refused_call_captured_in_a_graph_replays_its_mark(comm, setup, algo):
    group, communicator, stream = setup
    me, n = communicator.rank, communicator.size
    call = Call("all_to_all_v", communicator, me, n, group.backend.device, stream)
    call.run(False, algo)
    communicator.synchronize(stream)
    graph = torch.cuda.CUDAGraph()
    # Rank 0 captures its marked kernels, nothing raised.
    _captured(comm, graph, stream, [("the call", lambda: call.run(me == 0, algo))])
    _check_replays(comm, communicator, graph, stream)
    _check_next_call_right(call, communicator, stream, algo)


@pytest.mark.parametrize("mode", ["global", "relaxed"])
@pytest.mark.parametrize("algo", algorithm_names("cuda", "all_to_all_v"))
def test_a_refused_call_in_a_graph_captured_step_by_step(comm, setup, algo, mode):
    """The refused call's path cut at its steps (the checks, the bind, the launch), the
    capture's status asked after each: a capture that fails names the step after which
    it was invalidated. Global mode forbids the calls not allowed during a capture on
    every thread of the process, relaxed mode allows them: a failure in global mode alone
    points at such a call (a host wait, an allocation, a graph destroyed), one in both at
    the call's own launch."""
    group, communicator, stream = setup
    me, n = communicator.rank, communicator.size
    call = Call("all_to_all_v", communicator, me, n, group.backend.device, stream)
    call.run(False, algo)
    communicator.synchronize(stream)
    receives = [BLOCK] * n
    receives[0] += int(me == 0)
    found: dict = {}

    def check():
        found["call"] = communicator._checked(
            "all_to_all_v", call.output, call.input, receives, [BLOCK] * n, stream=stream,
            algo=algo)

    def bind():
        checked = found["call"]
        if me == 0:
            found["launch"] = communicator._path.refused_call(
                checked.op, checked.problem, checked.guess, stream=checked.stream)
        else:
            found["launch"] = lambda: communicator._run(checked)

    graph = torch.cuda.CUDAGraph()
    _captured(comm, graph, stream, [("the checks", check), ("the bind", bind),
                                    ("the launch", lambda: found["launch"]())], mode)
    _check_replays(comm, communicator, graph, stream)
    _check_next_call_right(call, communicator, stream, algo)


def test_a_refused_call_in_a_graph_capture_already_invalidated_names_it(comm, setup):
    """Rank 0 alone captures: an earlier graph destroyed in the capture (not allowed in
    the global mode) invalidates it, and the call rank 0 then refuses raises at once,
    saying that the capture was invalidated before it, instead of failing its launch.
    Nothing is launched, so the ranks stay in step."""
    group, communicator, stream = setup
    me, n = communicator.rank, communicator.size
    call = Call("all_to_all_v", communicator, me, n, group.backend.device, stream)
    call.run(False, "pull")
    communicator.synchronize(stream)
    if me == 0:
        earlier = torch.cuda.CUDAGraph()
        with torch.cuda.graph(earlier, stream=stream):
            call.small.add_(1)
        graph = torch.cuda.CUDAGraph()
        with pytest.raises(RuntimeError, match="capture"):   # ending the invalid capture
            with torch.cuda.graph(graph, stream=stream):
                earlier.reset()
                with pytest.raises(CollectiveError, match="capture of this stream was "
                                   "invalidated before this rank refused the call"):
                    call.run(True, "pull")
    comm.barrier()
    _check_next_call_right(call, communicator, stream, "pull")


def test_an_array_of_another_device_on_rank_0_is_every_ranks_error(comm, setup):
    group, communicator, stream = setup
    me = communicator.rank
    cuda = f"cuda:{group.backend.device}"
    tensor = torch.ones(BLOCK) if me == 0 else torch.ones(BLOCK, device=cuda)
    where, error = _raise_where(lambda: communicator.all_reduce(tensor, stream=stream),
                                communicator, stream)
    _check_refused(comm, communicator, "all_reduce", "tensor", where, error)
    good = torch.ones(BLOCK, device=cuda)
    communicator.all_reduce(good, stream=stream)
    communicator.synchronize(stream)
    assert bool(torch.all(good == communicator.size))


def test_a_refused_call_whose_guess_is_not_the_peers_call_is_every_ranks_refusal(comm, setup):
    """At the first sight of a shape, rank 0's checks refuse its all-gather (an output one
    element long) and its input is one element longer than the peers': the call it guesses
    the peers make is not theirs. The ranks meet on the host at a shape's first sight, so
    every rank raises rank 0's refusal in the call, naming its output and what its check
    said, not a disagreement with a call rank 0 never made; nothing is written and the
    next good call is right."""
    group, communicator, stream = setup
    me, n = communicator.rank, communicator.size
    if n < 2:
        pytest.skip("needs 2 ranks")
    cuda = f"cuda:{group.backend.device}"
    count = 29   # a shape no other test here makes: its first sight
    source = torch.full((count + (me == 0),), float(me + 1), device=cuda)
    out = torch.full((n * count,), -7.0, device=cuda)
    with pytest.raises(CollectiveError) as caught:
        communicator.all_gather(torch.full((1,), -7.0, device=cuda) if me == 0 else out,
                                source, stream=stream)
    message = str(caught.value)
    assert len(set(comm.allgather(message))) == 1, message
    assert re.fullmatch(r"all_gather: rank 0's output failed its check there \(.+\); found "
                        r"by every rank in the same call, no element moved", message), message
    communicator.synchronize(stream)
    assert bool(torch.all(out == -7.0))
    communicator.all_gather(out, source[:count], stream=stream)
    communicator.synchronize(stream)
    ranks = torch.arange(1, n + 1, dtype=torch.float32, device=cuda)
    assert torch.equal(out, ranks.repeat_interleave(count))


@pytest.mark.parametrize("algo", algorithm_names("cuda", "all_to_all_v"))
def test_closing_after_a_refused_call_takes_under_a_second(comm, algo):
    with torch_communicator("cuda-vmm", 1 << 20) as (group, communicator, stream):
        if group.time_sliced_gpus:
            pytest.skip("ranks here take turns on a GPU (no MPS): "
                        "test_gpu_refused_calls_time_sliced.py")
        me, n = communicator.rank, communicator.size
        call = Call("all_to_all_v", communicator, me, n, group.backend.device, stream)
        where, error = _raise_where(lambda: call.run(me == 0, algo), communicator, stream)
        _check_refused(comm, communicator, "all_to_all_v", "output_splits", where, error)
        assert_closes_within_a_second(comm, communicator, group)
