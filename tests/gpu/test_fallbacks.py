"""GPU pairs without peer access, forced with IPCSHARE_DISABLE_P2P on nodes where every pair
has NVLink: each rank reports the planned path of every pair, ``peer()`` refuses such a
peer by name, the window barrier still meets every rank, the copy-engine all-gather and
the ring stay bit-exact through relays and host staging (odd sizes, many chunks), kernels
refuse, and closing leaks nothing.

Run with ``mpiexec -n N python -m pytest --with-mpi tests/gpu/test_fallbacks.py``: ranks
bind round-robin, so rank r uses GPU r % G. Host staging needs 2 GPUs; a relay needs a
third GPU (3 ranks on 3 GPUs); ranks sharing a GPU are always direct.
"""

from __future__ import annotations

import pytest

import ipcshare
from ipcshare.patterns import make_pattern
from ipcshare.patterns.driver import run_pattern
from ipcshare.runtime import cuda_driver
from ipcshare.runtime.config import merge_options
from ipcshare.runtime.errors import ConfigError, WindowError

from ..resources import mapping_count, open_fd_count

pytestmark = [pytest.mark.gpu, pytest.mark.mpi]

BACKENDS = ["cuda-ipc", "cuda-vmm"]
# Small chunks, so that megabyte blocks cross the two slots many times.
CHUNK = "64K"
_MEMORY_SLACK = 2 << 20


def _force(monkeypatch, disabled: str, fallback: str, chunk: str = CHUNK) -> None:
    # Read at Group creation: set before any Group exists.
    monkeypatch.setenv("IPCSHARE_DISABLE_P2P", disabled)
    monkeypatch.setenv("IPCSHARE_P2P_FALLBACK", fallback)
    monkeypatch.setenv("IPCSHARE_P2P_CHUNK", chunk)


def _case(comm, gpus: int, fallback: str) -> str:
    """The pairs to disable for ``fallback`` on this machine, or skip (on every rank)."""
    if fallback == "relay":
        if gpus < 3 or comm.size < 3:
            pytest.skip("a relay needs 3 ranks on 3 GPUs")
        # Ring edges (0-1, 2-3), so the ring's hops go through the relay as well as the
        # all-gather's: 0-1 relays through rank 2, 2-3 through rank 0.
        return "0-1,2-3" if gpus >= 4 and comm.size >= 4 else "0-1"
    if gpus < 2 or comm.size < 2:
        pytest.skip("host staging needs 2 ranks on 2 GPUs")
    return "0-1"


def _expected_paths(devices: list[int], disabled: str, fallback: str) -> dict:
    """What every pair should get: ranks on one GPU or on GPUs with peer access are
    direct; the others relay through the lowest rank direct with both, else stage."""
    pairs = {frozenset(int(d) for d in item.split("-")) for item in disabled.split(",")}
    n = len(devices)

    def direct(a: int, b: int) -> bool:
        return devices[a] == devices[b] or frozenset((devices[a], devices[b])) not in pairs

    expected = {}
    for a in range(n):
        for b in range(n):
            if a == b:
                expected[a, b] = ("self", None)
            elif direct(a, b):
                expected[a, b] = ("direct", None)
            else:
                relays = [k for k in range(n) if k not in (a, b) and direct(a, k)
                          and direct(b, k)]
                if relays and fallback != "host":
                    expected[a, b] = ("relay", relays[0])
                else:
                    expected[a, b] = ("host-staged", None)
    return expected


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fallback", ["host", "relay"])
def test_every_rank_reports_the_planned_paths_and_peer_refuses_by_name(
        comm, gpus, monkeypatch, backend, fallback):
    disabled = _case(comm, gpus, fallback)
    _force(monkeypatch, disabled, fallback)
    with ipcshare.Group(backend=backend) as g:
        me, n = g.rank, g.size
        devices = comm.allgather(g.backend.device)
        expected = _expected_paths(devices, disabled, fallback)
        with g.window((1 << 20) + 5) as w:
            seen = {(me, r): (w.path(r), g.paths.path(me, r).relay) for r in range(n)}
            refusals = {}
            for r in range(n):
                if w.path(r) in ("relay", "host-staged"):
                    with pytest.raises(WindowError) as caught:
                        w.peer(r)
                    refusals[r] = str(caught.value)
                    assert w.buffer_ptrs[r] == 0 and w.signal_pad_ptrs[r] == 0
                    with pytest.raises(WindowError):
                        w.signal_pad(r)
            # The barrier meets every rank, through pads and pinned inboxes alike.
            for _ in range(50):
                w.barrier()
            w.synchronize()
            w.barrier(stream=w.engine.stream)
            w.synchronize()
    assert seen == {pair: expected[pair] for pair in seen}
    assert any(kind in ("relay", "host-staged") for kind, _ in expected.values())
    for r, message in refusals.items():
        kind = expected[me, r][0]
        assert f"cannot map the window of rank {r}@" in message
        assert f"(cuda:{devices[me]})" in message and f"(cuda:{devices[r]})" in message
        assert "IPCSHARE_DISABLE_P2P" in message and f"path {kind!r}" in message
        if kind == "relay":
            assert f"relay through rank {expected[me, r][1]} (cuda:" in message
        else:
            assert "host-staged through pinned host memory" in message
    assert comm.allgather(len(seen)) == [n] * n


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fallback", ["host", "relay"])
@pytest.mark.parametrize("op", ["allgather", "ring"])
def test_copy_engine_patterns_stay_bit_exact_through_the_fallbacks(
        comm, gpus, monkeypatch, backend, fallback, op):
    disabled = _case(comm, gpus, fallback)
    _force(monkeypatch, disabled, fallback)
    options = merge_options({"backend": backend, "iters": 3, "warmup": 1, "checks": 2,
                             "min_bytes": 1, "max_bytes": (9 << 20) + 7, "step_factor": 13,
                             "datatype": "uint8", "algo": "copy-engine"})
    with ipcshare.Group(backend=backend) as g:
        staged = g.paths.has_fallbacks
        result = run_pattern(g, make_pattern(op, "copy-engine"), options,
                             emit=lambda _line: None)
    assert staged
    assert comm.allgather(result.wrong_total) == [0] * comm.size
    # Sizes round down to whole elements per rank, so several small sizes can fold into one
    # row at 8 ranks: count rows loosely. The largest size (13**6 bytes, the last factor-13
    # step under the cap) spans many 64 KiB chunks, so the double buffers really cycle.
    assert len(result.rows) >= 5 and all(row.wrong == 0 for row in result.rows)
    assert result.rows[-1].size >= 13 ** 6 - comm.size


