"""The self-checks' rules and how a failed or wrong figure is shown: never a ratio's
denominator, in the table, the document, the bench summary and the plot's data."""

from __future__ import annotations

import pytest

from ipcshare.bench.bands import band_ratios
from ipcshare.patterns.clock_check import (
    CLOCK_RETRIES,
    CLOCK_SLACK_S,
    agreed_stretch,
    ceiling_error,
    clock_disagreement,
    latency_clock_disagreement,
    torch_event_reading,
)
from ipcshare.patterns.results import BaselineResult, Measurement, Row, RunResult
from ipcshare.patterns.table import Table
from ipcshare.topology.link_speed import NVLINK_GBPS_PER_LINK, Ceiling, pcie_gbps


def test_clocks_agree_within_ten_percent_and_the_slack():
    assert clock_disagreement(1.0e-3, 1.05e-3, "x") is None
    assert clock_disagreement(1.0e-3, 1.0e-3 + 0.1e-3 + CLOCK_SLACK_S * 0.9, "x") is None
    assert clock_disagreement(10e-6, 55e-6, "x") is None          # within the slack
    # the host clock's offset (an empty stretch's reading) is taken off first
    assert clock_disagreement(10e-6, 90e-6, "x") is not None
    assert clock_disagreement(10e-6, 90e-6, "x", offset_s=44e-6) is None
    assert clock_disagreement(2.64e-4, 1.24e-3, "x", offset_s=44e-6) is not None
    said = clock_disagreement(2.64e-4, 1.24e-3, "100 back-to-back operations")
    assert said is not None and said.startswith("100 back-to-back operations: the timer gave")
    # a timer longer than the host clock is as wrong as a shorter one
    assert clock_disagreement(2e-3, 1e-3, "x") is not None
    assert clock_disagreement(1e-3, None, "x") is None
    assert latency_clock_disagreement([10e-6] * 5, [80e-6] * 5, "s") is not None
    assert latency_clock_disagreement([10e-6] * 5, [55e-6] * 5, "s") is None
    assert latency_clock_disagreement([10e-6] * 5, [80e-6] * 5, "s", 30e-6) is None


def test_the_offset_only_excuses_a_host_clock_that_reads_long():
    # 5 ranks on 4 GPUs (2026-11-27): events 1,930 us, host clock 1,947 us, but an empty
    # stretch read 267 us on a GPU shared by turns. The clocks agree; taking the offset
    # off both ways made the check fire.
    assert clock_disagreement(1930e-6, 1947e-6, "x", offset_s=267e-6) is None
    # Still: a timer that missed most of the work fails whatever the offset.
    assert clock_disagreement(400e-6, 1947e-6, "x", offset_s=267e-6) is not None
    # And a timer past the host clock, which brackets it, counted time that did not pass.
    said = clock_disagreement(1500e-6, 1000e-6, "x", offset_s=267e-6)
    assert said is not None and "counted time that did not pass" in said


def test_where_ranks_take_turns_on_a_gpu_only_the_upper_bound_holds():
    # The driver's offset there is unbounded (math.inf): the host clock also runs while
    # another context holds the GPU (4 ranks on 2 H200s, 2026-11-27: a 4.4 ms timer
    # against a longer host clock failed a correct run).
    import math

    assert clock_disagreement(4358e-6, 20e-3, "x", offset_s=math.inf) is None
    assert clock_disagreement(1e-6, 1.0, "x", offset_s=math.inf) is None
    said = clock_disagreement(2e-3, 1e-3, "x", offset_s=math.inf)
    assert said is not None and "counted time that did not pass" in said


def test_a_disagreement_names_the_parts_of_the_host_clock():
    # Work on another stream holds the final synchronize: 202 us of events, the end
    # seen at 210 us, the synchronize returning at 881 us.
    said = clock_disagreement(202e-6, 881e-6, "x", 15e-6, parts=(150e-6, 210e-6))
    assert said is not None
    assert "the last enqueue returned at 150.00 us" in said
    assert "the timer's end was seen at 210.00 us" in said
    assert "the other streams took 671.00 us more" in said
    assert "work the timer did not see" in said
    # Clocks that agree still agree, parts or none.
    assert clock_disagreement(1.0e-3, 1.05e-3, "x", parts=(1e-5, 1.0e-3)) is None
    assert "enqueue returned" not in clock_disagreement(202e-6, 881e-6, "x", 15e-6)


