"""tools/probes/links/line_probe.py on two GPUs of one process: for each line width and reader, with
one direction and both at once, the reader sees flagged lines while the writer stores,
finds no word out of place, and the buffer holds the last round exactly. Whether a line
was ever seen torn is the probe's finding about the hardware, printed, not asserted here
(the tool's exit status says it). Not under pytest-mpi: run it outside mpiexec."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.example_runs import inside_an_mpi_job, load_example

pytestmark = pytest.mark.gpu
probe = load_example("line_probe",
                     Path(__file__).resolve().parents[2] / "tools" / "probes" / "links")


@pytest.fixture(scope="module")
def line_probe():
    from ipcshare.backends import gpu_count
    from ipcshare.p2p.gpus import GpuSet
    from ipcshare.p2p.peer_access import disable_peer_access, enable_peer_access

    # Before any GPU work (a module fixture comes before the function fixtures' skips).
    count, reason = gpu_count()
    if count < 2:
        pytest.skip(f"needs 2 GPUs, found {count}" + (f": {reason}" if reason else ""))
    if inside_an_mpi_job():
        pytest.skip("one process drives both GPUs: run it outside mpiexec")
    with GpuSet(2) as gpus:
        pairs = enable_peer_access(gpus)
        try:
            if not all(pair.enabled for pair in pairs):
                pytest.skip("GPUs 0 and 1 have no peer access")
            lines = probe.LineProbe(gpus, 64 << 10)
            try:
                yield lines
            finally:
                lines.close()
        finally:
            disable_peer_access(gpus, pairs)


@pytest.mark.parametrize("both", [False, True])
@pytest.mark.parametrize("reload", [False, True])
@pytest.mark.parametrize("width", [16, 128])
def test_the_reader_sees_lines_in_place_and_the_buffer_ends_on_the_last_round(
        line_probe, width, reload, both):
    rows = line_probe.run(width, reload, rounds=3000, budget_ns=40_000_000, grid=66,
                          readers=(1, 0) if both else (1,))
    assert [row["reader"] for row in rows] == ([1, 0] if both else [1])
    for row in rows:
        print(row, probe.verdict(row))
        assert row["final_ok"] and row["misplaced"] == 0, row
        assert row["seen"] > 0, row
