"""The mixture-of-experts example's model, reference and checks, without MPI: its
arithmetic is exact in float32 and bfloat16 up to the limits it states (what lets it
compare bit for bit, also the GPU's float32 scores), top-k routing picks each token's k
best experts, the reference's splits and rows agree across ranks, the check counts a
single wrong bit, a wrong count and a wrong shape, and (where torch is installed) the GPU
step's torch arithmetic, run on one rank's CPU tensors, gives the reference's results."""

from __future__ import annotations

import numpy as np
import pytest

from ipcshare.collectives.arrays import to_numpy_dtype

from ..example_runs import load_example

moe = load_example("moe_dispatch")


def _layer(ranks: int, experts: int, tokens: int = 257, hidden: int = 33, topk: int = 1,
           dtype: str = "float32"):
    return moe.Layer(ranks=ranks, tokens=tokens, hidden=hidden, experts=experts, topk=topk,
                     dtype=dtype)


def test_scores_are_exact_in_float32_at_the_largest_hidden_size():
    hidden, experts = moe.MAX_HIDDEN, 2
    # The largest scores: every feature at its extreme against the extreme weight.
    tokens = np.full((1, hidden), moe.TOKEN_LOW, np.float32)
    weights = np.full((hidden, experts), moe.WEIGHT, np.float32)
    weights[:, 1] = -moe.WEIGHT
    scores = tokens @ weights   # float32 sums, as the GPU adds them
    assert scores.tolist() == [[-16.0 * hidden, 16.0 * hidden]]
    assert moe.route(tokens, weights).tolist() == [[1]]
    assert moe.inexact("float32", hidden, 1) is None
    assert "--hidden 1048577" in moe.inexact("float32", hidden + 1, 1)