def test_a_host_slow_before_the_end_was_seen_is_no_missed_work():
    # NCCL's graphs on 4 H200s (2026-11-28): 202 us of events against 881 us of host
    # clock on one rank, three times. Where the host's extra time all came before the
    # timer's end was seen (a slow enqueue, a poll descheduled), no stream held the
    # synchronize, so nothing was missed.
    assert clock_disagreement(202e-6, 881e-6, "x", 15e-6, parts=(640e-6, 860e-6)) is None
    assert clock_disagreement(202e-6, 881e-6, "x", 15e-6, parts=(100e-6, 820e-6)) is None
    # The tail's allowance is the offset, the tolerance of the timer and the slack:
    # 15 + 20.2 + 50 us here.
    assert clock_disagreement(202e-6, 881e-6, "x", 15e-6, parts=(100e-6, 800e-6)) is None
    assert clock_disagreement(202e-6, 881e-6, "x", 15e-6, parts=(100e-6, 790e-6)) is not None


def test_a_timer_on_an_idle_stream_is_caught_by_its_tail():
    # The shape of a timer pointed at a stream the work is not on: both events done as
    # soon as recorded, the work holding the synchronize for 1 ms.
    said = clock_disagreement(20e-6, 1.03e-3, "x", 15e-6, parts=(18e-6, 25e-6))
    assert said is not None and "work the timer did not see" in said


def test_a_torch_reading_orders_its_parts():
    # A fake torch whose clock advances 10 us per call: the enqueue, the end event's
    # first query (not yet done), its second, then the synchronize.
    import time as real_time

    from ipcshare.patterns import clock_check

    now = [0.0]

    class FakeEvent:
        def __init__(self, enable_timing: bool) -> None:
            self.queries = 0

        def record(self, stream) -> None:
            pass

        def query(self) -> bool:
            now[0] += 10e-6
            self.queries += 1
            return self.queries > 1

        def synchronize(self) -> None:
            now[0] += 10e-6

        def elapsed_time(self, other) -> float:
            return 0.05   # milliseconds

    class Cuda:
        Event = FakeEvent

        @staticmethod
        def synchronize(device) -> None:
            now[0] += 30e-6

    class Torch:
        cuda = Cuda

    def enqueue() -> None:
        now[0] += 100e-6

    class FakeTime:   # the module's own reference only: other code keeps the real clock
        @staticmethod
        def perf_counter() -> float:
            return now[0]

    monkey = pytest.MonkeyPatch()
    monkey.setattr(clock_check, "time", FakeTime)
    try:
        timer, wall, (enqueued, end_seen) = torch_event_reading(Torch, None, None, enqueue)
    finally:
        monkey.undo()
    assert clock_check.time is real_time
    assert timer == pytest.approx(50e-6)
    assert enqueued == pytest.approx(100e-6)
    assert end_seen == pytest.approx(130e-6)
    assert wall == pytest.approx(160e-6)


def test_a_disagreement_that_does_not_come_back_is_a_hiccup():
    class _Comm:   # a world of one
        def allgather(self, value):
            return [value]

    readings = iter([(181e-6, 1299e-6), (181e-6, 196e-6), (181e-6, 190e-6)])

    def verdict(reading):
        return clock_disagreement(*reading, "x", 15e-6)

    reading, error, again = agreed_stretch(_Comm(), lambda: next(readings), verdict)
    assert (reading, error, again) == ((181e-6, 196e-6), None, 1)
    # A timer that misses the work every time: tried 1 + CLOCK_RETRIES times, then it stands.
    calls = []

    def short():
        calls.append(1)
        return 10e-6, 900e-6
    reading, error, again = agreed_stretch(_Comm(), short, verdict)
    assert error is not None and again == CLOCK_RETRIES and len(calls) == CLOCK_RETRIES + 1
    assert "the same on 2 more tries" in error


