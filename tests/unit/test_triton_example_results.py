"""The Triton examples' result documents, without a GPU: a sweep's rows are one launch,
Triton's time as ours and NCCL's from the same graphs as its baseline, with no time where
NCCL was wrong and no baseline where it was left out; the document validates."""

from __future__ import annotations

import pytest

from ipcshare.runtime import result_document as rd

from ..example_runs import load_example

harness = load_example("triton_harness")


def _document(rows, exit_status=0):
    return rd.make_document(
        tool="examples/triton_allgather.py", version="0", commit=rd.unknown_commit(),
        machine={"gpu_model": "test", "gpu_count": 1, "links": "one GPU", "driver": "0",
                 "cuda": None, "nccl": None, "torch": None, "hostname": "h", "host_cpus": 2},
        command="python examples/triton_allgather.py", exit_status=exit_status,
        world_size=2, rows=rows)


def test_a_sweep_is_one_launch_with_nccl_beside_ours():
    recorded = harness.Recorded("allgather", "int32", 4)
    rows = harness.result_rows(recorded, 2, [(2048, 0, 0, 5.5, 6.25),
                                             (16384, 0, 3, 7.0, 9.0)])
    assert [row["size"] for row in rows] == [8192, 65536]
    assert len({row["launch"] for row in rows}) == 1
    assert all(row["mode"] == "graph" and row["algorithm"] == "triton" for row in rows)
    assert rows[0]["ours"]["time_us"] == 5.5
    assert rows[0]["baselines"][0]["name"] == "nccl"
    assert rows[0]["baselines"][0]["time_us"] == 6.25
    # NCCL wrong: its time is no result.
    assert rows[1]["baselines"][0]["wrong"] == 3
    assert rows[1]["baselines"][0]["time_us"] is None
    with pytest.raises(rd.DocumentError):
        _document(rows, exit_status=0)   # a wrong baseline fails the run (exit 1)
    assert _document(rows, exit_status=1)["wrong_total"] == 3


def test_nccl_left_out_gives_no_baseline_and_wrong_elements_fail_the_document():
    recorded = harness.Recorded("allreduce-rmsnorm", "bfloat16", 2 * 64)
    rows = harness.result_rows(recorded, 2, [(4, 1, 0, 8.0, None)])
    assert rows[0]["size"] == 4 * 128 and rows[0]["baselines"] == []
    with pytest.raises(rd.DocumentError):
        _document(rows, exit_status=0)   # wrong elements and exit 0 do not go together
    assert _document(rows, exit_status=1)["wrong_total"] == 1
