"""``ipcshare alltoall``'s case through the shared driver on the host backend, at every
world size the suite runs with: even / random / skewed splits over several dtypes, in and
out of place, every element checked, the MPI baseline (mpi4py Alltoall / Alltoallv)
checked against the same expected bytes, nccl-tests' bandwidth, and a broken case seen
on every rank."""

from __future__ import annotations

import numpy as np
import pytest

import ipcshare
from ipcshare.baselines import mpi_baseline
from ipcshare.patterns import make_pattern
from ipcshare.patterns.alltoall import AllToAll, busiest_link_bytes
from ipcshare.patterns.driver import run_pattern
from ipcshare.runtime.config import merge_options

pytestmark = pytest.mark.mpi

SPLITS = ("even", "random", "skewed")


def _run(pattern, baseline=True, timing="nccl-tests", **options):
    opts = merge_options({"backend": "host", "iters": 3, "warmup": 1, "checks": 2,
                          **options})
    with ipcshare.Group(backend="host") as g:
        base = mpi_baseline(g.world, pattern) if baseline else None
        try:
            return run_pattern(g, pattern, opts, emit=lambda _line: None, baseline=base,
                               timing=timing)
        finally:
            pattern.close()


@pytest.mark.parametrize("splits", SPLITS)
@pytest.mark.parametrize("datatype", ["uint8", "float32", "float64", "bfloat16"])
def test_every_split_verifies_with_its_mpi_baseline(comm, splits, datatype):
    n = comm.size
    # Odd sizes too: 1000 bytes are no whole number of blocks of 4- or 8-byte elements.
    pattern = make_pattern("alltoall", splits=splits, datatype=datatype)
    result = _run(pattern, min_bytes=1000, max_bytes=300_000, step_factor=17,
                  datatype=datatype)
    assert result.wrong_total == 0
    assert comm.allgather(result.wrong_total) == [0] * n
    assert result.op == "alltoall" and result.splits == splits
    assert result.to_dict()["splits"] == splits
    element = np.dtype({"uint8": "u1", "float32": "f4", "float64": "f8",
                        "bfloat16": "u2"}[datatype]).itemsize
    factor = (n - 1) / n if n > 1 else 1.0
    for row in result.rows:
        # size: each rank's input bytes, n blocks of one length (nccl-tests' alltoall).
        assert row.size == row.count * element and row.count % n == 0
        assert set(row.modes) == {"out-of-place", "in-place"}
        for measured in row.modes.values():
            assert measured.wrong == 0 and measured.time_us > 0
            assert measured.algbw == pytest.approx(row.size / (measured.time_us * 1e-6) / 1e9,
                                                   rel=1e-6)
            assert measured.busbw == pytest.approx(measured.algbw * factor, rel=1e-9)
        # Each row says its busiest link's bytes; on host memory no GPU link bounds it,
        # so no fraction of a bound and no blocks.
        m = pattern.split_matrix(pattern.plan(row.size, n, element), n)
        assert row.facts == {"busiest_link_bytes": busiest_link_bytes(m, element)}
        assert result.to_dict()["rows"][result.rows.index(row)]["busiest_link_bytes"] == (
            row.facts["busiest_link_bytes"])
    # The baseline: every size and mode timed, and MPI's bytes are the expected ones.
    assert result.baseline is not None and result.baseline.name == "mpi"
    assert [row.size for row in result.baseline.rows] == [row.size for row in result.rows]
    for row in result.baseline.rows:
        assert set(row.modes) == {"out-of-place", "in-place"}
        for measured in row.modes.values():
            assert measured.wrong == 0 and measured.time_us > 0
            assert measured.busbw == pytest.approx(measured.algbw * factor, rel=1e-9)


@pytest.mark.parametrize("splits", SPLITS)
def test_latency_timing_and_unchecked_runs(comm, splits):
    pattern = make_pattern("alltoall", splits=splits, datatype="int32")
    result = _run(pattern, min_bytes=4096, max_bytes=4096, timing="latency")
    assert result.wrong_total == 0 and result.statistic == "median"
    unchecked = _run(make_pattern("alltoall", splits=splits), checks=0, min_bytes=4096,
                     max_bytes=4096)
    assert unchecked.to_dict()["wrong_total"] is None


def test_uneven_splits_move_uneven_bytes(comm):
    """random and skewed are all_to_all_v: each rank's receive differs, the window holds
    the longest, and every rank sends its whole input."""
    n = comm.size
    for splits in ("random", "skewed"):
        pattern = make_pattern("alltoall", splits=splits)
        assert pattern.collective == "all_to_all_v"
        plan = pattern.plan(1 << 16, n, 4)
        m = pattern.split_matrix(plan, n)
        assert (m.sum(axis=1) == plan.count).all()
        received = [pattern.received_bytes(plan, r, n) for r in range(n)]
        assert sum(received) == n * plan.size
        assert pattern.array_bytes(plan, n) == max(plan.size, *received)
    assert make_pattern("alltoall").collective == "all_to_all"


@pytest.mark.parametrize("splits", SPLITS)
def test_a_misplaced_element_is_counted_on_every_rank(comm, splits):
    """Break the case on purpose: after each operation the last rank's first received
    element is that of its second (or, alone, flipped): the checks must see it, and every
    rank must report the same count."""
    n = comm.size

    class MisplacingAllToAll(AllToAll):
        def bind(self, window, plan, mode):
            run = super().bind(window, plan, mode)
            received = self.received_bytes(plan, window.rank, n)

            def broken():
                run()
                if window.rank == n - 1 and received:
                    out = np.asarray(self._output(window, plan, mode)).view(np.uint8)
                    out[0] ^= 0xFF
            return broken

    pattern = MisplacingAllToAll(splits=splits, datatype="uint8")
    result = _run(pattern, baseline=False, min_bytes=4096, max_bytes=4096, datatype="uint8",
                  checks=2)
    plan = pattern.plan(4096, n, 1)
    wrong = 0 if pattern.received_bytes(plan, n - 1, n) == 0 else 2 * 2  # 2 checks x 2 modes
    assert comm.allgather(result.wrong_total) == [wrong] * n
    if wrong:
        assert result.rows[0].modes["out-of-place"].wrong == 2


def test_a_wrong_expectation_is_caught_by_the_baseline_too(comm):
    """The MPI baseline checks against the case's expected bytes: a case that expects
    blocks from the wrong ranks fails MPI's rows as well as its own."""
    n = comm.size
    if n == 1:
        pytest.skip("needs 2 ranks: a world of one receives only its own block")

    class ReversedAllToAll(AllToAll):
        def expected_bytes(self, plan, rank, world_size, iteration):
            want = super().expected_bytes(plan, rank, world_size, iteration)
            return want.reshape(world_size, -1)[::-1].reshape(-1).copy()

    result = _run(ReversedAllToAll(datatype="uint8"), min_bytes=1024, max_bytes=1024,
                  datatype="uint8", checks=1)
    assert result.rows[0].wrong > 0
    assert result.baseline.rows[0].wrong > 0