def test_the_ceiling_bounds_busbw():
    nvlink = Ceiling(18 * NVLINK_GBPS_PER_LINK[6], "NVLink 4: 18 links x 25 GB/s")
    assert nvlink.gbps == 450
    assert ceiling_error(449.9, nvlink, "2M out-of-place") is None
    said = ceiling_error(1519.33, nvlink, "128M")
    assert "busbw 1519.33 GB/s is above the ceiling 450.00 GB/s (NVLink 4" in said
    assert ceiling_error(1e9, None, "x") is None
    assert pcie_gbps(5, 16) == pytest.approx(63.0, rel=0.01)
    assert pcie_gbps(2, 16) == pytest.approx(8.0)


def _m(time_us, wrong=0, errors=(), path=None, wrong_paths=None):
    return Measurement(time_us, 1.0, 1.0, wrong, path=path, errors=list(errors),
                       wrong_paths=dict(wrong_paths or {}))


def _result(ours, theirs):
    rows = [Row(1024 * (i + 1), 256, {"out-of-place": m}) for i, m in enumerate(ours)]
    base = [Row(1024 * (i + 1), 256, {"out-of-place": m}) for i, m in enumerate(theirs)]
    return RunResult("0", "allgather", "cuda-vmm", "pidfd", 4, 1, "eager", [], rows,
                     BaselineResult("nccl", "NCCL 2.28.9", base, "NCCL"),
                     ceiling=Ceiling(450.0, "NVLink 4"))


def test_a_wrong_baseline_shows_wrong_and_no_speedup():
    result = _result([_m(10.0), _m(10.0)], [_m(20.0), _m(5.0, wrong=988)])
    table = Table(("out-of-place",), "uint8", "NCCL", path_column=True)
    right, wrong = (table.row(row, theirs)
                    for row, theirs in zip(result.rows, result.baseline.rows, strict=True))
    assert "2.00" in right
    assert "wrong" in wrong and "988" in wrong and "0.50" not in wrong and "n/a" in wrong
    footer = Table.footer(result)
    assert any("Speedup over nccl   : min 2.00x  max 2.00x" in line for line in footer)
    document = result.to_dict()
    second = document["baseline"]["rows"][1]
    assert (second["time_us"], second["busbw"], second["wrong"]) == (None, None, 988)
    assert document["baseline"]["rows"][0]["time_us"] == 20.0
    ratios = band_ratios(result)
    assert [ratio.sizes for ratio in ratios] == [1]   # only the right row is a ratio


def test_measurement_errors_are_listed_and_never_a_ratio():
    error = "rank 1: 1K out-of-place: the timer gave 2.64 us but the host clock ..."
    result = _result([_m(2.64, errors=[error])], [_m(9.0)])
    assert result.measurement_errors == [error]
    assert result.to_dict()["measurement_errors"] == [error]
    assert result.to_dict()["rows"][0]["errors"] == [error]
    assert result.to_dict()["rows"][0]["ceiling"] == {"gbps": 450.0, "source": "NVLink 4"}
    table = Table(("out-of-place",), "uint8", "NCCL")
    row, theirs = result.rows[0], result.baseline.rows[0]
    assert "n/a" in table.row(row, theirs)
    assert table.notes(row, theirs, "nccl") == [f"#  ^ measurement error, out-of-place: {error}"]
    footer = Table.footer(result)
    assert not any(line.startswith("# Speedup") for line in footer)
    assert "# Measurement errors   : 1 FAILED (each under its row)" in footer
    assert band_ratios(result) == []


def test_a_baselines_wrong_path_is_named_under_the_row():
    theirs = _m(9.0, path="plain", wrong_paths={"symmetric": 988})
    result = _result([_m(5.0)], [theirs])
    lines = Table(("out-of-place",), "uint8", "NCCL").notes(result.rows[0],
                                                            result.baseline.rows[0], "nccl")
    assert lines == ["#  ^ nccl baseline out-of-place: wrong elements on its symmetric 988 "
                     "path(s): not timed as its figure"]
    assert result.to_dict()["baseline"]["rows"][0]["wrong_paths"] == {"symmetric": 988}
    assert Measurement.from_dict(theirs.to_dict()).wrong_paths == {"symmetric": 988}
