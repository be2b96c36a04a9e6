"""The harness is tested like a data path: the eager timer's average over ranks, and the
two self-checks of every timed row (a second clock, the ceiling) on host memory, at every
world size. GPU twins (a timer on a stream the work is not on) are in
tests/gpu/test_timer_checks_gpu.py."""

from __future__ import annotations

import pytest

import ipcshare
from ipcshare.backends import host as host_backend
from ipcshare.baselines.mpi import MpiBaseline
from ipcshare.patterns import driver, make_pattern
from ipcshare.patterns.clock_check import CLOCK_RETRIES
from ipcshare.patterns.driver import run_pattern
from ipcshare.patterns.timing import mean_over_ranks
from ipcshare.runtime.config import merge_options
from ipcshare.topology.link_speed import Ceiling

pytestmark = pytest.mark.mpi


class _RankTimer:
    """A timer that reads ``seconds`` and whose second clock reads ``wall``."""

    def __init__(self, seconds, wall):
        self.seconds, self.wall, self.wall_seconds = seconds, wall, None
        self.wall_parts = None  # a fake: nothing to split

    def start(self):
        pass

    def stop(self):
        self.wall_seconds = self.wall
        return self.seconds


class _Engine:
    def __init__(self, seconds, wall):
        self._timer = _RankTimer(seconds, wall)

    def timer(self):
        return self._timer


def test_mean_over_ranks_averages_each_value(comm):
    n, me = comm.size, comm.rank
    got = mean_over_ranks(comm, [float(me), 10.0 * me, 1.0])
    assert got == pytest.approx([(n - 1) / 2, 10 * (n - 1) / 2, 1.0])


def test_eager_timer_is_the_mean_of_every_rank(comm):
    # Rank r's timer reads (r + 1) ms over 10 operations. The mean per operation over
    # ranks is (n + 1) / 2 * 0.1 ms. Until 2026-11-26 the driver summed a pickled tuple
    # (which concatenates) and reported rank 0's time / n: 0.1 / n ms.
    n, me = comm.size, comm.rank
    engine = _Engine((me + 1) * 1e-3, (me + 1) * 1e-3)
    seconds, host, wall, errors, again = driver._back_to_back_seconds(
        comm, engine, [lambda: None], 10)
    assert seconds == pytest.approx((n + 1) / 2 * 1e-4)
    assert wall == pytest.approx(seconds)
    assert host >= 0 and errors == [] and again == 0


def test_a_timer_that_disagrees_with_the_host_clock_is_an_error(comm):
    # The timer saw a tenth of what the host clock saw, every time: the work was elsewhere.
    engine = _Engine(1e-4, 1e-3 if comm.rank == comm.size - 1 else 1e-4)
    _seconds, _host, _wall, errors, again = driver._back_to_back_seconds(
        comm, engine, [lambda: None], 10)
    mine = comm.rank == comm.size - 1
    assert bool(errors) == mine
    # every rank timed the stretch again as often, though only one disagreed
    assert again == CLOCK_RETRIES
    if mine:
        assert "the timer gave 100.00 us but the host clock" in errors[0]


class _HiccupTimer(_RankTimer):
    """A timer whose second clock reads ``wall`` once, then what the timer reads: a host
    hiccup on the first stretch only."""

    def stop(self):
        self.wall_seconds, self.wall = self.wall, self.seconds
        return self.seconds


def test_a_host_hiccup_on_one_rank_is_timed_again_and_is_no_error(comm):
    # 2026-11-27 on 4 H200s: 181 us of events against 548-1,299 us of host clock on some
    # ranks of one row, which made correct runs exit 5.
    engine = _Engine(181e-6, 181e-6)
    if comm.rank == comm.size - 1:
        engine._timer = _HiccupTimer(181e-6, 1299e-6)
    seconds, _host, wall, errors, again = driver._back_to_back_seconds(
        comm, engine, [lambda: None], 50)
    assert errors == [] and again == 1
    assert seconds == pytest.approx(181e-6 / 50) and wall == pytest.approx(seconds)


def _run(comm, op="allgather", baseline=False, **options):
    opts = merge_options({"backend": "host", "iters": 3, "warmup": 1, "checks": 1,
                          "min_bytes": 4096, "max_bytes": 65536, "step_factor": 4, **options})
    lines = []
    with ipcshare.Group(backend="host") as g:
        base = MpiBaseline(g.world, op) if baseline else None
        result = run_pattern(g, make_pattern(op), opts, emit=lines.append, baseline=base)
    return result, lines


class _ShortTimer(host_backend.HostTimer):
    """A timer that misses nine tenths of the work, as one on the wrong stream does (in
    proportion to the work: the clocks' fixed offset, calibrated away, is not that)."""

    def stop(self):
        return super().stop() / 10


def test_a_lying_timer_fails_every_row_on_every_rank(comm, monkeypatch):
    monkeypatch.setattr(host_backend.HostEngine, "timer", lambda self: _ShortTimer())
    # Rows of a few hundred microseconds at least, far above the checks' slack.
    result, lines = _run(comm, min_bytes=4 << 20, max_bytes=16 << 20)
    errors = result.measurement_errors
    # each row's clocks disagree (its busbw may pass the ceiling too: a second error)
    # (a world of one's in-place all-gather moves nothing: no time for the timer to miss)
    timed = [m for row in result.rows for mode, m in row.modes.items()
             if comm.size > 1 or mode == "out-of-place"]
    assert errors and all(any("the host clock from the first enqueue" in e for e in m.errors)
                          for m in timed)
    # every row named on every rank alike
    assert comm.allgather(len(errors)) == [len(errors)] * comm.size
    if comm.rank == 0:
        assert any(line.startswith("#  ^ measurement error, out-of-place") for line in lines)
        assert any("Measurement errors   : " in line and "FAILED" in line for line in lines)
    document = result.to_dict()
    if comm.size > 1:
        assert document["measurement_errors"] == errors
        assert all(row["errors"] for row in document["rows"])


def test_a_figure_above_the_ceiling_is_an_error(comm, monkeypatch):
    if comm.size == 1:
        pytest.skip("a world of one moves nothing between ranks: no ceiling")
    tiny = Ceiling(1e-6, "a test's ceiling")
    monkeypatch.setattr(driver, "run_ceiling", lambda group: tiny)
    result, lines = _run(comm, baseline=True)
    errors = result.measurement_errors
    assert errors and all("above the ceiling" in e and "a test's ceiling" in e for e in errors)
    # the baseline's rows are held to it too
    assert any(e.startswith("mpi baseline:") for e in errors)
    assert result.to_dict()["ceiling"] == {"gbps": 0.0, "source": "a test's ceiling"}
    if comm.rank == 0:
        # a ratio over an error is no ratio
        assert not any(line.startswith("# Speedup over") for line in lines)


def test_an_honest_run_passes_both_checks(comm):
    result, lines = _run(comm, baseline=True)
    assert result.measurement_errors == []
    measured = [m for row in result.rows for m in row.modes.values()]
    assert all(m.wall_us is not None and m.wall_us > 0 for m in measured)
    if comm.size > 1:
        assert result.ceiling is not None and result.ceiling.gbps > 0
        assert all(m.busbw <= result.ceiling.gbps for m in measured)
    if comm.rank == 0:
        assert any("Measurement errors   : 0 OK" in line for line in lines)
