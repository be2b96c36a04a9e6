"""Which shared GPUs take turns, and what the user is told: from every rank's facts as
``ipcshare info`` gathers them (no GPU needed)."""

from __future__ import annotations

from ipcshare.cli.info import shared_gpus_of, time_sliced_of
from ipcshare.topology.gpu_sharing import shared_gpus_advice

GPU_A = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
GPU_B = "GPU-bbbbbbbb-0000-0000-0000-000000000000"


def _facts(rank: int, uuid: str, *, mps: bool, node: int = 0) -> dict:
    index = 0 if uuid == GPU_A else 1
    return {"rank": rank, "node": node, "device": index, "mps": mps,
            "devices": [{"index": 0, "uuid": GPU_A}, {"index": 1, "uuid": GPU_B}]}


def test_a_shared_gpu_takes_turns_unless_every_rank_on_it_is_an_mps_client():
    facts = [_facts(0, GPU_A, mps=True), _facts(1, GPU_A, mps=False),
             _facts(2, GPU_B, mps=True), _facts(3, GPU_B, mps=True)]
    shared = shared_gpus_of(facts)
    assert shared == {GPU_A: [0, 1], GPU_B: [2, 3]}
    assert time_sliced_of(facts, shared) == {GPU_A: [0, 1]}
    advice = shared_gpus_advice(shared, time_sliced_of(facts, shared))
    assert f"ranks 0-1 on GPU {GPU_A}" in advice and "bbbbbbbb" not in advice
    assert "take turns in time slices" in advice and "nvidia-cuda-mps-control -d" in advice


def test_gpus_shared_under_mps_are_named_as_running_side_by_side():
    facts = [_facts(0, GPU_A, mps=True), _facts(1, GPU_A, mps=True)]
    shared = shared_gpus_of(facts)
    advice = shared_gpus_advice(shared, time_sliced_of(facts, shared))
    assert f"ranks 0-1 on GPU {GPU_A}" in advice and "side by side under MPS" in advice
    assert "take turns" not in advice
    # Facts from before the mps key existed: taking turns is the safe reading.
    old = [{k: v for k, v in f.items() if k != "mps"} for f in facts]
    assert time_sliced_of(old, shared) == shared
    assert "take turns" in shared_gpus_advice(shared)


def test_group_setup_names_shared_and_time_sliced_gpus_from_every_rank_s_facts():
    from ipcshare.topology.gpu_sharing import gpu_sharing

    # Node ranks 4-7: 4 and 6 share GPU A outside MPS, 5 and 7 share GPU B under MPS.
    shared, time_sliced = gpu_sharing([4, 5, 6, 7], [(b"A", False), (b"B", True),
                                                     (b"A", True), (b"B", True)])
    assert shared == {b"A": [4, 6], b"B": [5, 7]}
    assert time_sliced == {b"A": [4, 6]}
    assert gpu_sharing([0, 1], [(b"A", False), (b"B", False)]) == ({}, {})
    assert gpu_sharing([0, 1], [(None, False), (None, False)]) == ({}, {})  # host memory


def test_a_gpu_is_named_as_nvidia_smi_names_it_never_by_raw_bytes():
    from ipcshare.runtime.gpu_names import format_uuid
    from ipcshare.topology.gpu_sharing import gpu_sharing

    raw = bytes.fromhex("7d9991a71c3bc0a1110de498594d6c74")
    assert format_uuid(raw) == "GPU-7d9991a7-1c3b-c0a1-110d-e498594d6c74"
    assert format_uuid("GPU-7d9991a7-1c3b-c0a1-110d-e498594d6c74") == format_uuid(raw)
    # Group setup keys shared GPUs by the driver's raw bytes: the advice spells them.
    shared, time_sliced = gpu_sharing([0, 1], [(raw, False), (raw, False)])
    advice = shared_gpus_advice(shared, time_sliced)
    assert "ranks 0-1 on GPU GPU-7d9991a7-1c3b-c0a1-110d-e498594d6c74" in advice
    assert "b'" not in advice and "\\x" not in advice
