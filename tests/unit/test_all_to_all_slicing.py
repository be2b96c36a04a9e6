"""The GPU all-to-all's plan of work (kernels/src/collectives/all_to_all.cuh), replayed on
numpy without a GPU: every block stages slice b of each segment it sends, meets block b of
every peer, then reads slice b of each segment addressed to it. The kernel's correctness
rests on one property, that both ends cut a segment into the same slices from its length
alone, so a block's barrier covers exactly what it reads. Here the blocks run in a shuffled
order with everything unstaged poisoned: a read of a byte another block (or no block)
staged shows as poison in the output. block_slice mirrors call.cuh's. The balanced
kernel's plan, which cuts by bytes, is replayed from its own header's code in
test_all_to_all_balanced_plan.py."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ..hypothesis_profiles import examples

POISON = 0xA5


def block_slice(n: int, granule: int, block: int, blocks: int) -> tuple[int, int]:
    """call.cuh's block_slice: equal runs of whole granules, the last ones short or empty."""
    granules = (n + granule - 1) // granule
    per = (granules + blocks - 1) // blocks * granule
    return min(per * block, n), min(per * block + per, n)


def run_kernel(sends: np.ndarray, inputs: list[np.ndarray], itemsize: int, blocks: int,
               order: list[int], capacity: int, *, whole_input_cut: bool = False,
               ) -> list[np.ndarray]:
    """The kernel's data movement over every rank, block by block in ``order``:
    ``sends[q, r]`` elements from rank q to rank r, ``inputs[q]`` rank q's bytes.
    ``whole_input_cut``: senders stage slice b of their whole input instead (the other
    one-barrier kernels' rule), to show what the segment rule prevents."""
    n = len(inputs)
    staging = [np.full_like(data, POISON) for data in inputs]
    outputs = [np.full(capacity * itemsize, POISON, np.uint8) for _ in range(n)]
    send_at = np.concatenate([np.zeros((n, 1), np.int64), np.cumsum(sends, axis=1)], axis=1)
    for b in order:                                  # block b on every rank: stage
        for q in range(n):
            if whole_input_cut:
                lo, hi = block_slice(inputs[q].nbytes, 16, b, blocks)
                staging[q][lo:hi] = inputs[q][lo:hi]
                continue
            for r in range(n):
                first = int(send_at[q, r]) * itemsize
                lo, hi = block_slice(int(sends[q, r]) * itemsize, 16, b, blocks)
                staging[q][first + lo:first + hi] = inputs[q][first + lo:first + hi]
        for me in range(n):                          # ... meets, then reads
            for step in range(n):
                q = (me + step) % n
                start = int(sends[q, :me].sum()) * itemsize
                place = int(sends[:q, me].sum()) * itemsize
                lo, hi = block_slice(int(sends[q, me]) * itemsize, 16, b, blocks)
                outputs[me][place + lo:place + hi] = staging[q][start + lo:start + hi]
    return outputs


@settings(max_examples=examples(300), deadline=None)
@given(st.integers(1, 8).flatmap(lambda n: st.tuples(
    st.just(n), st.sampled_from([1, 2, 4, 8]), st.integers(1, 9),
    st.lists(st.integers(0, 40), min_size=n * n, max_size=n * n), st.randoms())))
def test_every_byte_arrives_from_the_block_that_staged_it(drawn):
    n, itemsize, blocks, flat, rng = drawn
    sends = np.array(flat, np.int64).reshape(n, n)
    inputs = [np.random.default_rng([q, 7]).integers(0, 255, int(sends[q].sum()) * itemsize,
                                                       dtype=np.uint8) for q in range(n)]
    order = list(range(blocks))
    rng.shuffle(order)
    capacity = int(sends.sum(axis=0).max()) + 2
    outputs = run_kernel(sends, inputs, itemsize, blocks, order, capacity)
    for me in range(n):
        want = np.concatenate([inputs[q][int(sends[q, :me].sum()) * itemsize:
                                         int(sends[q, :me + 1].sum()) * itemsize]
                               for q in range(n)])
        assert np.array_equal(outputs[me][:want.nbytes], want)
        assert np.all(outputs[me][want.nbytes:] == POISON)   # nothing past the received


def test_senders_cutting_their_whole_input_would_deliver_unstaged_bytes():
    """The property matters (and the replay can fail): senders that cut their whole input
    into block slices, as the other one-barrier kernels do, stage some bytes in another
    block than the one that reads them, and run in that order poison is delivered."""
    sends = np.array([[40, 40], [40, 40]], np.int64)
    inputs = [np.arange(80, dtype=np.uint8) + 1, np.arange(80, dtype=np.uint8) + 81]  # no 0xA5
    outputs = run_kernel(sends, inputs, 1, 2, [1, 0], 80, whole_input_cut=True)
    assert any(np.any(out == POISON) for out in outputs)
    right = run_kernel(sends, inputs, 1, 2, [1, 0], 80)
    assert not any(np.any(out == POISON) for out in right)
