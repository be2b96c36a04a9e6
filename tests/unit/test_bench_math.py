"""The arithmetic of bench: percentiles, medians and spreads, repetitions folded into one
result, size bands and the ratio summary."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from ipcshare.bench.bands import SIZE_BANDS, band_ratios, size_band
from ipcshare.bench.stats import aggregate_runs, median, spread
from ipcshare.patterns.results import BaselineResult, Measurement, Row, RunResult
from ipcshare.patterns.timing import percentile, summarize_samples

finite = st.floats(min_value=-1e12, max_value=1e12, allow_nan=False)


@given(st.lists(finite, min_size=1, max_size=60), st.floats(min_value=0, max_value=100))
@example([0.0, -17179869185.0], 99.99999999999999)   # a near-zero result across a wide gap
def test_percentile_matches_numpy_linear(values, q):
    # Interpolating between two ranks rounds at the scale of their gap, not of the result
    # (numpy and we may differ by a few ulps of the span when the result is near zero).
    span = max(values) - min(values)
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)),
                                                  rel=1e-9, abs=1e-6 + 1e-14 * span)


def test_percentile_by_hand():
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 0) == 1.0 and percentile(values, 100) == 4.0
    assert percentile(values, 50) == 2.5        # mean of the two middle values
    assert percentile(values, 25) == 1.75       # 1 + 0.75 x (2 - 1)
    assert percentile([7.0], 95) == 7.0
    summary = summarize_samples([float(v) for v in range(1, 102)])  # 1..101
    assert (summary.p5, summary.p50, summary.p95) == (6.0, 51.0, 96.0)


@pytest.mark.parametrize("values,q", [([], 50), ([1.0], -1), ([1.0], 101), ([1.0], math.nan)])
def test_percentile_refuses_nonsense(values, q):
    with pytest.raises(ValueError):
        percentile(values, q)


def test_median_and_spread():
    assert median([3.0, 1.0, 2.0]) == 2.0 and median([1.0, 2.0, 3.0, 10.0]) == 2.5
    s = spread([5.0, 1.0, 3.0, 9.0])
    assert (s.low, s.mid, s.high) == (1.0, 4.0, 9.0)
    with pytest.raises(ValueError):
        spread([])


@given(st.lists(finite, min_size=1, max_size=30))
def test_spread_orders_its_values(values):
    s = spread(values)
    assert s.low <= s.mid <= s.high
    assert s.low == min(values) and s.high == max(values)


def _measure(time_us, busbw=None, wrong=0, p5=None, p95=None):
    busbw = 1000.0 / time_us if busbw is None else busbw
    return Measurement(time_us, busbw * 2, busbw, wrong, p5_us=p5, p95_us=p95)


def _run(times, baseline_times=None, sizes=None, wrong=0, latency=False):
    sizes = sizes or [1 << (10 + 2 * i) for i in range(len(times))]

    def rows(values, bad):
        return [Row(size, size // 4, {"out-of-place": _measure(
            t, wrong=bad, p5=t * 0.9 if latency else None, p95=t * 1.2 if latency else None),
            "in-place": _measure(t / 2)}) for size, t in zip(sizes, values, strict=True)]
    baseline = (BaselineResult("mpi", "MPICH 5", rows(baseline_times, 0))
                if baseline_times else None)
    return RunResult("0.1.0", "allgather", "host", "pidfd", 2, 1, "eager", ["host", "host"],
                     rows(times, wrong), baseline)


def test_repetitions_fold_into_medians_with_ranges():
    runs = [_run([10.0, 100.0], [20.0, 150.0], latency=True),
            _run([12.0, 90.0], [22.0, 160.0], wrong=1, latency=True),
            _run([11.0, 300.0], [30.0, 140.0], latency=True)]
    folded = aggregate_runs(runs)
    first = folded.rows[0].modes["out-of-place"]
    assert first.time_us == 11.0 and first.time_us_range == (10.0, 12.0)
    assert first.busbw == pytest.approx(1000 / 11) and first.busbw_range == (
        pytest.approx(1000 / 12), pytest.approx(100.0))
    assert first.p5_us == pytest.approx(9.9) and first.p95_us == pytest.approx(13.2)
    assert first.wrong == 1 and folded.wrong_total == 2  # one per wrong row, both modes
    assert folded.rows[1].modes["out-of-place"].time_us == 100.0
    assert folded.rows[1].modes["in-place"].time_us == 50.0
    assert folded.baseline is not None and folded.baseline.rows[0].primary.time_us == 22.0
    doc = folded.to_dict()["rows"][0]
    assert doc["time_us_min"] == 10.0 and doc["time_us_max"] == 12.0
    assert doc["p50_us"] == doc["time_us"] == 11.0
    assert {"busbw_min", "busbw_max", "p5_us", "p95_us"} <= set(doc)
    assert "time_us_min" in doc["in_place"] and "p5_us" not in doc["in_place"]


def test_one_run_is_left_alone_and_mismatches_are_refused():
    run = _run([1.0, 2.0])
    assert aggregate_runs([run]) is run
    with pytest.raises(ValueError):
        aggregate_runs([])
    with pytest.raises(ValueError, match="different sizes"):
        aggregate_runs([run, _run([1.0, 2.0], sizes=[8, 16])])
    with pytest.raises(ValueError, match="different baselines"):
        aggregate_runs([run, _run([1.0, 2.0], [1.0, 2.0])])


def test_measurement_documents_keep_their_keys():
    plain = Measurement(1.0, 2.0, 1.0, 0).to_dict()
    assert set(plain) == {"time_us", "algbw", "busbw", "wrong"}
    sampled = Measurement(2.0, 2.0, 1.0, 0, p5_us=1.5, p95_us=3.0).to_dict()
    assert (sampled["p5_us"], sampled["p50_us"], sampled["p95_us"]) == (1.5, 2.0, 3.0)


@pytest.mark.parametrize("measurement", [
    Measurement(1.5, 2.0, 1.0, 3),
    Measurement(2.0, 2.0, 1.0, 0, p5_us=1.5, p95_us=3.0, time_us_range=(1.0, 4.0),
                busbw_range=(0.5, 1.5), path="symmetric", host_us=0.75)])
def test_a_measurement_document_reads_back_as_the_measurement(measurement):
    # what another process reports in its --json (the p2p halves) becomes one again
    assert Measurement.from_dict(measurement.to_dict()) == measurement


@pytest.mark.parametrize("size,band", [
    (1, 0), (64 << 10, 0), ((64 << 10) + 1, 1), ((16 << 20) - 1, 1), (16 << 20, 2), (1 << 30, 2)])
def test_size_bands(size, band):
    assert size_band(size) == SIZE_BANDS[band]


def test_band_ratios_are_geometric_means_of_their_time_over_ours():
    sizes = [1 << 10, 1 << 14, 1 << 20, 1 << 26]
    result = _run([1.0, 4.0, 10.0, 100.0], [2.0, 2.0, 20.0, 50.0], sizes=sizes)
    ratios = {r.band: r for r in band_ratios(result)}
    small = ratios[SIZE_BANDS[0]]
    assert small.ratio == pytest.approx(1.0) and (small.low, small.high) == (0.5, 2.0)
    assert small.sizes == 2 and small.baseline == "mpi"
    # the baseline took twice our time here: a speedup of 2, as the table's column says
    assert ratios[SIZE_BANDS[1]].ratio == pytest.approx(2.0)
    assert ratios[SIZE_BANDS[2]].ratio == pytest.approx(0.5)
    assert band_ratios(_run([1.0])) == []  # no baseline, no ratio
    extra = _run([1.0], [2.0], sizes=[1024])
    extra.extra_baselines.append(BaselineResult("nccl", "NCCL", [
        Row(1024, 256, {"out-of-place": _measure(4.0)})]))
    assert [(r.baseline, r.ratio) for r in band_ratios(extra)] == [("mpi", 2.0), ("nccl", 4.0)]


def test_zero_times_are_left_out_of_ratios():
    result = _run([1.0, 2.0], [2.0, 2.0], sizes=[1024, 2048])
    result.rows[0].modes["out-of-place"].time_us = 0.0
    (only,) = band_ratios(result)
    assert only.sizes == 1 and only.ratio == pytest.approx(1.0)


def test_the_result_document_names_after_kernel_timing_only_when_used():
    import dataclasses

    plain = _run([10.0, 100.0]).to_dict()
    assert set(plain) == {"ipcshare", "op", "backend", "exchange", "world_size", "nodes",
                          "timing", "devices", "rows", "baseline", "wrong_total"}
    marked = dataclasses.replace(_run([10.0, 100.0]), after_kernel=True)
    assert marked.to_dict()["after_kernel"] is True
    assert aggregate_runs([marked, marked]).after_kernel   # repetitions keep the mark


def test_the_result_document_says_timing_in_tokens_and_the_statistic_when_not_the_mean():
    import dataclasses

    sampled = dataclasses.replace(_run([10.0, 100.0]), timing="graph", statistic="median")
    document = sampled.to_dict()
    assert (document["timing"], document["statistic"]) == ("graph", "median")
    assert aggregate_runs([sampled, sampled]).statistic == "median"
