"""The MoE step benchmark's pure parts, without MPI or a GPU: the ratio to ours only where
both versions were right and their figures passed their checks, the table's rows (a
version not run says why, a wrong one shows no figure), and the refusal of layers whose
rows ``all_to_all_vdev``'s kernel would trap on."""

from __future__ import annotations

from ..example_runs import load_example

moe = load_example("moe_dispatch")
bench = load_example("moe_step_bench")


def _row(version, time_us=None, wrong=0, errors=(), measurement_errors=()):
    row = {"version": version, "timing": "eager", "checked_steps": 2, "wrong": wrong,
           "errors": list(errors), "measurement_errors": list(measurement_errors)}
    if time_us is not None:
        row.update(time_us=time_us, host_clock_us=time_us + 10, tokens_per_s=8.2e6,
                   bytes_per_rank=469_762_048, gbps=400.0)
    return row


def _results(rows):
    return {"layer_text": "4096 tokens x 7168 bfloat16 per rank, 32 experts (top-8) on 2 "
                          "rank(s)", "device": "2 x GPU", "versions_text": "torch 2.9, NCCL 2.27",
            "samples": 20, "warmup": 3, "rows": rows}


def test_ratios_are_over_ours_and_only_between_right_checked_figures():
    rows = [_row("ipcshare", 1000.0), _row("NCCL", 1850.0), _row("torch symm", 900.0)]
    bench.ratios(rows)
    assert [row["over_ours"] for row in rows] == [1.0, 1.85, 0.9]
    wrong = [_row("ipcshare", 1000.0), _row("NCCL", 1850.0, wrong=3)]
    bench.ratios(wrong)
    assert [row["over_ours"] for row in wrong] == [1.0, None]
    clock = [_row("ipcshare", 1000.0, measurement_errors=["rank 1: the timer gave ..."]),
             _row("NCCL", 1850.0)]
    bench.ratios(clock)
    assert [row["over_ours"] for row in clock] == [None, None]
    baseline_clock = [_row("ipcshare", 1000.0),
                      _row("torch symm", 4077.0, measurement_errors=["rank 0: ..."])]
    bench.ratios(baseline_clock)
    assert [row["over_ours"] for row in baseline_clock] == [1.0, None]


def test_exit_status_is_the_commands_wrong_then_failed_then_measurement():
    clean = [_row("ipcshare", 1000.0), {"version": "torch symm", "skipped": "no NVSHMEM"}]
    assert bench.exit_status(clean) == 0
    # A baseline whose figure failed the clock check: right, but no figure to divide by.
    symm_clock = [_row("ipcshare", 1000.0),
                  _row("torch symm", 4077.0, measurement_errors=["rank 0: the timer ..."])]
    assert bench.exit_status(symm_clock) == 5
    failed = symm_clock + [_row("NCCL", errors=["rank 1: NCCL error"])]
    assert bench.exit_status(failed) == 1
    assert bench.exit_status(failed + [_row("NCCL", 900.0, wrong=2)]) == 3
    text = bench.render_markdown(_results(symm_clock))
    assert "- torch symm: ERROR: rank 0: the timer ..." in text.splitlines()


def test_the_table_shows_each_version_and_why_one_did_not_run_or_was_wrong():
    rows = [_row("ipcshare", 1000.0), _row("NCCL", wrong=7),
            {"version": "torch symm", "skipped": "NVSHMEM is not available here"}]
    rows[0]["timing"] = "one CUDA graph"
    bench.ratios(rows)
    text = bench.render_markdown(_results(rows))
    lines = text.splitlines()
    assert lines[0] == ("### MoE step: 4096 tokens x 7168 bfloat16 per rank, 32 experts "
                        "(top-8) on 2 rank(s), 2 x GPU")
    table = [line for line in lines if line.startswith("| ") and "---" not in line]
    assert table[1] == ("| ipcshare all_to_all_v, splits on the device | one CUDA graph | "
                        "2 steps, bit for bit | 1000.0 | 1010.0 | 8.20 M | 469.8 MB | 400.0 | "
                        "1.00 |")
    assert table[2] == ("| NCCL all_to_all_single, splits copied to the host | eager | 2 steps, "
                        "7 WRONG |  |  |  |  |  |  |")
    assert table[3].startswith("| PyTorch symmetric memory all_to_all_vdev, splits on the "
                               "device | not run |")
    assert "- torch symm: not run: NVSHMEM is not available here" in lines


def test_vdev_rows_must_divide_over_its_blocks_per_peer():
    layer = moe.Layer(ranks=2, tokens=4096, hidden=7168, experts=32, topk=8, dtype="bfloat16")
    assert bench.vdev_trap(layer, None) is None   # 14336-byte rows, 32 blocks per peer
    odd = moe.Layer(ranks=2, tokens=4096, hidden=129, experts=8, topk=2, dtype="bfloat16")
    why = bench.vdev_trap(odd, None)
    assert why.startswith("all_to_all_vdev's kernel cuts a peer's bytes over 17 blocks")
    assert "dispatch's rows of 258 bytes" in why
    assert bench.vdev_trap(odd, "2") is None   # one block per peer


def test_the_result_document_holds_ours_beside_each_baseline_that_ran():
    from ipcshare.runtime import result_document as rd

    ours = {**_row("ipcshare", 1000.0), "timing": "one CUDA graph"}
    rows = [ours, _row("NCCL", 1850.0), _row("torch symm", wrong=3),
            {"version": "torch symm", "skipped": "no NVSHMEM"}]
    results = {**_results(rows), "layer": {"dtype": "bfloat16"}, "world_size": 2,
               "exit_status": bench.exit_status(rows)}
    (row,) = bench.result_rows(results, rd.new_launch_id())
    assert (row["op"], row["mode"], row["size"], row["dtype"]) == (
        "moe-step", "graph", 469_762_048, "bfloat16")
    assert row["ours"] == {"time_us": 1000.0, "algbw": 400.0, "busbw": None,
                           "wall_us": 1010.0}
    nccl, symm = row["baselines"]
    assert (nccl["name"], nccl["time_us"], nccl["path"]) == (
        "NCCL", 1850.0, "NCCL all_to_all_single, splits copied to the host, timed eager")
    assert symm["wrong"] == 3 and symm["time_us"] is None
    document = rd.make_document(
        tool="examples/moe_step_bench.py", version="0", commit=rd.unknown_commit(),
        machine={"hostname": "h", "host_cpus": 1, "gpu_model": None, "gpu_count": 0,
                 "links": None, "driver": None, "cuda": None, "nccl": None, "torch": None},
        command="python examples/moe_step_bench.py", exit_status=results["exit_status"],
        world_size=2, rows=[row])
    assert document["exit_status"] == 3 and document["wrong_total"] == 3
    assert bench.result_rows({**results, "rows": rows[3:]}, "x") == []
