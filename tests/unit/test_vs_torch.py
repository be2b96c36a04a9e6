"""``ipcshare vs-torch`` without a GPU: its size plans, busbw, the values every call must
leave, the second-clock and ceiling checks, the ratios that a wrong or failed row never
gets, the table, the progress, the max over ranks, its options and exit statuses, and
its refusal where torch is missing."""

from __future__ import annotations

import subprocess
import sys
import time
import types

import numpy as np
import pytest

from ipcshare.cli import vs_torch as command
from ipcshare.cli.main import build_parser
from ipcshare.runtime.errors import ConfigError, OptionError
from ipcshare.topology.link_speed import Ceiling
from ipcshare.vs_torch import clock, expected, table
from ipcshare.vs_torch import plan as sizes
from ipcshare.vs_torch import rows as judging
from ipcshare.vs_torch.plan import OPS, Options


# -- sizes and bandwidth ------------------------------------------------------------------
def test_size_plans_count_as_nccl_tests_does():
    plan = sizes.size_plan("all_reduce", 8 << 10, 4, 2)
    assert (plan.size, plan.in_count, plan.out_count) == (8192, 4096, 4096)
    gather = sizes.size_plan("all_gather", 8 << 10, 3, 2)     # the gathered output
    assert (gather.size, gather.in_count, gather.out_count, gather.block) == (
        8190, 1365, 4095, 1365)
    scatter = sizes.size_plan("reduce_scatter", 8 << 10, 3, 2)  # each rank's input
    assert (scatter.in_count, scatter.out_count) == (4095, 1365)
    swap = sizes.size_plan("all_to_all", 1 << 20, 4, 4)
    assert (swap.size, swap.in_count, swap.out_count, swap.block) == (
        1 << 20, 1 << 18, 1 << 18, 1 << 16)
    assert sizes.size_plan("all_gather", 8, 8, 2) is None       # not one element a rank
    with pytest.raises(ValueError):
        sizes.size_plan("broadcast", 8, 2, 2)


def test_sweep_and_communicator_size():
    assert sizes.sweep(8 << 10, 256 << 20, 4)[-1] == 128 << 20
    assert sizes.sweep(8 << 10, 256 << 20, 2)[-1] == 256 << 20
    assert sizes.sweep(4, 1 << 20, 1) == [4]
    plans = [sizes.size_plan(op, 1000, 3, 2) for op in OPS]
    assert sizes.communicator_bytes(plans) == 64 << 10
    assert sizes.communicator_bytes([sizes.size_plan("all_gather", 256 << 20, 4, 2)]) == (
        256 << 20)


def test_busbw_factors():
    gb, second = 10**9, 1.0
    assert sizes.busbw("all_reduce", gb, second, 4) == pytest.approx(1.5)
    for op in ("all_gather", "reduce_scatter", "all_to_all"):
        assert sizes.busbw(op, gb, second, 4) == pytest.approx(0.75)
    assert sizes.busbw("all_reduce", gb, second, 1) == pytest.approx(1.0)


# -- the values every call must leave -------------------------------------------------------
def _reference(plan, world):
    """Each rank's output after one call, by numpy from every rank's input."""
    inputs = [expected.materialize(expected.input_segments(plan, r, world)) for r in range(world)]
    b = plan.block
    if plan.op == "all_reduce":
        return [np.sum(inputs, axis=0)] * world
    if plan.op == "reduce_scatter":
        total = np.sum(inputs, axis=0)
        return [total[r * b:(r + 1) * b] for r in range(world)]
    if plan.op == "all_gather":
        return [np.concatenate(inputs)] * world
    return [np.concatenate([inputs[q][r * b:(r + 1) * b] for q in range(world)])
            for r in range(world)]


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("op", OPS)
def test_expected_values_are_what_the_collective_leaves(op, world):
    for nbytes in (2 * world, 1002, 4 * 251 * world + 6):
        plan = sizes.size_plan(op, nbytes, world, 2)
        for rank, want in enumerate(_reference(plan, world)):
            got = expected.materialize(expected.expected_segments(plan, rank, world))
            assert got.shape == (plan.out_count,)
            np.testing.assert_array_equal(got, want)


