"""What each all-to-all row says of its bound (patterns/alltoall.py): the busiest link's
bytes (the most any rank sends to or receives from others), and on GPUs the time those
bytes take at LINK_BOUND_GBPS, the fraction of that bound the row reached and the thread
blocks of its call."""

from __future__ import annotations

import numpy as np
import pytest

from ipcshare.patterns.alltoall import LINK_BOUND_GBPS, AllToAll, busiest_link_bytes
from ipcshare.patterns.results import Measurement, Row
from ipcshare.runtime.errors import CollectiveError


def test_the_busiest_link_is_the_most_any_rank_sends_or_receives_remotely():
    m = np.array([[5, 1, 2], [0, 9, 30], [4, 0, 7]], np.int64)
    # sends off the diagonal: 3, 30, 4; receives: 4, 1, 32
    assert busiest_link_bytes(m, 2) == 64
    assert busiest_link_bytes(np.array([[7]]), 4) == 0          # one rank: no link
    even = np.full((4, 4), 10, np.int64)
    assert busiest_link_bytes(even, 4) == 3 * 10 * 4             # (n - 1) / n of a size


@pytest.mark.parametrize("splits", ["even", "random", "skewed"])
def test_gpu_rows_carry_the_bound_its_fraction_and_the_blocks(splits):
    case = AllToAll(splits=splits, datatype="float32")
    plan = case.plan(1 << 20, 4, 4)
    link = busiest_link_bytes(case.split_matrix(plan, 4), 4)
    measured = Measurement(time_us=40.0, algbw=1.0, busbw=1.0, wrong=0)
    row = Row(plan.size, plan.count, {"out-of-place": measured})
    assert case.row_facts(plan, 4, row) == {"busiest_link_bytes": link}   # host: no blocks
    assert case.fact_lines(case.row_facts(plan, 4, row)) == []
    case._blocks[plan.size] = 64     # what bind records from a GPU call's launch
    facts = case.row_facts(plan, 4, row)
    bound_us = link / (LINK_BOUND_GBPS * 1e3)
    assert facts["busiest_link_bytes"] == link and facts["blocks"] == 64
    assert facts["bound_us"] == pytest.approx(bound_us, rel=1e-3)
    assert facts["bound_fraction"] == pytest.approx(bound_us / 40.0, rel=1e-3)
    row.facts = facts
    assert row.to_dict()["bound_fraction"] == facts["bound_fraction"]
    (line,) = case.fact_lines(facts)
    assert f"busiest link {link} B" in line and "64 blocks" in line
    # A row that was wrong has no time to hold to the bound.
    wrong = Row(plan.size, plan.count, {"out-of-place": Measurement(40.0, 1.0, 1.0, 3)})
    assert "bound_fraction" not in case.row_facts(plan, 4, wrong)


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_the_ceiling_holds_the_busiest_links_rate(world_size):
    # Even splits: the busiest link carries busbw's (n - 1) / n of the input. Uneven: what
    # the most loaded rank sends or receives, more or less than busbw says; a 4 MiB
    # skewed call on host memory (CI, 2026-11-28) kept most bytes at home, and its nominal
    # busbw passed the host's measured ceiling.
    seconds = 100e-6
    for splits in ("even", "random", "skewed"):
        case = AllToAll(splits=splits, datatype="float32")
        plan = case.plan(4 << 20, world_size, 4)
        gbps, quantity = case.link_gbps(plan, seconds, world_size)
        link = busiest_link_bytes(case.split_matrix(plan, world_size), 4)
        assert gbps == pytest.approx(link / seconds / 1e9)
        assert quantity == "the busiest link's rate"
        if splits == "even":
            assert gbps == pytest.approx(case.bandwidth(plan, seconds, world_size)[1])


def test_the_ceiling_check_names_the_busiest_links_rate():
    from ipcshare.patterns.clock_check import ceiling_error
    from ipcshare.topology.link_speed import Ceiling

    # Skewed at 2 ranks, 4 MiB: rank 0 sends 86 % of its input to rank 1, so the busiest
    # link carries 1.7x what busbw's half of the input says.
    case = AllToAll(splits="skewed", datatype="float32")
    plan = case.plan(4 << 20, 2, 4)
    seconds = 100e-6
    busbw = case.bandwidth(plan, seconds, 2)[1]
    gbps, quantity = case.link_gbps(plan, seconds, 2)
    assert gbps > 1.5 * busbw
    ceiling = Ceiling((gbps + busbw) / 2, "a test's link")
    assert ceiling_error(busbw, ceiling, "x") is None          # what busbw alone let pass
    said = ceiling_error(gbps, ceiling, "x", quantity)
    assert said is not None and said.startswith("x: the busiest link's rate")


class _RefusingCommunicator:
    """A GPU communicator whose kernel refused the call's splits: synchronize raises."""

    memory = "cuda"

    def __init__(self) -> None:
        self.streams: list = []

    def synchronize(self, stream=None) -> None:
        self.streams.append(stream)
        raise CollectiveError("rank 1 sends rank 2 more than a slot holds")


class _Window:
    world_size, rank = 4, 0

    class engine:  # the window's engine, as the driver passes it
        stream = "the window's stream"

        @staticmethod
        def download(_buffer):
            raise AssertionError("the output was read after the kernel refused the call")


def test_a_refused_call_raises_its_cause_before_any_element_is_counted():
    # 4 ranks, random splits (x4, 2026-11-28): the eager kernel refused every size and
    # moved nothing, and the sweep reported every element wrong instead of the refusal.
    case = AllToAll("eager", splits="random", datatype="float32")
    case._communicator = communicator = _RefusingCommunicator()
    plan = case.plan(1 << 20, 4, 4)
    with pytest.raises(CollectiveError, match="more than a slot holds"):
        case.check(_Window(), plan, "out-of-place", 0)
    assert communicator.streams == ["the window's stream"]


def test_a_small_call_slow_on_a_shared_gpu_keeps_a_fraction_above_zero():
    # 6 KiB on the busiest link take 0.016 us at the link's speed; a call of 400 us (4 ranks
    # sharing one GPU under MPS) reached 4e-05 of it, which four decimals rounded to 0.0.
    case = AllToAll(splits="random", datatype="float32")
    plan = case.plan(8192, 4, 4)
    case._blocks[plan.size] = 2
    row = Row(plan.size, plan.count, {"out-of-place": Measurement(400.0, 1.0, 1.0, 0)})
    facts = case.row_facts(plan, 4, row)
    link = busiest_link_bytes(case.split_matrix(plan, 4), 4)
    assert 0 < facts["bound_fraction"] == pytest.approx(link / (LINK_BOUND_GBPS * 1e3) / 400.0,
                                                        rel=1e-3)
    assert facts["bound_us"] > 0
