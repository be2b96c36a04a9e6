"""The stepped collectives' protocol on GPUs that take turns, run on a model of the node (no
GPU): every rank's stream is what the real code enqueues for a call (the stepped
algorithm's run, LeaderSteps for a GPU's lowest rank and its guests, GuestSteps for a
guest, the flag barriers of a rank with a GPU of its own), executed against a model of the
signal pads with the streams advancing in random orders. Layouts include 5 ranks on 4
GPUs, which no GPU node has run yet. The checks: no stream waits for ever; the work kernel
of call k, for any rank, runs only after every rank's staging kernel of call k (every
input staged, every header published); a guest's staging kernel runs only after the guest
reached the call; and no rank's call k ends while a work kernel of call k may still read
its input. And a guest that copies its output out of result area 0 does so only where its
call was done: never after a call that failed (one a rank refused), whatever came before."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ipcshare.collectives.agreement import Signature
from ipcshare.collectives.algorithms.gpu_kernel import GpuCall
from ipcshare.collectives.algorithms.gpu_stepped import GpuSteppedAllReduce
from ipcshare.collectives.time_sliced import GuestSteps, LeaderSteps, TimeSlicedRole
from ipcshare.kernels.launcher import CollectiveArgs
from ipcshare.window.layout import FLAG_BARRIER_RANKS, FLAG_BARRIER_SLOT_BASE, GUEST_RESULT_SLOT

from .stream_model import Pad, StreamRecorder, run_streams


def _kind(entry: str) -> str:
    return "stage" if entry.startswith("stage_and_publish") else "work"


def node(leader: list[int], calls: int, *, copy_out: bool = False) -> dict[int, list[tuple]]:
    """Every rank's stream after ``calls`` stepped all-reduces of 1 Ki float32
    (``copy_out``: each guest's output out of its leader's reach, copied out of result
    area 0 by its own kernel after each call)."""
    size = len(leader)
    pads = {rank: Pad(rank) for rank in range(size)}
    signature = Signature("all_reduce", 1024, "float32", 4, "sum", "stepped")
    algorithm = GpuSteppedAllReduce()
    time_sliced = {lead for lead in leader if leader.count(lead) > 1}
    streams = {}
    for me in range(size):
        engine = StreamRecorder()
        window = SimpleNamespace(signal_pad=lambda rank: pads[rank],
                                 local=SimpleNamespace(ptr=0))

        def copy_out_kernel(entry, blocks, stream, address, e=engine, me=me):
            e.items.append(("kernel", "copy out", (me,)))
        path = SimpleNamespace(window=window, rank=me, size=size,
                               group=SimpleNamespace(signal_timeout=1.0),
                               copier=lambda engine, jobs: (lambda: None),
                               launch=copy_out_kernel)
        guests = [rank for rank in range(size) if leader[rank] == leader[me]
                  and rank != leader[me]]

        def launch_own(entry, blocks, parties=1, e=engine, me=me, guests=guests):
            # One launch runs the kernel for this rank and, row by row, its guests.
            e.items.append(("kernel", _kind(entry), (me, *guests[:parties - 1])))

        def run_now(step):
            step()
        steps = None
        if leader[me] in time_sliced:
            role = TimeSlicedRole(path, leader[me], guests)
            if role.guest:
                steps = GuestSteps(role, engine, run_now)
                steps.placement = SimpleNamespace(
                    copy_in=False, copy_out=copy_out, output_offset=4096,
                    words=lambda digest: {0: digest, 1: 0, 2: 0})
                steps.digest = signature.digest
                steps.output = (0x10000, 4096)
            else:
                args = CollectiveArgs()
                steps = LeaderSteps(role, engine, args, launch_own, run_now)
                assert args.guest_mask == sum(1 << guest for guest in guests)
        others = [r for r in range(size) if r != me]
        meetings = [engine.make_flag_barrier(
            pads[me], [pads[r] for r in others], base + me, [base + r for r in others],
            timeout=1.0, what=str)
            for base in (FLAG_BARRIER_SLOT_BASE, FLAG_BARRIER_SLOT_BASE + FLAG_BARRIER_RANKS)]
        call = GpuCall(signature, size, launch_own, 1 << 20,
                       meet=lambda turn, m=meetings: m[turn](), max_blocks=8,
                       time_sliced=steps)
        for number in range(calls):
            engine.items.append(("begin", number))
            algorithm.run(call)
            engine.items.append(("end", number))
        streams[me] = engine.items
    return streams


def run(streams: dict[int, list[tuple]], seed: int, failed: frozenset[int] = frozenset()
        ) -> None:
    """Execute the streams in the order ``seed`` draws; assert the protocol's promises at
    every kernel and every call's end. The calls numbered in ``failed`` fail (a rank
    refused them): their work kernels do nothing, so they set no guest's RESULT word."""
    reached = {rank: -1 for rank in streams}
    staged = {rank: 0 for rank in streams}   # staging kernels run, by party
    worked = {rank: 0 for rank in streams}   # work kernels run, by party
    copied = {rank: 0 for rank in streams}   # copies out, by guest
    memory: dict[tuple[int, int], int] = {}

    def on_item(rank: int, item: tuple) -> None:
        if item[0] == "begin":
            reached[rank] = item[1]
        elif item[0] == "end":
            for party in streams:  # nobody still reads this rank's input of call k
                assert worked[party] > item[1], (rank, item[1], party)
        elif item[1] == "copy out":   # a guest's own kernel: result area 0 to its output
            call = copied[rank]
            done = memory.get((rank, GUEST_RESULT_SLOT), 0) == 1
            assert done == (call not in failed), (rank, call, done)
            copied[rank] = call + 1
        else:  # a kernel, run for this rank and, row by row, its guests
            _, kind, parties = item
            for party in parties:
                if kind == "stage":
                    call = staged[party]
                    assert reached[party] >= call, (rank, party, call)  # handed over
                    staged[party] = call + 1
                else:
                    call = worked[party]
                    for other in streams:  # every input of call k staged, headers out
                        assert staged[other] > call, (rank, party, call, other)
                    worked[party] = call + 1
                    if party != rank and call not in failed:   # a guest's row: done
                        memory[(party, GUEST_RESULT_SLOT)] = 1
    run_streams(streams, seed, on_item, memory)