def test_blocks_in_the_wrong_place_hold_other_values():
    plan = sizes.size_plan("all_to_all", 2 * 4 * 300, 4, 2)
    blocks = expected.materialize(expected.expected_segments(plan, 1, 4)).reshape(4, -1)
    swapped = expected.materialize(expected.expected_segments(plan, 2, 4)).reshape(4, -1)
    assert all(not np.array_equal(blocks[q], swapped[q]) for q in range(4))
    gathered = expected.materialize(expected.expected_segments(
        sizes.size_plan("all_gather", 2 * 4 * 300, 4, 2), 0, 4)).reshape(4, -1)
    assert len({row.tobytes() for row in gathered}) == 4


@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter"])
def test_every_partial_sum_is_an_integer_exact_in_bfloat16(op):
    world = expected.MAX_RANKS
    tables = np.array([expected.rank_table(op, r, world) for r in range(world)])
    partials = np.cumsum(tables, axis=0)  # any order: bounded by the sum of magnitudes
    assert np.abs(tables).sum(axis=0).max() <= 256
    assert np.abs(partials).max() <= 256
    if op == "all_reduce":
        sums = expected.sum_table(op, world)
        assert set(np.abs(sums)) <= {0, 1, 2, 4}
        np.testing.assert_array_equal(tables.sum(axis=0), sums)


def test_a_graph_of_in_place_all_reduces_compounds():
    plan = sizes.size_plan("all_reduce", 600, 4, 2)
    segments, tolerance = expected.graph_expected(plan, 0, 4, 20, "bfloat16")
    assert tolerance == 0  # a power-of-two world stays exact
    np.testing.assert_array_equal(expected.materialize(segments),
                                  expected.materialize(expected.expected_segments(plan, 0, 4))
                                  * 4.0**19)
    wide, _ = expected.graph_expected(plan, 0, 4, 20, "float16")
    values = expected.materialize(wide)
    assert np.isinf(values[values != 0]).all()  # past float16's range: infinity, signed
    assert np.signbit(values[values != 0]).sum() > 0
    _, odd = expected.graph_expected(sizes.size_plan("all_reduce", 600, 3, 2), 0, 3, 20,
                                 "bfloat16")
    assert 0 < odd < 1
    assert expected.graph_expected(sizes.size_plan("all_gather", 600, 4, 2), 0, 4, 20,
                               "bfloat16") == (None, 0.0)
    assert expected.graph_expected(plan, 0, 4, 1, "bfloat16") == (None, 0.0)


# -- checks, ratios, table ------------------------------------------------------------------
def _row(op="all_reduce", size=1 << 20, ours=(25.0, 15.0), theirs=(20.5, 40.0),
         wrong=0, their_wrong=0):
    plan = sizes.size_plan(op, size, 4, 2)
    row = judging.new_row(plan)
    row["ours"].update(graph_us=ours[0], eager_us=ours[1], host_bound_us=1.5,
                       host_plain_us=6.0, wrong=wrong, wrong_by_call={"call": wrong})
    row["torch"].update(graph_us=theirs[0], eager_us=theirs[1], host_us=30.0,
                        wrong=their_wrong, wrong_by_call={"call": their_wrong})
    return row


def _results(*rows):
    return {"facts": {"world_size": 4}, "options": {"calls": 20, "replays": 10},
            "rows": list(rows)}


CEILING = Ceiling(450.0, "NVLink 4: 18 links x 25 GB/s per direction (NVML)")


def test_a_row_that_passes_gets_ratios_and_busbw():
    row = judging.judge_row(_row(), world=4, ceiling=CEILING)
    assert row["ok"] and row["errors"] == []
    assert row["ratios"]["graph"] == pytest.approx(25.0 / 20.5, abs=1e-4)
    assert row["ratios"]["eager"] == pytest.approx(15.0 / 40.0, abs=1e-4)
    assert row["ours"]["graph_busbw"] == pytest.approx((1 << 20) / 25e-6 / 1e9 * 1.5,
                                                       rel=1e-3)
    text = table.render_markdown(_results(row))
    assert "| 1M | 25.00 | 20.50 | 1.22x | 15.00 | 40.00 | 0.38x |" in text
    assert "| all_reduce | 1M | 1.50 | 6.00 | 30.00 |" in text
    assert "Bound call at most 2 µs of host time: 1 of 1 rows" in text
    assert command.exit_status(_results(row)) == 0


