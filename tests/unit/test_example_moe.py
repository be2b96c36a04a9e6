"""The mixture-of-experts example's model, reference and checks, without MPI: its
arithmetic is exact in float32 (what lets it compare bit for bit, also the GPU's float32
scores), the reference's splits and rows agree across ranks, and the check counts a
single wrong bit, a wrong count and a wrong shape."""

from __future__ import annotations

import numpy as np
import pytest

from ..example_runs import load_example

moe = load_example("moe_dispatch")


def _layer(ranks: int, experts: int, tokens: int = 257, hidden: int = 33):
    return moe.Layer(ranks=ranks, tokens=tokens, hidden=hidden, experts=experts)


def test_scores_and_expert_outputs_are_exact_in_float32_at_the_largest_sizes():
    hidden, experts = moe.MAX_HIDDEN, 2
    # The largest scores: every feature at its extreme against the extreme weight.
    tokens = np.full((1, hidden), -8, np.float32)
    weights = np.full((hidden, experts), 2, np.float32)
    weights[:, 1] = -2
    scores = tokens @ weights   # float32 sums, as the GPU adds them
    assert scores.tolist() == [[-16.0 * hidden, 16.0 * hidden]]
    assert moe.route(tokens, weights).tolist() == [1]
    rows = np.array([[-8, 7]], np.float32)
    top = moe.MAX_EXPERTS - 1
    out = moe.apply_experts(np.repeat(rows, 2, axis=0), np.array([0, top]))
    assert out.tolist() == [[-8, 7], [-8 * (top + 1) + top, 7 * (top + 1) + top]]


def test_the_router_takes_the_lowest_of_equal_scores_and_matches_float32_scores():
    weights = moe.router_weights(3, 64, 8)
    tokens = moe.make_tokens(3, 0, 0, 500, 64)
    float32 = np.argmax((tokens @ weights).astype(np.int64) * 8 + np.arange(7, -1, -1),
                        axis=1)
    assert np.array_equal(moe.route(tokens, weights), float32)
    assert moe.route(np.zeros((1, 64), np.float32), weights).tolist() == [0]
    assert set(moe.route(tokens, weights)) == set(range(8))   # every expert gets work


@pytest.mark.parametrize("ranks,experts", [(1, 2), (3, 6), (4, 4), (4, 16)])
def test_the_reference_moves_every_token_once_and_its_splits_agree_across_ranks(ranks,
                                                                                experts):
    layer, seed, step = _layer(ranks, experts), 11, 2
    weights = moe.router_weights(seed, layer.hidden, layer.experts)
    expected = [moe.reference(layer, weights, seed, step, r) for r in range(ranks)]
    for r in range(ranks):
        for q in range(ranks):   # what q sends r is what r receives from q
            assert expected[q].sent_splits[r] == expected[r].received_splits[q]
        assert expected[r].received.size == expected[r].received_splits.sum()
        assert expected[r].sent_splits.sum() == layer.tokens * layer.hidden
    every = np.concatenate([moe.make_tokens(seed, r, step, layer.tokens, layer.hidden)
                            for r in range(ranks)])
    arrived = np.concatenate([e.received for e in expected])
    assert np.array_equal(np.sort(arrived.view(np.uint32), axis=None),
                          np.sort(every.view(np.uint32), axis=None))
    tokens = moe.make_tokens(seed, 0, step, layer.tokens, layer.hidden)
    experts_of = moe.route(tokens, weights)
    assert np.array_equal(expected[0].result,
                          tokens * (experts_of[:, None] + 1) + experts_of[:, None])


def test_the_check_counts_one_wrong_bit_a_wrong_count_and_a_wrong_shape():
    layer = _layer(2, 4)
    weights = moe.router_weights(0, layer.hidden, layer.experts)
    expected = moe.reference(layer, weights, 0, 0, 1)

    def outcome(**changes):
        fields = {"received": expected.received.copy(),
                  "received_splits": expected.received_splits.copy(),
                  "returned_splits": expected.sent_splits.copy(),
                  "result": expected.result.copy()}
        fields.update(changes)
        return moe.Outcome(**fields)

    assert sum(moe.compare(expected, outcome()).values()) == 0
    result = expected.result.copy()
    result[3, 4] = -result[3, 4] if result[3, 4] else -0.0   # one sign bit
    wrong = moe.compare(expected, outcome(result=result))
    assert wrong == {"counts received": 0, "counts returned": 0, "tokens received": 0,
                     "combined tokens": 1}
    assert moe.describe_wrong(wrong) == "1 wrong in the combined tokens"
    splits = expected.received_splits.copy()
    splits[0] -= layer.hidden
    assert moe.compare(expected, outcome(received_splits=splits,
                                         received=expected.received[1:]))[
        "counts received"] == 1
    assert moe.compare(expected, outcome(received=expected.received[1:]))[
        "tokens received"] == expected.received.size
    nan = np.full_like(expected.result, np.nan)   # what a step never wrote
    assert moe.compare(expected, outcome(result=nan))["combined tokens"] == nan.size


def test_the_communicator_holds_the_worst_case_inbox_and_the_count_exchange():
    assert _layer(4, 8, tokens=100, hidden=16).max_bytes == 4 * 100 * 16 * 4
    assert _layer(3, 12, tokens=1, hidden=1).max_bytes == 12 * 8
