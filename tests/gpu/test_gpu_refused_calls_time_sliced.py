"""A call one rank's own checks refuse where ranks take turns on a GPU (several ranks on one
GPU without MPS), for the stepped algorithms, which the lowest rank of the GPU (its
leader) runs for the others (its guests, collectives/time_sliced.py). A refusing guest
hands its leader the call marked; a refusing leader runs the steps for itself and its
guests with its own block marked. Every rank's kernels find the mark, no element moves
(a guest whose output its leader cannot reach copies nothing out of result area 0), and
every rank raises the same line: the refusing rank in the call, the others at
synchronize(). The next good call is right on every rank; bound calls and CUDA graphs
replay the mark; closing takes under a second.

Run under mpiexec with every rank on one GPU and no MPS daemon running, e.g.
``mpiexec -n 3 python -m pytest -q -p no:cacheprovider --with-mpi -m "mpi and gpu"
tests/gpu/test_gpu_refused_calls_time_sliced.py`` (and -n 2, -n 4). Where no GPU takes
turns (a GPU each, or MPS) every test skips: tests/gpu/test_gpu_refused_calls.py covers
that."""

from __future__ import annotations

import contextlib
import gc
import re

import pytest

from ipcshare.runtime.errors import CollectiveError

from ..closing import assert_closes_within_a_second
from .torch_communicator import torch_communicator

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.mpi]

# Elements of each rank's block.
BLOCK = 64
STEPPED = ("all_gather", "all_reduce", "reduce_scatter")
UNTOUCHED = -7.0


def _skip_unless_time_sliced(mpi, group, communicator) -> None:
    """Skip on every rank alike where no GPU of the group takes turns, or where its
    ranks do not hand their stepped calls to a leader (64-bit stream memory operations
    missing, or a group spanning nodes)."""
    if not group.time_sliced_gpus:
        pytest.skip("no GPU takes turns here (a GPU each, or MPS serves it): "
                    "tests/gpu/test_gpu_refused_calls.py covers that")
    on_it = any(communicator.rank in ranks for ranks in group.time_sliced_gpus.values())
    handed = mpi.allgather(not on_it or communicator._path._time_sliced is not None)
    if not all(handed):
        pytest.skip("the ranks of a time-sliced GPU here run their own stepped calls "
                    "(no 64-bit stream memory operations): no leader runs them")


def _refusers(group) -> dict[str, int]:
    """The rank that refuses, by its part: the leader of the first time-sliced GPU (its
    lowest rank) and that GPU's first guest."""
    ranks = sorted(min(group.time_sliced_gpus.values(), key=min))
    return {"leader": ranks[0], "guest": ranks[1]}


@pytest.fixture(scope="module")
def shared():
    with torch_communicator("cuda-vmm", 1 << 20) as (group, comm, stream):
        yield group, comm, stream


@pytest.fixture
def setup(comm, shared):
    group, communicator, _stream = shared
    _skip_unless_time_sliced(comm, group, communicator)
    return shared