def test_a_timer_that_disagrees_with_the_host_clock_fails_the_row():
    # The broken eager timer of 2026-11-26: 2.6 us per call by the events, 12.4 by the
    # host clock, over 100 calls.
    errors = clock.clock_errors({"ours eager all_reduce 8K (100 calls)": (2.6e-4, 12.4e-4),
                                "torch eager all_reduce 8K (100 calls)": (12.0e-4, 12.4e-4)},
                               offset_s=13e-6)
    assert len(errors) == 1 and errors[0].startswith("ours eager all_reduce 8K")
    row = _row()
    row["errors"] += [f"rank 1: {error}" for error in errors]
    judging.judge_row(row, world=4, ceiling=CEILING)
    assert not row["ok"] and row["ratios"] == {"graph": None, "eager": None}
    text = table.render_markdown(_results(row))
    assert "| failed |" in text and "FAILED" in text
    assert "rank 1: ours eager all_reduce 8K (100 calls): the timer gave" in text
    assert command.exit_status(_results(row)) == 5  # a measurement error
    assert clock.clock_errors({"x": (100e-6, 160e-6)}, offset_s=13e-6) == []


def test_a_wrong_baseline_is_never_divided_by():
    # Figures a wrong side might still carry are shown as 'wrong', never divided by.
    row = _row(their_wrong=3)
    judging.judge_row(row, world=4, ceiling=CEILING)
    assert not row["ok"] and row["ratios"] == {"graph": None, "eager": None}
    assert "torch: 3 wrong elements over the ranks (call 3)" in row["errors"]
    assert "torch_graph_busbw" not in row["torch"] and "graph_busbw" not in row["torch"]
    text = table.render_markdown(_results(row))
    line = next(line for line in text.splitlines() if line.startswith("| 1M |"))
    assert line.split(" | ")[2] == "wrong" and line.split(" | ")[5] == "wrong"
    assert "x |" not in line
    assert "| all_reduce | 1M | 1.50 | 6.00 | wrong |" in text  # its host time too
    assert command.exit_status(_results(row)) == 3  # wrong data
    zero = judging.judge_row(_row(theirs=(0.0, 0.0), their_wrong=3), world=4, ceiling=CEILING)
    assert zero["ratios"] == {"graph": None, "eager": None}  # no ZeroDivisionError


def test_our_wrong_elements_fail_the_row_too():
    row = judging.judge_row(_row(wrong=5), world=4, ceiling=CEILING)
    assert not row["ok"] and row["ratios"]["graph"] is None
    assert "| wrong |" in table.render_markdown(_results(row))


def test_busbw_above_the_ceiling_fails_the_row():
    row = judging.judge_row(_row(ours=(0.5, 15.0)), world=4, ceiling=CEILING)
    assert not row["ok"]
    assert any("above the ceiling 450.00 GB/s" in error for error in row["errors"])
    assert row["ratios"]["graph"] is None


def test_a_refused_all_to_all_is_shown_with_its_reason_and_passes():
    row = _row(op="all_to_all")
    row["ours"] = {"refused": "all_to_all: ranks of this group take turns on a GPU",
                   "wrong": None, "wrong_by_call": {}}
    judging.judge_row(row, world=4, ceiling=CEILING)
    assert row["ok"] and row["ratios"] == {"graph": None, "eager": None}
    text = table.render_markdown(_results(row))
    assert "| 1M | refused | 20.50 | — | refused | 40.00 | — |" in text
    assert "- 1M: ours refused: all_to_all: ranks of this group take turns" in text
    assert "| all_to_all | 1M | refused | refused | 30.00 |" in text
    assert command.exit_status(_results(row)) == 0


