"""The leader all-gather's protocol in CUDA graphs on GPUs that take turns, run on a model
of the node (no GPU): every rank's stream is the list of stream operations that the real
code enqueues (WindowBarriers.graph_party_barrier, CudaEngine.make_party_flag_barrier,
LeaderAllGather._bind_for_graphs), executed against a model of the signal pads, with the
streams advancing in every order a scheduler may pick. The checks: no stream waits for
ever, a leader's scatter kernel of call k starts only once every rank of the node has
reached call k, and no rank's call k ends before every scatter of call k has run."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ipcshare.patterns.allgather_leader import LeaderAllGather
from ipcshare.window.barriers import WindowBarriers

from .stream_model import Pad, StreamRecorder, run_streams


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
    """Execute the streams in the order ``seed`` draws; assert the protocol's promises at
    every scatter and every call's end."""
    reached = {rank: -1 for rank in streams}   # the latest call each stream has begun
    scatters: dict[int, int] = {}              # leader -> calls whose scatter has run
    leaders = sorted(set(leader))

    def on_item(rank: int, item: tuple) -> None:
        if item[0] == "begin":
            reached[rank] = item[1]
        elif item[0] == "end":
            call = item[1]
            for lead in leaders:  # every block of call k landed before call k ends
                assert scatters.get(lead, 0) > call, (rank, call, lead)
        else:  # a scatter kernel
            call = scatters.get(rank, 0)
            for other in streams:  # every rank reached call k: input ready, output free
                assert reached[other] >= call, (rank, call, other)
            scatters[rank] = call + 1
    run_streams(streams, seed, on_item)


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
