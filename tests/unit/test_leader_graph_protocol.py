"""The leader all-gather's protocol in CUDA graphs on GPUs that take turns, run on a model
of the node (no GPU): every rank's stream is the list of stream operations that the real
code enqueues (WindowBarriers.graph_party_barrier, CudaEngine.make_party_flag_barrier,
LeaderAllGather._bind_for_graphs), executed against a model of the signal pads, with the
streams advancing in every order a scheduler may pick. The checks: no stream waits for
ever, a leader's scatter kernel of call k starts only once every rank of the node has
reached call k, and no rank's call k ends before every scatter of call k has run."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from ipcshare.backends.cuda_engine import CudaEngine
from ipcshare.patterns.allgather_leader import LeaderAllGather
from ipcshare.window.barriers import WindowBarriers


class Pad:
    def __init__(self, owner: int) -> None:
        self.owner = owner


class StreamRecorder:
    """What one rank's code enqueues: batches of (write | wait) steps, kernels, markers."""

    def __init__(self) -> None:
        self.items: list[tuple] = []
        self.stream = 0

    def make_signal_batch(self, steps: list[tuple], *, timeout: float):
        for step in steps:
            assert step[0] in ("write", "wait") and isinstance(step[1], Pad)
        frozen = [(kind, pad.owner, slot, value) for kind, pad, slot, value, *_ in steps]
        return lambda: self.items.append(("batch", frozen))

    # The real composition of a party barrier's steps, on this recorder.
    make_party_flag_barrier = CudaEngine.make_party_flag_barrier


def node(ranks: int, leader: list[int], calls: int) -> dict[int, list[tuple]]:
    """Every rank's stream after ``calls`` leader all-gathers captured in a graph."""
    pads = {rank: Pad(rank) for rank in range(ranks)}
    streams = {}
    for me in range(ranks):
        engine = StreamRecorder()
        world = SimpleNamespace(
            rank=me, local_size=ranks, local_ranks=list(range(ranks)),
            where=lambda rank=None, me=me: f"rank {me if rank is None else rank}@node",
            local_index=lambda rank: rank)
        parts = SimpleNamespace(world=world, paths=SimpleNamespace(has_fallbacks=False),
                                signal_timeout=1.0, engine=engine)
        barriers = WindowBarriers(parts, pads=pads, watch=None)
        view = SimpleNamespace(
            rank=me, world_size=ranks, engine=engine, stream=0, signal_timeout=1.0,
            signal_pad=lambda rank: pads[rank],
            graph_party_barrier=lambda stream, parties, b=barriers, e=engine:
                b.graph_party_barrier(e, parties))
        pattern = LeaderAllGather()
        pattern._scatter = lambda window, plan, mode, lead, e=engine, me=me: (
            lambda: e.items.append(("scatter", me)))
        op = pattern._bind_for_graphs(view, None, "out-of-place", leader)
        for call in range(calls):
            engine.items.append(("begin", call))
            op()
            engine.items.append(("end", call))
        streams[me] = engine.items
    return streams


def run(streams: dict[int, list[tuple]], leader: list[int], seed: int) -> None:
    """Execute the streams against one memory of pad words, in a random order of ready
    streams; assert the protocol's promises at every scatter and every call's end."""
    rng = random.Random(seed)
    memory: dict[tuple[int, int], int] = {}
    position = {rank: 0 for rank in streams}
    step_in_batch = {rank: 0 for rank in streams}
    reached = {rank: -1 for rank in streams}   # the latest call each stream has begun
    scatters: dict[int, int] = {}              # leader -> calls whose scatter has run
    leaders = sorted(set(leader))

    def advance(rank: int) -> None:
        item = streams[rank][position[rank]]
        if item[0] == "begin":
            reached[rank] = item[1]
        elif item[0] == "end":
            call = item[1]
            for lead in leaders:  # every block of call k landed before call k ends
                assert scatters.get(lead, 0) > call, (rank, call, lead)
        elif item[0] == "scatter":
            call = scatters.get(rank, 0)
            for other in streams:  # every rank reached call k: input ready, output free
                assert reached[other] >= call, (rank, call, other)
            scatters[rank] = call + 1
        else:  # a batch, one step at a time (a wait only when can_advance says it is met)
            steps = item[1]
            kind, owner, slot, value = steps[step_in_batch[rank]]
            if kind == "write":
                memory[(owner, slot)] = value
            step_in_batch[rank] += 1
            if step_in_batch[rank] < len(steps):
                return
            step_in_batch[rank] = 0
        position[rank] += 1

    def can_advance(rank: int) -> bool:
        items = streams[rank]
        if position[rank] == len(items):
            return False
        item = items[position[rank]]
        if item[0] != "batch":
            return True
        kind, owner, slot, value = item[1][step_in_batch[rank]]
        return kind == "write" or memory.get((owner, slot), 0) >= value

    while any(position[rank] < len(streams[rank]) for rank in streams):
        ready = [rank for rank in streams if can_advance(rank)]
        assert ready, f"every stream waits: {position}"
        advance(rng.choice(ready))


@pytest.mark.parametrize("leader", [
    [0, 1, 0, 3],        # ranks 0 and 2 share a GPU; 1 and 3 have their own
    [0, 0],              # two ranks on one GPU
    [0, 0, 0, 0, 0],     # five ranks on one GPU
    [0, 1, 2, 3, 0],     # five ranks on four GPUs (the case)
    [0, 1, 0, 1],        # two GPUs, two ranks each
])
def test_the_graph_protocol_never_hangs_and_orders_every_scatter(leader):
    streams = node(len(leader), leader, calls=6)
    for seed in range(40):
        run(streams, leader, seed)


def test_guests_put_one_batch_per_call_on_their_streams():
    leader = [0, 1, 2, 3, 0]
    streams = node(5, leader, calls=3)
    guest = [item for item in streams[4] if item[0] == "batch"]
    assert len(guest) == 3   # one hand-over per call, no barrier
    assert [kind for kind, *_ in guest[0][1]] == ["write", "wait", "write"]
    # The leader of the shared GPU meets both barriers and takes and releases its guest.
    lead = [item for item in streams[0] if item[0] == "batch"]
    assert len(lead) == 3 * 4