# -- the max over ranks ---------------------------------------------------------------------
class _FakeRanks:
    """Rank 0 of ``len(others) + 1`` ranks, reducing as mpi4py does: buffers element by
    element (``Allreduce``), pickled objects with Python's operator (``allreduce``: a
    tuple "summed" is the tuples concatenated)."""

    MAX, SUM = "max", "sum"

    def __init__(self, *others):
        self.others = [np.asarray(other, dtype=np.float64) for other in others]
        self.pickled = 0

    def Allreduce(self, send, receive, op):  # mpi4py spells it so
        assert send.dtype == np.float64
        stack = np.stack([send, *self.others])
        receive[...] = stack.max(axis=0) if op == self.MAX else stack.sum(axis=0)

    def allreduce(self, value, op):
        self.pickled += 1
        total = value
        for other in self.others:
            theirs = type(value)(other.tolist())
            total = max(total, theirs) if op == self.MAX else total + theirs
        return total


def test_max_over_ranks_is_the_largest_figure_of_each_kind():
    ranks = _FakeRanks([3.0, 1.0, 9.5], [2.0, 7.0, 0.5])
    largest = judging.max_over_ranks(ranks, (1.0, 4.0, 2.0), ranks.MAX)
    np.testing.assert_array_equal(largest, [3.0, 7.0, 9.5])
    assert ranks.pickled == 0


def test_tuples_summed_over_ranks_are_concatenated_not_reduced():
    # What the tool must never do (the eager timer's bug of 2026-11-23 to 11-26): this
    # fake reduces a tuple as mpi4py does, so a max_over_ranks written that way fails
    # the test above (wrong length, wrong values).
    ranks = _FakeRanks([3.0, 1.0])
    assert ranks.allreduce((1.0, 4.0), ranks.SUM) == (1.0, 4.0, 3.0, 1.0)
    assert list(judging.max_over_ranks(ranks, (1.0, 4.0), ranks.MAX)) == [3.0, 4.0]


# -- starting -------------------------------------------------------------------------------
def test_the_progress_counts_the_rows_and_tells_each_row_as_it_is_judged(capsys):
    progress = command._Progress()
    progress.line._delay_s = 0  # shown at once, as on a run past its first 2 s
    progress.starting(2, 12, sizes.size_plan("all_gather", 1 << 20, 4, 2))
    row = judging.judge_row(_row(), world=4, ceiling=CEILING)
    progress.done(2, 12, row)
    err = capsys.readouterr().err
    assert "vs-torch: row 2/12: all_gather 1M (0:00 so far)" in err
    assert err.endswith("vs-torch: [2/12] all_reduce 1M: graph 25.00 vs 20.50 us, eager "
                        "15.00 vs 40.00 us\n")
    failed = judging.judge_row(_row(wrong=5), world=4, ceiling=CEILING)
    assert table.row_line(failed).endswith("graph wrong vs 20.50 us, eager wrong vs 40.00 us, "
                                           "FAILED (1 errors)")


def test_a_step_that_raised_is_an_error_before_any_wrong_figure():
    raised, wrong = _row(), _row(wrong=5)
    raised["errors"], raised["step_failed"] = ["torch graph capture: rank 1: boom"], True
    for row in (raised, wrong):
        judging.judge_row(row, world=4, ceiling=CEILING)
    assert command.exit_status(_results(wrong, raised)) == 1
    assert command.exit_status(_results(wrong)) == 3


# -- starting -------------------------------------------------------------------------------
def _options(*argv):
    return command.options_from_args(build_parser().parse_args(["vs-torch", *argv]))


def test_options_default_to_the_tools_sizes_and_run_all_to_all_last():
    assert _options() == Options(min_bytes=8 << 10, max_bytes=256 << 20, step_factor=4,
                                 dtype="bfloat16", ops=OPS, calls=20, replays=10, warmup=5,
                                 host_calls=100)
    assert _options("--ops", "all_to_all,all_reduce").ops == ("all_reduce", "all_to_all")
    assert _options("--dtype", "float16").dtype == _options("-d", "float16").dtype


