"""The nccl-tests style table: the columns that describe one mode sit inside its block,
and every header name lines up over its cells."""

from __future__ import annotations

from ipcshare.patterns.results import BaselineResult, Measurement, Row
from ipcshare.patterns.table import Table


def _row(time_us: float, in_place_us: float, host_us: float, p95_us: float | None = None) -> Row:
    return Row(4096, 1024, {
        "out-of-place": Measurement(time_us, 1.0, 0.5, 0, host_us=host_us, p95_us=p95_us),
        "in-place": Measurement(in_place_us, 2.0, 1.0, 0)})


def _column_of(header: str, line: str, name: str, occurrence: int = 0) -> str:
    """The cell of ``line`` whose right edge is the right edge of ``name`` in ``header``
    (the table right-aligns every cell under its name)."""
    start = -1
    for _ in range(occurrence + 1):
        start = header.index(name, start + 1)
    end = start + len(name)
    return line[:end].split()[-1]


def test_the_host_column_sits_in_the_first_modes_block_and_reads_its_time():
    table = Table(("out-of-place", "in-place"), "float32", "MPI through mpi4py",
                  host_column=True)
    header = table.header("title", [])
    names, line = header[-2], table.row(_row(11.0, 22.0, 3.25),
                                        BaselineResult("mpi", "MPI", [_row(44.0, 44.0, 0)]).rows[0])
    # out-of-place: time, algbw, busbw, #wrong, host; then in-place's own four columns
    assert names.split()[1:11] == ["size", "count", "type", "time", "algbw", "busbw",
                                   "#wrong", "host", "time", "algbw"]
    assert _column_of(names, line, "host") == "3.25"
    assert _column_of(names, line, "time", 1) == "22.00"   # in-place follows host
    assert _column_of(names, line, "speedup") == "4.00"    # 44 / 11: the baseline over ours
    # each group label ends over its block's last column: out-of-place's is host
    groups = header[-3]
    assert groups.index("out-of-place") + len("out-of-place") == names.index("host") + 4
    second_wrong = names.index("#wrong", names.index("host"))
    assert groups.index("in-place") + len("in-place") == second_wrong + len("#wrong")
    assert (groups.index("MPI through mpi4py baseline") + len("MPI through mpi4py baseline")
            == names.index("speedup") + len("speedup"))


def test_the_p95_column_follows_the_first_mode_and_the_baseline_has_its_own():
    table = Table(("out-of-place",), "float32", "NCCL", p95_column=True)
    names = table.header("title", [])[-2]
    baseline = BaselineResult("nccl", "NCCL", [_row(20.0, 20.0, 0, p95_us=30.0)])
    line = table.row(_row(10.0, 10.0, 0, p95_us=12.5), baseline.rows[0])
    assert _column_of(names, line, "p95") == "12.50"
    assert _column_of(names, line, "p95", 1) == "30.00"
    assert _column_of(names, line, "speedup") == "2.00"


def test_a_zero_time_of_ours_gives_no_speedup_rather_than_zero():
    table = Table(("out-of-place",), "float32", "MPI")
    names = table.header("title", [])[-2]
    line = table.row(_row(0.0, 0.0, 0), BaselineResult("mpi", "MPI", [_row(5.0, 5.0, 0)]).rows[0])
    assert _column_of(names, line, "speedup") == "n/a"
