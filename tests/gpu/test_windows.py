"""GPU windows across ranks: peers write, owners read, patterns verify, nothing leaks.

Run with ``mpiexec -n N python -m pytest --with-mpi tests/gpu`` for any N: ranks are dealt
round-robin over the visible GPUs, so N above the GPU count puts ranks on shared GPUs.
Every result is checked collectively.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

import ipcshare
from ipcshare.backends import gpu_count
from ipcshare.backends.device_buffer import DeviceArray, DeviceBuffer, live_dlpack_exports
from ipcshare.patterns import make_pattern
from ipcshare.patterns.driver import run_pattern
from ipcshare.patterns.seeding import seeded_bytes
from ipcshare.runtime import cuda_driver
from ipcshare.runtime.config import merge_options
from ipcshare.runtime.errors import BackendError, BackendUnavailable, SignalTimeout, WindowError
from ipcshare.window import USER_SLOT_BASE

from ..resources import open_fd_count

pytestmark = [pytest.mark.gpu, pytest.mark.mpi]

BACKENDS = ["cuda-ipc", "cuda-vmm"]
# Freed device memory may come back a granule late; anything more is a leak.
_MEMORY_SLACK = 2 << 20


def _all(comm, value) -> list:
    return comm.allgather(value)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_peer_uploads_into_my_window_and_i_read_it_back(comm, backend):
    nbytes = (1 << 20) + 13  # odd on purpose
    with ipcshare.Group(backend=backend) as g:
        w = g.window(nbytes)
        engine, n, me = w.engine, g.size, g.rank
        nxt, prev = (me + 1) % n, (me - 1) % n
        engine.upload(w.local, np.zeros(nbytes, dtype=np.uint8))
        w.barrier()
        engine.upload(w.peer(nxt), seeded_bytes(7, me, nbytes))
        w.barrier()
        got = engine.download(w.local)
        ok = bool(np.array_equal(got, seeded_bytes(7, prev, nbytes)))
        facts = (g.backend_name, isinstance(w.local, DeviceBuffer),
                 w.buffer_ptrs[me] == w.local.ptr, len(w.signal_pad_ptrs) == n,
                 g.backend.describe_device().startswith(f"cuda:{g.backend.device} "))
        w.close()
    assert _all(comm, ok) == [True] * n
    assert facts == (backend, True, True, True, True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_get_buffer_views_each_peer_as_a_typed_device_array(comm, backend):
    with ipcshare.Group(backend=backend) as g:
        w = g.window(1 << 16)
        engine, n, me = w.engine, g.size, g.rank
        mine = w.get_buffer(me, (16, 16), "float32", offset=4096)
        engine.upload(mine, (np.arange(256, dtype=np.float32) + 1000 * me).view(np.uint8))
        w.barrier()
        ok = True
        for r in range(n):
            view = w.get_buffer(r, (16, 16), np.float32, offset=4096)
            ok &= (isinstance(view, DeviceArray) and view.shape == (16, 16)
                   and view.dtype == "float32" and view.ptr == w.peer(r).ptr + 4096)
            got = engine.download(view).view(np.float32)
            ok &= bool(np.array_equal(got, np.arange(256, dtype=np.float32) + 1000 * r))
        w.barrier()
        w.synchronize()
        w.close()
    assert _all(comm, ok) == [True] * n


@pytest.mark.parametrize("backend", BACKENDS)
def test_signals_carry_data_and_a_missing_signal_times_out_naming_the_peer(comm, backend):
    nbytes = 1 << 16
    with ipcshare.Group(backend=backend) as g:
        w = g.window(nbytes)
        engine, n, me = w.engine, g.size, g.rank
        nxt, prev = (me + 1) % n, (me - 1) % n
        w.barrier()
        engine.upload(w.peer(nxt), np.full(nbytes, me % 251, dtype=np.uint8))
        w.put_signal(nxt, USER_SLOT_BASE + 1, 7)
        w.wait_signal(USER_SLOT_BASE + 1, 7, peer=prev)
        carried = bool(np.all(engine.download(w.local) == prev % 251))
        # Nobody raises this word: the stream-ordered wait must surface at synchronize.
        slot = USER_SLOT_BASE + 5
        w.wait_signal(slot, 1, peer=prev, timeout=0.5)
        try:
            with pytest.raises(SignalTimeout, match=rf"waiting for rank {prev}@") as caught:
                engine.synchronize()
        finally:
            # Unblock our own stream whatever happened above, through the library's own
            # path (the one Window.close takes): a stream left waiting makes the
            # teardown's cuMemFree wait forever, which would hide the real failure.
            released = engine.release_waits(w.signal_pad(me))
        engine.synchronize()
        w.close()
    assert "did not finish within 0.5 s" in str(caught.value)
    assert f"waiting for rank {prev}@" in str(caught.value) and released == 1
    assert _all(comm, carried) == [True] * n


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["ring", "allgather"])
@pytest.mark.parametrize("datatype", ["uint8", "float32"])
def test_patterns_verify_every_size_through_the_driver(comm, backend, op, datatype):
    options = merge_options({"backend": backend, "iters": 3, "warmup": 1, "checks": 2,
                             "min_bytes": 1, "max_bytes": 3 << 20, "step_factor": 7,
                             "datatype": datatype})
    with ipcshare.Group(backend=backend) as g:
        result = run_pattern(g, make_pattern(op), options, emit=lambda _line: None)
    assert result.wrong_total == 0
    assert len(result.rows) >= 6 and all(row.wrong == 0 for row in result.rows)
    assert all(m.time_us > 0 for row in result.rows for m in row.modes.values())
    assert all(dev.startswith("cuda:") for dev in result.devices)
    assert _all(comm, result.wrong_total) == [0] * comm.size


@pytest.mark.parametrize("backend", BACKENDS)
def test_importing_the_same_peer_allocation_twice_maps_it_once(comm, backend):
    with ipcshare.Group(backend=backend) as g:
        if min(_all(comm, g.world.local_size)) < 2:
            pytest.skip("needs 2 ranks on a node")
        b = g.backend
        size = b.granularity
        allocation = b.allocate(size)
        exported = b.export(allocation)
        payloads = g.exchange.allgather_bytes(exported.payload)
        fds = g.exchange.share_fds(exported.fd) if b.uses_fds else {}
        local = g.world.local_ranks
        peer = local[(local.index(g.rank) + 1) % len(local)]
        before = b.imports_mapped
        first = b.import_peer(payloads[peer], fds.get(peer), size)
        second = b.import_peer(payloads[peer], fds.get(peer), size)
        once = (first.ptr == second.ptr, b.imports_mapped == before + 1)
        second.close()
        kept = (b.imports_mapped == before + 1, not first.closed)
        first.close()
        second.close()  # idempotent: must not drop a second reference
        gone = b.imports_mapped == before
        for owned in fds.values():
            owned.close()
        exported.close()
        comm.Barrier()  # every peer let go of my memory before I free it
        allocation.close()
    assert _all(comm, (once, kept, gone)) == [((True, True), (True, True), True)] * comm.size


@pytest.mark.parametrize("backend", BACKENDS)
def test_malformed_payloads_are_refused_before_any_mapping(comm, backend):
    with ipcshare.Group(backend=backend) as g:
        b = g.backend
        size = b.granularity
        allocation = b.allocate(size)
        exported = b.export(allocation)
        good = exported.payload
        refused = []
        bad_version = good[:4] + b"\xff\xff" + good[6:]
        for bad in (b"", b"garbage", bytes(200), b"XXXX" + good[4:], bad_version, good[:-1],
                    good + b"\0"):
            try:
                b.import_peer(bad, exported.fd, size)
                refused.append(False)
            except BackendError:
                refused.append(True)
        try:
            b.import_peer(good, exported.fd, 2 * size)
            wrong_size = None
        except BackendError as exc:
            wrong_size = str(exc)
        missing_fd = "not applicable"
        if b.uses_fds:
            try:
                b.import_peer(good, None, size)
            except BackendError as exc:
                missing_fd = str(exc)
        mapped = b.imports_mapped
        exported.close()
        allocation.close()
    assert all(refused), refused
    assert wrong_size is not None and "announced" in wrong_size
    assert missing_fd == "not applicable" or "without its descriptor" in missing_fd
    assert mapped == 0
    assert _all(comm, all(refused)) == [True] * comm.size


@pytest.mark.parametrize("backend", BACKENDS)
def test_200_window_cycles_leak_no_memory_or_descriptors(comm, backend):
    with ipcshare.Group(backend=backend) as g:
        g.window(1 << 20).close()  # warm up: sockets, peer access, first-use imports
        comm.Barrier()
        free_before, fds_before = cuda_driver.mem_get_info()[0], open_fd_count()
        for _ in range(200):
            with g.window(1 << 20) as w:
                w.barrier()
        comm.Barrier()
        free_after, fds_after = cuda_driver.mem_get_info()[0], open_fd_count()
        mapped = g.backend.imports_mapped
    facts = (fds_after == fds_before, free_after >= free_before - _MEMORY_SLACK, mapped == 0)
    assert facts == (True, True, True), (fds_before, fds_after, free_before, free_after, mapped)
    assert _all(comm, facts) == [(True, True, True)] * comm.size


def test_ranks_bind_round_robin_and_may_share_a_gpu(comm):
    count = gpu_count()[0]
    with ipcshare.Group(backend="cuda-ipc") as g:
        b = g.backend
        bound = (b.device == g.world.local_rank % count,
                 b.ranks_per_device == len(range(b.device, g.world.local_size, count)))
        options = merge_options({"backend": "cuda-ipc", "iters": 2, "warmup": 1, "checks": 1,
                                 "min_bytes": 4096, "max_bytes": 1 << 20, "step_factor": 16})
        result = run_pattern(g, make_pattern("ring"), options, emit=lambda _line: None)
        places = _all(comm, (g.world.hostname, b.uuid))
    assert bound == (True, True)
    assert result.wrong_total == 0
    # Recorded for the reader of the log: whether this run really shared GPUs.
    shared = len(set(places)) < len(places)
    print(f"ranks per GPU > 1: {shared} ({len(places)} ranks, {len(set(places))} GPUs)")


def test_fabric_handles_work_or_every_rank_is_told_why_not(comm):
    try:
        with ipcshare.Group(backend="cuda-vmm", handle="fabric") as g:
            w = g.window(1 << 20)
            engine, n, me = w.engine, g.size, g.rank
            w.barrier()
            engine.upload(w.peer((me + 1) % n), np.full(1 << 20, me % 251, dtype=np.uint8))
            w.barrier()
            ok = bool(np.all(engine.download(w.local) == ((me - 1) % n) % 251))
            w.close()
            outcome = "ok" if ok else "wrong data"
    except BackendUnavailable as exc:
        outcome = str(exc)
    outcomes = _all(comm, outcome)
    if outcomes[0] == "ok":
        assert outcomes == ["ok"] * comm.size
    else:
        assert len(set(outcomes)) == 1, outcomes  # the same story on every rank
        assert "fabric" in outcome
        assert "CUDA_ERROR_NOT_PERMITTED" in outcome or "FABRIC_SUPPORTED is 0" in outcome
        if "NOT_PERMITTED" in outcome:
            assert "IMEX" in outcome and "--handle posix-fd" in outcome


def _torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    return torch


@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_views_of_peer_memory_are_zero_copy(comm, backend):
    torch = _torch()
    nbytes = (1 << 20) + 3
    with ipcshare.Group(backend=backend) as g:
        torch.cuda.set_device(g.backend.device)
        w = g.window(nbytes)
        engine, n, me = w.engine, g.size, g.rank
        nxt, prev = (me + 1) % n, (me - 1) % n
        engine.upload(w.local, np.zeros(nbytes, dtype=np.uint8))
        w.barrier()
        engine.synchronize()  # every peer zeroed its window before anyone writes
        exports = live_dlpack_exports()
        peer = torch.from_dlpack(w.peer(nxt))
        view = (peer.dtype == torch.uint8, peer.numel() == nbytes,
                peer.data_ptr() == w.peer(nxt).ptr, peer.device.index == g.backend.device)
        peer[:4096].fill_((me + 1) % 256)
        torch.cuda.synchronize()
        w.barrier()
        engine.synchronize()
        mine = torch.from_dlpack(w.local)
        ok = (bool((mine[:4096] == (prev + 1) % 256).all().item())
              and bool((mine[4096:] == 0).all().item()))
        del peer, mine
        gc.collect()
        released = live_dlpack_exports() == exports
        w.close()
    assert view == (True, True, True, True)
    assert released
    assert _all(comm, ok) == [True] * comm.size


@pytest.mark.parametrize("backend", BACKENDS)
def test_cupy_views_of_peer_memory_are_zero_copy(comm, backend):
    cupy = pytest.importorskip("cupy")
    nbytes = (1 << 20) + 3
    with ipcshare.Group(backend=backend) as g:
        with cupy.cuda.Device(g.backend.device):
            w = g.window(nbytes)
            engine, n, me = w.engine, g.size, g.rank
            nxt, prev = (me + 1) % n, (me - 1) % n
            engine.upload(w.local, np.zeros(nbytes, dtype=np.uint8))
            w.barrier()
            engine.synchronize()
            # DLPack names the device that maps the memory (ours); the CUDA array
            # interface makes cupy ask the pointer, which for a peer may be another GPU.
            peer = cupy.from_dlpack(w.peer(nxt))
            peer[:4096] = (me + 1) % 256
            cupy.cuda.runtime.deviceSynchronize()
            w.barrier()
            engine.synchronize()
            mine = cupy.asarray(w.local)
            same = mine.data.ptr == w.local.ptr
            ok = (bool((mine[:4096] == (prev + 1) % 256).all())
                  and bool((mine[4096:] == 0).all()))
            del peer, mine
            gc.collect()
            w.close()
    assert same
    assert _all(comm, ok) == [True] * comm.size


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_pair_without_peer_access_is_staged_not_mapped(comm, backend, gpus, monkeypatch):
    if gpus < 2 or comm.size < 2:
        pytest.skip("needs 2 ranks on 2 GPUs")
    # Every pair here has NVLink; declare GPUs 0 and 1 unreachable from each other.
    monkeypatch.setenv("IPCSHARE_DISABLE_P2P", "0-1")
    before = open_fd_count()
    with ipcshare.Group(backend=backend) as g:
        with g.window(1 << 20) as w:
            if g.rank < 2:  # ranks 0 and 1 sit on GPUs 0 and 1
                other = 1 - g.rank
                assert w.path(other) in ("relay", "host-staged")
                with pytest.raises(WindowError, match=r"cannot map the window of rank \d+@.*"
                                                      r"IPCSHARE_DISABLE_P2P"):
                    w.peer(other)
            w.barrier()
            w.synchronize()
    assert open_fd_count() == before


KERNEL_ALGOS = ["push", "pull", "ring"]


@pytest.mark.nvrtc
@pytest.mark.parametrize("algo", KERNEL_ALGOS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_allgather_kernels_verify_every_size(comm, backend, algo):
    from ipcshare.runtime.errors import KernelCompileError

    if comm.size > 8:
        pytest.skip("kernels take at most 8 ranks")
    opts = merge_options({"backend": backend, "iters": 3, "warmup": 1, "checks": 2,
                          "min_bytes": 1, "max_bytes": 9 << 20, "step_factor": 13,
                          "datatype": "uint8", "algo": algo})
    with ipcshare.Group(backend=backend) as g:
        try:
            result = run_pattern(g, make_pattern("allgather", algo), opts, emit=lambda _l: None)
        except KernelCompileError as exc:  # the same on every rank
            pytest.skip(f"needs NVRTC: {exc}")
    assert _all(comm, result.wrong_total) == [0] * comm.size
    assert len(result.rows) >= 5 and all(r.primary.time_us > 0 for r in result.rows)


@pytest.mark.nvrtc
def test_a_kernel_waiting_for_a_silent_peer_times_out_naming_it(comm):
    from ipcshare.patterns.allgather_kernels import KernelAllGather
    from ipcshare.runtime.errors import KernelCompileError

    if comm.size < 2 or comm.size > 8:
        pytest.skip("needs 2 to 8 ranks")
    pattern = KernelAllGather("push")
    with ipcshare.Group(backend="cuda-vmm", timeout=2.0) as g:
        w = g.window(1 << 20)
        plan = pattern.plan(64 << 10, g.size, 1)
        try:
            op = pattern.bind(w, plan, "out-of-place")
        except KernelCompileError as exc:
            pytest.skip(f"needs NVRTC: {exc}")
        comm.Barrier()
        if g.rank != 0:  # rank 0 stays silent: everyone else's kernel must give up
            op()
        w.engine.synchronize()
        comm.Barrier()
        outcome = "ok"
        try:
            pattern.check(w, plan, "out-of-place", 0)
        except SignalTimeout as exc:
            outcome = str(exc)
        w.close()
    if g.rank == 0:
        assert outcome == "ok"
    else:
        assert "gave up waiting for rank 0@" in outcome