@contextlib.contextmanager
def fresh_memory(device: int):
    """``new(elements)``: float32 tensors, each in an allocation of its own (cuMemAlloc)
    that no call has seen, so a guest's leader has not mapped it yet and the guest
    copies its output out of result area 0 (collectives/guest_imports.py maps an
    allocation only after its first calls); freed after the block, once the GPU is done."""
    from cuda.bindings import driver as cu

    from ipcshare.backends.device_buffer import DeviceArray

    pointers: list[int] = []

    def new(elements: int):
        nbytes = max(4 * elements, 4096)
        err, ptr = cu.cuMemAlloc(nbytes)
        assert err == cu.CUresult.CUDA_SUCCESS, err
        pointers.append(int(ptr))
        array = DeviceArray(int(ptr), nbytes, device, owner=None, shape=(nbytes // 4,),
                            dtype="float32")
        return torch.from_dlpack(array)[:elements]
    try:
        yield new
    finally:
        torch.cuda.synchronize()
        gc.collect()
        for ptr in pointers:
            cu.cuMemFree(ptr)


class Call:
    """One stepped collective: ``make(spoil, **extra)`` makes it on this rank's current
    arrays (the output one element too long where ``spoil``), ``fresh()`` puts every
    array in new memory (input: this rank's number plus one; output: UNTOUCHED),
    ``expected()`` is what a good call leaves in the output and ``untouched()`` whether
    the output still holds UNTOUCHED everywhere."""

    def __init__(self, op: str, communicator, stream, new) -> None:
        self.op, self.comm, self.stream, self.new = op, communicator, stream, new
        n = communicator.size
        self.inputs = {"all_gather": BLOCK, "all_reduce": BLOCK, "reduce_scatter": n * BLOCK}[op]
        self.outputs = {"all_gather": n * BLOCK, "all_reduce": BLOCK, "reduce_scatter": BLOCK}[op]
        self.fresh()

    def fresh(self) -> None:
        self.input = self.new(self.inputs)
        self.input.fill_(float(self.comm.rank + 1))
        self.output = self.new(self.outputs)
        self.spoilt = self.new(self.outputs + 1)
        self.output.fill_(UNTOUCHED)
        self.spoilt.fill_(UNTOUCHED)

    def make(self, spoil: bool, **extra):
        out = self.spoilt if spoil else self.output
        kwargs = {"stream": self.stream, "algo": "stepped", **extra}
        if self.op == "all_gather":
            return self.comm.all_gather(out, self.input, **kwargs)
        if self.op == "all_reduce":
            return self.comm.all_reduce(self.input, output=out, **kwargs)
        return self.comm.reduce_scatter(out, self.input, **kwargs)

    def expected(self):
        n = self.comm.size
        if self.op == "all_gather":
            ranks = torch.arange(1, n + 1, dtype=torch.float32, device=self.output.device)
            return ranks.repeat_interleave(BLOCK)
        return torch.full_like(self.output, n * (n + 1) / 2)

    def untouched(self) -> bool:
        return bool(torch.all(self.output == UNTOUCHED))


def _warmed(mpi, op: str, communicator, stream, new) -> Call:
    """A good first call of ``op``'s shape (the ranks agree on it; a guest's result passes
    through its result area 0, which then holds it), checked on every rank; then fresh
    arrays for the call to refuse."""
    call = Call(op, communicator, stream, new)
    call.make(False)
    communicator.synchronize(stream)
    assert all(mpi.allgather(bool(torch.equal(call.output, call.expected()))))
    call.fresh()
    return call


def _raise_where(call, communicator, stream) -> tuple[str, str, tuple]:
    """Make ``call`` then synchronize: where it raised ("call", "synchronize", or "nowhere",
    which the check then fails on every rank alike), the message and its notes (no
    traceback kept: it would hold a graph in a cycle)."""
    try:
        call()
    except CollectiveError as exc:
        return "call", str(exc), tuple(getattr(exc, "__notes__", ()))
    try:
        communicator.synchronize(stream)
    except CollectiveError as exc:
        return "synchronize", str(exc), tuple(getattr(exc, "__notes__", ()))
    return "nowhere", f"rank {communicator.rank}: neither the call nor synchronize() raised", ()


def _check_refused(mpi, communicator, op: str, argument: str, refuser: int,
                   raised: tuple[str, str, tuple], *, in_call: bool = True) -> None:
    where, message, notes = raised
    messages = mpi.allgather(message)
    assert len(set(messages)) == 1, messages
    assert "\n" not in message
    assert re.fullmatch(rf"{op}: rank {refuser}'s {argument} failed its check there; found on "
                        r"the GPU by every rank at call \d+ of this communicator, no element "
                        r"moved", message), message
    me = communicator.rank
    if in_call:
        assert where == ("call" if me == refuser else "synchronize"), where
    if me == refuser and where == "call":
        assert any("check said" in note for note in notes), notes


def _refused_everywhere(mpi, call: Call, make, argument: str, refuser: int, *,
                        in_call: bool = True) -> None:
    """``make()`` (a call, or nothing where a graph's replay made it) raises the refused
    call's line on every rank, and no element moved into any other rank's output."""
    communicator = call.comm
    raised = _raise_where(make, communicator, call.stream)
    _check_refused(mpi, communicator, call.op, argument, refuser, raised, in_call=in_call)
    untouched = communicator.rank == refuser or call.untouched()
    assert all(mpi.allgather(untouched)), mpi.allgather(untouched)


def _good_calls_right(mpi, call: Call) -> None:
    """Still in step: the next two good calls right on every rank (fresh memory: a guest
    copies its result out again)."""
    for _ in range(2):
        call.fresh()
        call.make(False)
        call.comm.synchronize(call.stream)
        right = bool(torch.equal(call.output, call.expected()))
        assert all(mpi.allgather(right)), mpi.allgather(right)


@contextlib.contextmanager
def _case(mpi, setup, op: str, who: str):
    """(a warmed call of ``op``, the rank that refuses it: ``who`` of the first
    time-sliced GPU), in fresh memory freed after the block."""
    group, communicator, stream = setup
    with fresh_memory(group.backend.device) as new:
        yield _warmed(mpi, op, communicator, stream, new), _refusers(group)[who]


@pytest.mark.parametrize("who", ["leader", "guest"])
@pytest.mark.parametrize("op", STEPPED)
def test_a_stepped_call_one_rank_refuses_is_every_ranks_error_and_moves_nothing(
        comm, setup, op, who):
    with _case(comm, setup, op, who) as (call, refuser):
        path, me = call.comm._path, call.comm.rank
        copies = path.guest_copies
        # No element moved: a guest's output stays as it was though its copy out of
        # result area 0 (which holds the call before's result) was enqueued.
        _refused_everywhere(comm, call, lambda: call.make(me == refuser), "output", refuser)
        # The test meant a copy in and out by every other guest, none by the refuser.
        role = path._time_sliced
        meant = 2 if role is not None and role.guest and me != refuser else 0
        copied = comm.allgather((path.guest_copies - copies, meant))
        assert all(made == want for made, want in copied), copied
        _good_calls_right(comm, call)


@pytest.mark.parametrize("who", ["leader", "guest"])
def test_a_spinning_algorithm_asked_for_by_name_is_refused_alike(comm, setup, who):
    """``algo="one-shot"`` by name where ranks take turns: no leader runs it, every rank
    launches its own kernel, which spins and waits out the others' time slices, as under
    MPS. Refused by one rank (its output one element long), every rank raises the same
    line, nothing moves, and the next good calls are right."""
    group, communicator, stream = setup
    refuser = _refusers(group)[who]
    with fresh_memory(group.backend.device) as new:
        call = Call("all_reduce", communicator, stream, new)
        call.make(False, algo="one-shot")   # the shape agreed at its first sight
        communicator.synchronize(stream)
        assert all(comm.allgather(bool(torch.equal(call.output, call.expected()))))
        call.fresh()
        me = communicator.rank
        _refused_everywhere(comm, call, lambda: call.make(me == refuser, algo="one-shot"),
                            "output", refuser)
        _good_calls_right(comm, call)


def _spoilt_input(call: Call, how: str):
    """This rank's input spoilt ``how``: of another dtype, or not contiguous (every other
    element of fresh memory twice as long)."""
    if how == "dtype":
        return call.input.double()
    wide = call.new(2 * call.inputs)
    wide.fill_(float(call.comm.rank + 1))
    return wide[::2]


# case -> (collective, the argument blamed, the refusing rank's call)
ARGUMENT_CASES = {
    "unknown op": ("all_reduce", "op", lambda call: call.make(False, op="prod")),
    "unknown algo": ("all_reduce", "algo", lambda call: call.make(False, algo="ring")),
    # The input's guess differs from the agreed call, the output's is it: blamed.
    "input of another dtype": ("all_gather", "output", lambda call: call.comm.all_gather(
        call.output, _spoilt_input(call, "dtype"), stream=call.stream, algo="stepped")),
    "input not contiguous": ("all_gather", "input", lambda call: call.comm.all_gather(
        call.output, _spoilt_input(call, "stride"), stream=call.stream, algo="stepped")),
}


@pytest.mark.parametrize("who", ["leader", "guest"])
@pytest.mark.parametrize("case", sorted(ARGUMENT_CASES))
def test_each_argument_check_one_rank_fails_is_every_ranks_error(comm, setup, who, case):
    op, argument, refused = ARGUMENT_CASES[case]
    with _case(comm, setup, op, who) as (call, refuser):
        make = (lambda: refused(call)) if call.comm.rank == refuser else (
            lambda: call.make(False))
        _refused_everywhere(comm, call, make, argument, refuser)
        _good_calls_right(comm, call)


@pytest.mark.parametrize("who", ["leader", "guest"])
def test_a_bound_call_one_rank_refuses_raises_on_every_rank_each_time(comm, setup, who):
    with _case(comm, setup, "all_gather", who) as (call, refuser):
        out = call.spoilt if call.comm.rank == refuser else call.output
        bound = call.comm.bind("all_gather", out, call.input, algo="stepped",
                               stream=call.stream)
        for _ in range(2):
            _refused_everywhere(comm, call, bound, "output", refuser)
        del bound
        _good_calls_right(comm, call)


@pytest.mark.parametrize("who", ["leader", "guest"])
def test_a_refused_call_captured_in_a_graph_replays_its_mark(comm, setup, who):
    with _case(comm, setup, "all_reduce", who) as (call, refuser):
        graph = torch.cuda.CUDAGraph()
        failure = None
        gc.collect()   # no earlier test's graph freed during the capture
        try:
            with torch.cuda.graph(graph, stream=call.stream):
                # Captured: nothing raised, not even on the refusing rank.
                call.make(call.comm.rank == refuser)
        except Exception as exc:
            failure = f"{type(exc).__name__}: {exc}"
        failures = comm.allgather(failure)
        if any(failures):
            pytest.fail(f"capture failed: {failures}")
        for _ in range(2):
            graph.replay()
            _refused_everywhere(comm, call, lambda: None, "output", refuser, in_call=False)
        del graph
        _good_calls_right(comm, call)


def test_an_all_to_all_v_one_rank_spoils_is_refused_alike_on_every_rank(comm, setup):
    """All-to-all needs every rank running at once: on a time-sliced GPU every rank
    refuses it alike before any argument check, so one rank's bad splits change nothing
    and the ranks stay in step."""
    group, communicator, stream = setup
    me, n = communicator.rank, communicator.size
    with fresh_memory(group.backend.device) as new:
        output, inp = new(n * BLOCK), new(n * BLOCK)
        receives = [BLOCK] * n
        receives[0] += int(me == 0)
        with pytest.raises(CollectiveError) as caught:
            communicator.all_to_all_v(output, inp, receives, [BLOCK] * n, stream=stream)
        message = str(caught.value)
        assert len(set(comm.allgather(message))) == 1
        assert "take turns on a GPU" in message, message
        _good_calls_right(comm, Call("all_reduce", communicator, stream, new))


@pytest.mark.parametrize("who", ["leader", "guest"])
def test_closing_after_a_refused_stepped_call_takes_under_a_second(comm, who):
    with torch_communicator("cuda-vmm", 1 << 20) as (group, communicator, stream):
        _skip_unless_time_sliced(comm, group, communicator)
        refuser, me = _refusers(group)[who], communicator.rank
        with fresh_memory(group.backend.device) as new:
            call = Call("reduce_scatter", communicator, stream, new)
            # The call's first sight: the refusing rank's guess is agreed with the others.
            _refused_everywhere(comm, call, lambda: call.make(me == refuser), "output",
                                refuser)
        assert_closes_within_a_second(comm, communicator, group)
