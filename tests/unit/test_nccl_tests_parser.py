"""nccl-tests logs (the output format of nccl-tests 2.17, as tools/gpu_check.py records
it, command lines included) read back into rows and a Markdown table."""

from __future__ import annotations

from pathlib import Path

from ipcshare.bench.nccl_tests import main, markdown_tables, parse_nccl_tests

LOG = Path(__file__).parent / "data" / "nccl_tests_two_runs.log"


def test_every_run_and_row_is_read_with_its_mode():
    eager, graph = parse_nccl_tests(LOG.read_text())
    assert (eager.program, eager.version, eager.ranks) == ("all_reduce_perf", "2.17.7", 2)
    assert (eager.label, graph.label) == ("R0 eager", "R2 graph")
    assert [row.size for row in eager.rows] == [8, 32, 1048576, 268435456]
    last = eager.rows[-1]
    assert (last.count, last.dtype, last.redop) == (67108864, "float", "sum")
    assert (last.time_us, last.busbw, last.inplace_time_us) == (894.5, 300.1, 893.9)
    assert graph.rows[0].inplace_wrong is None          # N/A in graph mode
    assert (eager.wrong_total, graph.wrong_total) == (0, 2)


def test_the_table_has_a_row_per_size_and_a_column_per_run():
    table = markdown_tables(parse_nccl_tests(LOG.read_text()))
    lines = table.splitlines()
    assert lines[0].startswith("all_reduce_perf, 2 ranks (nccl-tests 2.17.7;")
    assert "#wrong 2" in lines[0]
    assert lines[2] == ("| size | R0 eager µs (in place) | R2 graph µs (in place) | "
                        "R0 eager busbw GB/s | R2 graph busbw GB/s |")
    assert "| 1 MiB | 14.2 (14.0) | 14.0 (13.9) | 73.8 | 74.8 |" in lines
    assert "| 256 MiB | 894.5 (893.9) | — | 300.1 | — |" in lines
    assert "| 8 B | 7.2 (7.0) | 3.7 (3.7) | 0.0 | 0.0 |" in lines


def test_the_command_fails_on_wrong_elements_and_on_an_empty_log(tmp_path, capsys):
    assert main([str(LOG)]) == 1            # the graph run reported 2 wrong elements
    assert "| 1 MiB |" in capsys.readouterr().out
    clean = tmp_path / "clean.log"
    clean.write_text(LOG.read_text().split("\n\n")[0] + "\n")
    assert main([str(clean)]) == 0
    empty = tmp_path / "empty.log"
    empty.write_text("make: nvcc: not found\n")
    assert main([str(empty)]) == 1
    assert "no nccl-tests run" in capsys.readouterr().err