@pytest.mark.parametrize("leader", [
    [0, 0],              # two ranks on one GPU
    [0, 0, 0],           # three
    [0, 1, 0],           # ranks 0 and 2 share GPU 0, rank 1 has GPU 1
    [0, 1, 2, 3, 0],     # five ranks on four GPUs
    [0, 1, 0, 1],        # two GPUs, two ranks each
])
def test_stepped_calls_on_time_sliced_gpus_never_hang_and_stay_ordered(leader):
    streams = node(leader, calls=5)
    kernels = {rank: [item[2] for item in items if item[0] == "kernel"]
               for rank, items in streams.items()}
    for rank, lead in enumerate(leader):
        # A leader launches each kernel once for every rank of its GPU; guests launch none.
        parties = tuple(r for r in range(len(leader)) if leader[r] == lead)
        assert kernels[rank] == ([parties] * 10 if rank == lead else []), (rank, kernels)
    for seed in range(40):
        run(streams, seed)


def test_the_model_finds_a_release_before_the_second_meeting(monkeypatch):
    # The same model fails when the leader releases its guests before the last meeting.
    original = GpuSteppedAllReduce.run

    def early_release(self, call):
        shared = call.time_sliced
        if shared is None or shared.guest:
            return original(self, call)
        release, meet = shared.release_guests, shared.meet

        def meet_after_release(turn):
            if turn == 1:
                release()
            meet(turn)
        shared.meet = meet_after_release
        shared.release_guests = lambda: None
        try:
            original(self, call)
        finally:
            del shared.meet, shared.release_guests
    monkeypatch.setattr(GpuSteppedAllReduce, "run", early_release)
    streams = node([0, 1, 0], calls=3)
    with pytest.raises(AssertionError):
        for seed in range(40):
            run(streams, seed)



@pytest.mark.parametrize("leader", [[0, 0, 0], [0, 1, 0, 1], [0, 1, 2, 3, 0]])
def test_a_guest_copies_its_result_out_only_after_a_call_that_was_done(leader):
    """Calls 1 and 2 fail (a rank refused them) between good ones: each guest's copy out
    finds its RESULT word 1 after a good call and 0 after a failed one, in every order of
    the streams: the word is cleared with the call's words before READY and set by the
    leader's work kernel, which ends before DONE, and the copy out comes after DONE."""
    streams = node(leader, calls=5, copy_out=True)
    guests = [rank for rank, lead in enumerate(leader) if rank != lead]
    assert all(sum(item[1] == "copy out" for item in streams[guest]) == 5 for guest in guests)
    for seed in range(40):
        run(streams, seed, failed=frozenset({1, 2}))


def test_the_model_finds_a_result_word_left_from_the_call_before(monkeypatch):
    # The same model fails where the guest's batch does not clear the word (a failed
    # call after a good one would copy the good one's result out again).
    from ipcshare.collectives import time_sliced

    monkeypatch.setattr(time_sliced, "GUEST_RESULT_SLOT", GUEST_RESULT_SLOT + 1)
    streams = node([0, 0], calls=3, copy_out=True)
    with pytest.raises(AssertionError):
        for seed in range(40):
            run(streams, seed, failed=frozenset({1}))