@pytest.mark.parametrize("fallback", ["host", "relay"])
def test_auto_all_gather_keeps_to_the_copy_engine_and_kernels_refuse_the_pair(
        comm, gpus, monkeypatch, fallback):
    from ipcshare.patterns.allgather_auto import AutoAllGather
    from ipcshare.patterns.allgather_kernels import KernelAllGather

    disabled = _case(comm, gpus, fallback)
    _force(monkeypatch, disabled, fallback)
    with ipcshare.Group(backend="cuda-vmm") as g:
        with g.window(1 << 20) as w:
            plan = AutoAllGather().plan(4096, g.size, 1)
            assert AutoAllGather().choose(w, plan) == "copy-engine"
            with pytest.raises(ConfigError, match=r"--algo push reads and writes every peer's "
                                                  r"window directly, but rank \d+ \(cuda:\d\) "
                                                  r"and rank \d+ \(cuda:\d\) have no peer access"):
                KernelAllGather("push").bind(w, plan, "out-of-place")
            with pytest.raises(WindowError, match="device_barrier needs every peer's window"):
                w.device_barrier()
            w.barrier()
            w.synchronize()


def test_ranks_sharing_one_gpu_stay_direct(comm, gpus, monkeypatch):
    if gpus != 1 or comm.size < 2:
        pytest.skip("needs 2 ranks on one GPU (CUDA_VISIBLE_DEVICES=0)")
    _force(monkeypatch, "0-1", "host")
    with ipcshare.Group(backend="cuda-vmm") as g:
        with g.window(1 << 20) as w:
            kinds = {w.path(r) for r in range(g.size) if r != g.rank}
            staged = w.staged
    assert kinds == {"direct"} and staged is None


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fallback", ["host", "relay"])
def test_window_cycles_with_fallbacks_leak_nothing(comm, gpus, monkeypatch, backend, fallback):
    disabled = _case(comm, gpus, fallback)
    _force(monkeypatch, disabled, fallback)
    with ipcshare.Group(backend=backend) as g:
        with g.window(1 << 20) as w:  # warm up: sockets, peer access, first registrations
            w.barrier()
        comm.Barrier()
        fds, pinned = open_fd_count(), mapping_count("ipcshare-pinned")
        free_before = cuda_driver.mem_get_info()[0]
        for _ in range(40):
            with g.window((1 << 20) + 3) as w:
                w.barrier()
        comm.Barrier()
        facts = (open_fd_count() == fds, mapping_count("ipcshare-pinned") == pinned,
                 cuda_driver.mem_get_info()[0] >= free_before - _MEMORY_SLACK,
                 g.backend.imports_mapped == 0)
    assert facts == (True, True, True, True), (fds, open_fd_count(), pinned)
    assert pinned == 0  # the warm-up window's inboxes went with it
    assert comm.allgather(facts) == [facts] * comm.size
