"""Ring and all-gather through the shared driver: every byte checked, at every world size."""

from __future__ import annotations

import numpy as np
import pytest

import ipcshare
from ipcshare.baselines.mpi import MpiBaseline
from ipcshare.patterns import make_pattern
from ipcshare.patterns.driver import run_pattern
from ipcshare.patterns.seeding import seeded_bytes
from ipcshare.runtime.config import merge_options

pytestmark = pytest.mark.mpi


def _run(op, comm, lines=None, baseline=False, **options):
    opts = merge_options({"backend": "host", "iters": 3, "warmup": 1, "checks": 2, **options})
    with ipcshare.Group(backend="host") as g:
        pattern = make_pattern(op)
        base = MpiBaseline(g.world, op) if baseline else None
        sink = lines.append if lines is not None else (lambda _line: None)
        return run_pattern(g, pattern, opts, emit=sink, baseline=base)


@pytest.mark.parametrize("op", ["ring", "allgather"])
@pytest.mark.parametrize("datatype", ["float32", "uint8", "float64"])
def test_sweep_verifies_every_size(comm, op, datatype):
    result = _run(op, comm, min_bytes=1, max_bytes=3 << 20, step_factor=7, datatype=datatype)
    assert result.wrong_total == 0
    assert [row.wrong for row in result.rows] == [0] * len(result.rows)
    assert all(row.primary.time_us > 0 and row.primary.busbw >= 0 for row in result.rows)
    assert comm.allgather(result.wrong_total) == [0] * comm.size


def test_allgather_has_both_modes_and_nccl_tests_sizes(comm):
    result = _run("allgather", comm, min_bytes=1024, max_bytes=1024)
    row = result.rows[0]
    assert set(row.modes) == {"out-of-place", "in-place"}
    n = comm.size
    per_rank = 1024 // (4 * n)
    assert row.size == per_rank * 4 * n and row.count == per_rank * n
    m = row.modes["out-of-place"]
    assert m.algbw == pytest.approx(row.size / (m.time_us * 1e-6) / 1e9, rel=1e-6)
    assert m.busbw == pytest.approx(m.algbw * ((n - 1) / n if n > 1 else 1), rel=1e-6)


def test_ring_bandwidth_follows_sendrecv(comm):
    result = _run("ring", comm, min_bytes=4096, max_bytes=4096)
    row, n = result.rows[0], comm.size
    steps = max(n - 1, 1)
    assert row.primary.algbw == pytest.approx(4096 * steps / (row.primary.time_us * 1e-6) / 1e9,
                                              rel=1e-6)
    assert row.primary.busbw == row.primary.algbw


def test_mpi_baseline_is_timed_and_checked_in_the_same_run(comm):
    lines: list[str] = []
    result = _run("allgather", comm, lines, baseline=True, min_bytes=64, max_bytes=64 << 10,
                  step_factor=32)
    assert result.baseline is not None and result.baseline.name == "mpi"
    assert len(result.baseline.rows) == len(result.rows)
    assert all(row.wrong == 0 and row.primary.time_us > 0 for row in result.baseline.rows)
    doc = result.to_dict()
    assert set(doc) >= {"rows", "baseline", "wrong_total", "nodes", "world_size"}
    assert doc["baseline"]["rows"][0]["size"] == doc["rows"][0]["size"]
    if comm.rank == 0:
        assert any("speedup" in line for line in lines)
        assert "# Out of bounds values : 0 OK" in lines


def test_a_corrupted_block_is_counted_on_every_rank(comm):
    """Break the pattern on purpose: the check must see it and every rank must agree."""
    from ipcshare.patterns.allgather import AllGather

    class BrokenAllGather(AllGather):
        def bind(self, window, plan, mode):
            run = super().bind(window, plan, mode)

            def broken():
                run()
                if window.rank == 0:  # rank 0 scribbles over the last element it gathered
                    out = np.asarray(window.local)
                    end = self._recv_offset(plan) + plan.block_bytes * window.world_size
                    out[end - 1] ^= 0xFF
            return broken

    opts = merge_options({"backend": "host", "iters": 1, "warmup": 0, "checks": 1,
                          "min_bytes": 4096, "max_bytes": 4096, "datatype": "uint8"})
    with ipcshare.Group(backend="host") as g:
        result = run_pattern(g, BrokenAllGather(), opts, emit=lambda _l: None)
    assert comm.allgather(result.wrong_total) == [2] * comm.size  # 1 per mode, summed


def test_seeded_data_differs_by_rank_and_iteration():
    a, b, c = seeded_bytes(0, 0, 4096), seeded_bytes(0, 1, 4096), seeded_bytes(1, 0, 4096)
    assert not np.array_equal(a, b) and not np.array_equal(a, c)
    assert np.array_equal(a, seeded_bytes(0, 0, 4096))
