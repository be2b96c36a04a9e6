"""``ipcshare p2p`` on a node with 2 or more GPUs: peer access pair by pair, the ring and
the all-gather by peer pointers and by cuMemcpyPeerAsync verified bit-exact, the IPC half
beside them, and the host-staged run with peer access left off."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ipcshare.p2p.ipc_half import default_mpiexec
from ipcshare.p2p.runner import P2pOptions, run_p2p
from ipcshare.runtime.config import PatternOptions

SMALL = PatternOptions(min_bytes=4096, max_bytes=4 << 20, step_factor=32, iters=5, warmup=1,
                       checks=2)


@pytest.fixture
def two_gpus(gpus):
    if gpus < 2:
        pytest.skip(f"needs 2 GPUs in one process, {gpus} visible")
    return gpus


def test_every_pair_gets_peer_access_and_every_direct_run_verifies(two_gpus):
    lines = []
    document = run_p2p(P2pOptions(sweep=SMALL), emit=lines.append)
    count = min(two_gpus, 8)
    assert document["gpus"] == count and document["wrong_total"] == 0
    pairs = document["peer_access"]
    assert len(pairs) == count * (count - 1)
    # the reference nodes have NVLink between every pair
    assert all(pair["enabled"] and pair["reason"] == "" for pair in pairs), pairs
    for op in ("ring", "allgather"):
        rows = document["ops"][op]["rows"]
        assert len(rows) == 3 and rows[-1]["size"] <= 4 << 20
        for row in rows:
            for mode in ("p2p_kernel", "p2p_copy"):
                assert row[mode]["wrong"] == 0 and row[mode]["busbw"] > 0, row
        assert document["ops"][op]["ipc"] is None
        assert set(document["ops"][op]["latency_us"]) == {"p2p_kernel", "p2p_copy"}
    text = "\n".join(lines)
    assert "op: p2p ring" in text and "op: p2p allgather" in text
    assert f"peer access enabled for {len(pairs)} of {len(pairs)} ordered pairs" in text
    assert "# Out of bounds values : 0 OK" in text


def test_a_pair_disabled_on_purpose_is_named_and_the_kernel_mode_skipped(two_gpus,
                                                                         monkeypatch):
    monkeypatch.setenv("IPCSHARE_DISABLE_P2P", "0-1")
    lines = []
    document = run_p2p(P2pOptions(sweep=SMALL, ops=("allgather",)), emit=lines.append)
    refused = [p for p in document["peer_access"] if not p["enabled"]]
    assert {(p["src"], p["dst"]) for p in refused} == {(0, 1), (1, 0)}
    assert all(p["reason"] == "disabled by IPCSHARE_DISABLE_P2P" for p in refused)
    text = "\n".join(lines)
    assert "no peer access: cuda:0 -> cuda:1: disabled by IPCSHARE_DISABLE_P2P" in text
    assert "p2p-kernel skipped" in text
    rows = document["ops"]["allgather"]["rows"]
    assert all("p2p_kernel" not in row and row["p2p_copy"]["wrong"] == 0 for row in rows)


def test_with_peer_access_off_copies_still_verify_but_go_host_staged(two_gpus):
    big = PatternOptions(min_bytes=64 << 20, max_bytes=64 << 20, iters=5, warmup=1, checks=1)
    direct = run_p2p(P2pOptions(sweep=big, ops=("ring",), modes=("copy",)), emit=lambda _: None)
    staged = run_p2p(P2pOptions(sweep=big, ops=("ring",), modes=("copy",), peer_access=False),
                     emit=lambda _: None)
    assert staged["wrong_total"] == 0 and not staged["peer_access_enabled"]
    assert all(not pair["enabled"] for pair in staged["peer_access"])
    fast = direct["ops"]["ring"]["rows"][0]["p2p_copy"]["busbw"]
    slow = staged["ops"]["ring"]["rows"][0]["p2p_copy"]["busbw"]
    # NVLink direct ~380 GB/s; through host memory a few tens of GB/s at most
    assert slow < fast / 3, (slow, fast)


@pytest.mark.skipif(default_mpiexec() is None, reason="needs mpiexec for the IPC half")
def test_the_cli_runs_the_ipc_half_beside_and_writes_json(two_gpus, tmp_path):
    out_json = tmp_path / "p2p.json"
    out = subprocess.run([sys.executable, "-m", "ipcshare", "p2p", "-b", "64K", "-e", "16M",
                          "-f", "16", "-n", "10", "-w", "2", "--json", str(out_json)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    document = json.loads(out_json.read_text())
    assert document["wrong_total"] == 0
    for op in ("ring", "allgather"):
        entry = document["ops"][op]
        assert entry["ipc"]["error"] is None and entry["ipc"]["setup_ms"] > 0
        for row in entry["rows"]:
            assert {"p2p_kernel", "p2p_copy", "ipc"} <= set(row), row
            assert row["ipc"]["wrong"] == 0 and row["ipc"]["busbw"] > 0
    assert "ipc: one process per GPU" in out.stdout


def test_host_staged_copies_are_slow_and_a_second_streams_copy_waits_behind_the_kernel(
        two_gpus):
    from ipcshare.p2p.gpus import GpuSet
    from ipcshare.p2p.peer_access import disable_peer_access, enable_peer_access
    from ipcshare.p2p.staging_probe import probe_staging

    with GpuSet(2) as gpus:
        staged = probe_staging(gpus, 0, 1)          # peer access never enabled here
        pairs = enable_peer_access(gpus)
        try:
            assert all(pair.enabled for pair in pairs), pairs
            direct = probe_staging(gpus, 0, 1)
        finally:
            disable_peer_access(gpus, pairs)
    print(f"staged {staged}\ndirect {direct}")  # the numbers for docs/BENCHMARKS.md (-s)
    assert staged["gbps"] < direct["gbps"] / 3, (staged, direct)
    assert direct["waited_behind_kernel"] is False and direct["second_copy_ms"] < 25, direct
    # the report this reproduces: without peer access the second stream's copy waits
    assert staged["waited_behind_kernel"] is True, staged