@pytest.mark.parametrize("argv,says", [
    (["--ops", "all_reduce,broadcast"], "--ops all_reduce,broadcast: choose among"),
    (["-b", "1M", "-e", "8K"], "-b/--minbytes 1M is above -e/--maxbytes 8K"),
    (["--calls", "0"], "--calls 0: at least 1"),
    (["-w", "-1"], "-w/--warmup -1: at least 0"),
    (["-b", "lots"], "-b/--minbytes lots is not a size")])
def test_bad_values_are_refused_naming_the_flag(argv, says):
    with pytest.raises(OptionError) as refused:
        _options(*argv)
    assert says in str(refused.value)


def test_help_lists_the_command_and_its_flags():
    done = subprocess.run([sys.executable, "-m", "ipcshare", "--help"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and "vs-torch" in done.stdout and "PyTorch" in done.stdout
    done = subprocess.run([sys.executable, "-m", "ipcshare", "vs-torch", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "--dtype" in done.stdout and "--host-calls" in done.stdout


def test_missing_torch_is_refused_naming_what_it_needs(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    with pytest.raises(ConfigError, match="^vs-torch needs torch and a GPU per rank: torch "
                                          "is not importable here"):
        command.import_torch_with_nccl()


def test_torch_without_a_gpu_is_refused_too(monkeypatch):
    fake = types.ModuleType("torch")
    fake.cuda = types.SimpleNamespace(is_available=lambda: False)
    fake.distributed = types.ModuleType("torch.distributed")
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setitem(sys.modules, "torch.distributed", fake.distributed)
    with pytest.raises(ConfigError, match="needs torch and a GPU per rank: this torch sees "
                                          "no CUDA device"):
        command.import_torch_with_nccl()


class _FakeEvent:
    """A timing event of a fake torch whose clock the test sets."""

    def __init__(self, clock):
        self.clock, self.at = clock, None

    def record(self, stream):
        self.at = self.clock.gpu_now()

    def query(self):
        return True

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return (other.at - self.at) * 1e3   # milliseconds, as torch's


class _FakeTorch:
    """Enough of torch for EventClock: events read ``gpu_now``, which each stretch's
    work advances by ``gpu_s``; ``synchronize`` sleeps ``stalls.pop(0)`` seconds first,
    a host hiccup that only the host clock sees."""

    def __init__(self, gpu_s, stalls):
        self.gpu_s, self.stalls, self._gpu = gpu_s, list(stalls), 0.0
        fake = self

        class _Cuda:
            @staticmethod
            def Event(enable_timing=True):
                return _FakeEvent(fake)

            @staticmethod
            def synchronize(device=None):
                if fake.stalls:
                    time.sleep(fake.stalls.pop(0))

        self.cuda = _Cuda

    def gpu_now(self):
        return self._gpu

    def work(self):
        self._gpu += self.gpu_s
        time.sleep(self.gpu_s)


class _OneRank:
    def Barrier(self):
        pass

    def allgather(self, value):
        return [value]


def test_the_comparisons_clock_times_a_hiccup_again_and_keeps_a_miss():
    from ipcshare.patterns.clock_check import CLOCK_RETRIES
    from ipcshare.vs_torch.clock import EventClock

    # Offset: 7 empty stretches (their synchronizes: 2 each, no stall). Then the timed
    # stretch's synchronizes: the first sees a 50 ms hiccup after 2 ms of work.
    torch = _FakeTorch(2e-3, [0.0] * 14 + [0.0, 0.05])
    clock = EventClock(torch, stream=None, comm=_OneRank())
    timer_s, wall_s = clock.timed(torch.work, 1)
    assert clock.rechecks == 1
    assert timer_s == pytest.approx(2e-3) and wall_s < 0.04
    # A timer that misses the work every time: the work is on another stream, so the
    # full synchronize after the end event waits 20 ms for it on every try; each retry
    # disagrees, and it is kept.
    missing = _FakeTorch(0.0, [0.0] * 14 + [0.0, 0.02] * (1 + CLOCK_RETRIES))
    clock = EventClock(missing, stream=None, comm=_OneRank())
    timer_s, wall_s = clock.timed(lambda: None, 1)
    assert clock.rechecks == CLOCK_RETRIES and timer_s == 0.0 and wall_s >= 0.02
