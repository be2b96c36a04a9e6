"""The landing-zone protocol of the Triton examples (examples/triton_allgather.py up to
ZONE_MAX_BYTES, examples/triton_allreduce_rmsnorm.py) replayed on the host with every rank
a generator stepped in random order (tests/block_replay.py): each call stores its block
into every peer's zone of the call's parity, signals, waits for every peer's signal of the
call and then reads its zone. Every read must find the block of the same call, and a
single zone (parity ignored) must be caught: a rank a call ahead overwrites a block its
peer has not read yet."""

from __future__ import annotations

import random

import pytest

from ..block_replay import run_in_random_order

CALLS = 6


def _replay(ranks: int, seed: int, zones: int) -> list[str]:
    """Replay CALLS calls of ``ranks`` ranks (one program each, a stream's order between
    its calls) with ``zones`` landing zones; the reads that found another call's block."""
    rng = random.Random(seed)
    zone = [[[None] * ranks for _ in range(zones)] for _ in range(ranks)]  # [rank][z][sender]
    flags = [[0] * ranks for _ in range(ranks)]                            # [rank][sender]
    wrong: list[str] = []

    def rank(me: int):
        peers = [q for q in range(ranks) if q != me]
        for call in range(1, CALLS + 1):
            z = call % zones
            for q in rng.sample(peers, len(peers)):   # the stores, in any order
                yield None
                zone[q][z][me] = (call, me)
            yield None
            for q in peers:                            # release, then the signals
                flags[q][me] = call
            for q in peers:                            # acquire: every peer's signal
                yield ("flag", me, q, call)
            for q in rng.sample(peers, len(peers)):   # the copy-out, in any order
                yield None
                if zone[me][z][q] != (call, q):
                    wrong.append(f"rank {me} call {call} read {zone[me][z][q]} of rank {q}")

    def ready(need) -> bool:
        _, me, peer, call = need
        return flags[me][peer] >= call

    run_in_random_order([rank(r) for r in range(ranks)], ready, rng)
    return wrong


@pytest.mark.parametrize("ranks", [2, 3, 4, 8])
def test_two_zones_by_parity_never_let_a_block_be_overwritten_before_it_is_read(ranks):
    for seed in range(200):
        assert _replay(ranks, seed, zones=2) == [], seed


@pytest.mark.parametrize("ranks", [2, 4])
def test_one_zone_is_caught(ranks):
    # A peer that heard our signal of call k stores its block of call k + 1 into the zone
    # we may still be reading: some order shows it.
    assert any(_replay(ranks, seed, zones=1) for seed in range(200))