def test_expert_outputs_reach_their_bound_and_k_of_them_add_up_exactly_in_bfloat16():
    bf16 = to_numpy_dtype("bfloat16")
    top, bottom = np.array([[moe.TOKEN_HIGH - 1]], bf16), np.array([[moe.TOKEN_LOW]], bf16)
    # Expert 23 scales by 3 and adds 7; expert 8 scales by 3 and adds 0.
    assert moe.apply_experts(top, np.array([23])).tolist() == [[moe.MAX_EXPERT_OUTPUT]]
    assert moe.apply_experts(bottom, np.array([8])).tolist() == [[-24]]
    k = moe.max_topk("bfloat16")
    assert (k, moe.max_topk("float32")) == (9, (1 << 24) // 28)
    # Every partial sum of k outputs at the bound stays an exact bfloat16 integer...
    partial = np.arange(1, k + 1) * moe.MAX_EXPERT_OUTPUT
    assert np.array_equal(partial.astype(bf16).astype(np.int64), partial)
    # ...and one past the limit is where bfloat16 starts to skip integers.
    assert np.float32(np.float32(moe.EXACT_INTEGERS["bfloat16"] + 1).astype(bf16)) != 257
    assert moe.inexact("bfloat16", 7168, k) is None
    assert "--topk 10 with --dtype bfloat16" in moe.inexact("bfloat16", 7168, k + 1)
    assert moe.inexact("float32", 7168, 10) is None


def test_the_router_takes_the_lowest_of_equal_scores_and_matches_float32_scores():
    weights = moe.router_weights(3, 64, 8)
    tokens = moe.make_tokens(3, 0, 0, 500, 64)
    keys = (tokens @ weights).astype(np.int64) * 8 + np.arange(7, -1, -1)
    assert np.array_equal(moe.route(tokens, weights)[:, 0], np.argmax(keys, axis=1))
    assert moe.route(np.zeros((1, 64), np.float32), weights, 3).tolist() == [[0, 1, 2]]
    assert set(moe.route(tokens, weights)[:, 0]) == set(range(8))   # every expert gets work


@pytest.mark.parametrize("topk", [1, 3, 8])
def test_top_k_routing_picks_distinct_experts_best_first(topk):
    weights = moe.router_weights(5, 48, 8)
    tokens = moe.make_tokens(5, 1, 0, 300, 48, "bfloat16")
    chosen = moe.route(tokens, weights, topk)
    scores = tokens.astype(np.float64) @ weights.astype(np.float64)
    assert chosen.shape == (300, topk)
    assert all(len(set(row)) == topk for row in chosen.tolist())
    picked = np.take_along_axis(scores, chosen, axis=1)
    assert np.all(np.diff(picked, axis=1) <= 0)   # best first
    # No expert left out scores above the worst one taken (ties: the lowest expert).
    for row, experts in zip(scores, chosen, strict=True):
        left = np.setdiff1d(np.arange(8), experts)
        worst = row[experts[-1]]
        assert not np.any(row[left] > worst)
        assert not np.any((row[left] == worst) & (left < experts[-1]))


@pytest.mark.parametrize("ranks,experts,topk,dtype", [
    (1, 2, 1, "float32"), (3, 6, 1, "float32"), (4, 4, 1, "float32"), (4, 16, 1, "float32"),
    (2, 8, 3, "float32"), (3, 12, 9, "bfloat16"), (4, 8, 8, "bfloat16")])
def test_the_reference_moves_every_pair_once_and_its_splits_agree_across_ranks(
        ranks, experts, topk, dtype):
    layer, seed, step = _layer(ranks, experts, topk=topk, dtype=dtype), 11, 2
    weights = moe.router_weights(seed, layer.hidden, layer.experts)
    expected = [moe.reference(layer, weights, seed, step, r) for r in range(ranks)]
    for r in range(ranks):
        for q in range(ranks):   # what q sends r is what r receives from q
            assert expected[q].sent_splits[r] == expected[r].received_splits[q]
        assert expected[r].received.size == expected[r].received_splits.sum()
        assert expected[r].sent_splits.sum() == layer.tokens * topk * layer.hidden
    every = np.concatenate([np.repeat(moe.make_tokens(seed, r, step, layer.tokens,
                                                      layer.hidden, dtype), topk, axis=0)
                            for r in range(ranks)])
    arrived = np.concatenate([e.received for e in expected])
    bits = f"u{every.itemsize}"
    assert np.array_equal(np.sort(arrived.view(bits), axis=None),
                          np.sort(every.view(bits), axis=None))
    tokens = moe.make_tokens(seed, 0, step, layer.tokens, layer.hidden, dtype)
    chosen = moe.route(tokens, weights, topk).astype(np.int64)
    want = sum(tokens.astype(np.int64) * (1 + chosen[:, [j]] % 3) + chosen[:, [j]] % 8
               for j in range(topk))
    assert expected[0].result.dtype == tokens.dtype
    assert np.array_equal(expected[0].result.astype(np.int64), want)


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


def test_the_communicator_holds_what_the_step_moves_at_top_k_in_bfloat16():
    layer = _layer(2, 8, tokens=100, hidden=16, topk=3, dtype="bfloat16")
    assert (layer.pairs, layer.capacity, layer.itemsize) == (300, 600, 2)
    assert layer.max_bytes == 600 * 16 * 2
    assert layer.exchanged_bytes == 2 * (300 + 600) * 16 * 2 + 2 * 8 * 8
    assert layer.describe() == "100 tokens x 16 bfloat16 per rank, 8 experts (top-3) on 2 rank(s)"


class _OneRankExchange:
    """The exchanges of a world of one rank on CPU tensors: every row stays, so the step's
    own arithmetic (routing, sorting, experts, merge) is what the reference checks."""

    rank = 0

    def __init__(self, torch) -> None:
        self.torch, self.device = torch, torch.device("cpu")

    def buffer(self, shape, dtype):
        return self.torch.empty(shape, dtype=dtype)

    def bind(self, step):
        def exchange_counts():
            step.counts_in.copy_(step.counts)

        def dispatch():
            step.received.copy_(step.sends)
            step.inbox[:step.layer.pairs].copy_(step.permuted)

        def combine():
            step.returned.copy_(step.received)
            step.back.copy_(step.expert_out[:step.layer.pairs])
        return exchange_counts, dispatch, combine

    def synchronize(self):
        pass


@pytest.mark.parametrize("experts,topk,dtype", [(4, 1, "float32"), (8, 3, "float32"),
                                                (32, 8, "bfloat16"), (12, 9, "bfloat16")])
def test_the_gpu_steps_torch_arithmetic_gives_the_reference_on_one_rank(experts, topk, dtype):
    torch = pytest.importorskip("torch")
    layer = _layer(1, experts, tokens=97, hidden=40, topk=topk, dtype=dtype)
    weights = moe.router_weights(7, layer.hidden, layer.experts)
    step = moe.GpuStep(torch, layer, weights, _OneRankExchange(torch))
    for number in range(2):   # new tokens each time, on the same tensors
        wrong = step.check(step, 7, number, weights)
        assert wrong == dict.fromkeys(wrong, 0), wrong
