"""Device facts, binding, and one process's own use of the GPU backends and engine
(no peers: these run as a plain process, or on every rank under mpiexec)."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from ipcshare.backends import open_backend
from ipcshare.backends.device_buffer import DeviceBuffer, live_dlpack_exports
from ipcshare.patterns.seeding import seeded_bytes
from ipcshare.runtime import cuda_driver
from ipcshare.runtime.errors import BackendError, ConfigError, CudaError
from ipcshare.topology import devices

pytestmark = pytest.mark.gpu

BACKENDS = ["cuda-ipc", "cuda-vmm"]


def test_device_facts_describe_every_visible_gpu(gpus):
    described = devices.describe_devices()
    assert [d["index"] for d in described] == list(range(gpus))
    for d in described:
        assert d["uuid"].startswith("GPU-") and len(d["uuid"]) == 40
        assert d["memory"] > 0 and d["name"] and ":" in d["pci_bus_id"]
    pairs = devices.p2p_matrix()
    assert len(pairs) == gpus * (gpus - 1)
    for pair in pairs:
        assert pair["src"] != pair["dst"]
        assert set(pair) == {"src", "dst", "access", "native_atomics", "perf_rank",
                             "why"}


def test_handle_support_is_probed_with_real_allocations():
    support = devices.handle_support(0)
    assert support["cuda-ipc"] == "ok"
    assert support["posix-fd"] == "ok"
    # The reference nodes refuse fabric without IMEX; a node with IMEX says ok.
    fabric = support["fabric"]
    assert fabric == "ok" or fabric.startswith(
        ("refused: CUDA_ERROR_NOT_PERMITTED (no IMEX channel)", "unsupported:")), fabric


def test_binding_is_round_robin_and_the_rank_limit_is_enforced(gpus, monkeypatch):
    monkeypatch.delenv("IPCSHARE_MAX_RANKS_PER_GPU", raising=False)
    assert [devices.bind_device(r, 2 * gpus) for r in range(2 * gpus)] == list(range(gpus)) * 2
    monkeypatch.setenv("IPCSHARE_MAX_RANKS_PER_GPU", "1")
    assert devices.bind_device(0, gpus) == 0
    with pytest.raises(ConfigError, match="2 ranks would share GPU 0; at most 1 allowed"):
        devices.bind_device(0, gpus + 1)
    monkeypatch.setenv("IPCSHARE_MAX_RANKS_PER_GPU", "lots")
    with pytest.raises(ConfigError, match="IPCSHARE_MAX_RANKS_PER_GPU"):
        devices.bind_device(0, 1)


def test_checked_calls_name_the_call_and_the_error():
    with pytest.raises(CudaError, match=r"^cuDeviceGet -> CUDA_ERROR_INVALID_DEVICE"):
        cuda_driver.get_device(10_000)


@pytest.mark.parametrize("backend", BACKENDS)
def test_engine_moves_bytes_signals_and_times_within_one_process(backend):
    b = open_backend(backend, local_rank=0, local_size=1)
    try:
        engine = b.engine()
        size = b.granularity
        first, second = b.allocate(size), b.allocate(size)
        try:
            data = seeded_bytes(3, 0, size)
            engine.upload(first.buffer(), data)
            engine.copy(second.buffer(), first.buffer())
            assert np.array_equal(engine.download(second.buffer()), data)
            # Odd-sized, odd-offset pieces through a bound copier.
            copy = engine.copier([(second.buffer(1, 4099), first.buffer(4099, 4099)),
                                  (second.buffer(9000, 1), first.buffer(0, 1))])
            timer = engine.timer()
            timer.start()
            copy()
            elapsed = timer.stop()
            got = engine.download(second.buffer())
            assert np.array_equal(got[1:4100], data[4099:8198])
            assert got[9000] == data[0] and elapsed >= 0.0
            pad = second.buffer(size - 4096, 4096)
            engine.upload(pad, np.zeros(4096, dtype=np.uint8))  # as windows zero theirs
            engine.store_signal(pad, 3, 5)
            engine.wait_signal(pad, 3, 5, timeout=5.0, what="this rank")
            post = engine.signal_poster(pad, 4)
            wait = engine.signal_waiter(pad, 4, timeout=5.0, what="this rank")
            post(9)
            wait(9)
            engine.synchronize()
            words = engine.download(pad).view(np.uint64)
            assert words[3] == 5 and words[4] == 9
            with pytest.raises(ValueError, match="outside a pad"):
                engine.store_signal(pad, 512, 1)
        finally:
            second.close()
            first.close()
        assert first.closed and second.closed
        first.close()  # idempotent
        with pytest.raises(BackendError, match="closed"):
            first.buffer()
    finally:
        b.close()
        b.close()
    with pytest.raises(BackendError, match="closed"):
        b.engine()


@pytest.mark.parametrize("backend", BACKENDS)
def test_buffers_speak_both_array_protocols_without_copies(backend):
    b = open_backend(backend, local_rank=0, local_size=1)
    try:
        allocation = b.allocate(b.granularity)
        buf = allocation.buffer(256, 1000)
        assert isinstance(buf, DeviceBuffer) and buf.ptr == allocation.ptr + 256
        cai = buf.__cuda_array_interface__
        assert cai["shape"] == (1000,) and cai["typestr"] == "|u1"
        assert cai["data"] == (buf.ptr, False) and cai["version"] == 3
        assert buf.__dlpack_device__() == (2, b.device)
        before = live_dlpack_exports()
        capsules = [buf.__dlpack__(), buf.__dlpack__(max_version=(1, 0))]
        assert live_dlpack_exports() == before + 2
        del capsules
        gc.collect()
        assert live_dlpack_exports() == before  # unconsumed capsules release their tensors
        with pytest.raises(BufferError):
            buf.__dlpack__(copy=True)
        with pytest.raises(ValueError):
            allocation.buffer(b.granularity - 10, 11)
        allocation.close()
    finally:
        b.close()


def test_torch_and_cupy_take_zero_copy_views_in_one_process():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    b = open_backend("cuda-vmm", local_rank=0, local_size=1)
    try:
        torch.cuda.set_device(b.device)
        allocation = b.allocate(b.granularity)
        buf = allocation.buffer(4096, 8192)
        tensor = torch.from_dlpack(buf)
        assert tensor.dtype == torch.uint8 and tensor.shape == (8192,)
        assert tensor.data_ptr() == buf.ptr and tensor.device.index == b.device
        tensor.fill_(42)
        torch.cuda.synchronize()
        assert np.all(b.engine().download(buf) == 42)
        del tensor
        try:
            import cupy
        except ImportError:
            cupy = None
        if cupy is not None:
            with cupy.cuda.Device(b.device):
                view = cupy.asarray(buf)
                assert view.data.ptr == buf.ptr and view.dtype == cupy.uint8
                view[:] = 7
                cupy.cuda.runtime.deviceSynchronize()
                assert np.all(b.engine().download(buf) == 7)
                del view
        gc.collect()
        allocation.close()
    finally:
        b.close()


def test_a_vmm_fabric_backend_works_or_is_refused_by_name():
    try:
        b = open_backend("cuda-vmm", local_rank=0, local_size=1, handle="fabric")
    except BackendError as exc:
        assert "fabric" in str(exc)
        assert "CUDA_ERROR_NOT_PERMITTED" in str(exc) or "is 0" in str(exc), str(exc)
        if "NOT_PERMITTED" in str(exc):
            assert "IMEX" in str(exc) and "--handle posix-fd" in str(exc)
        return
    try:
        assert b.uses_fds is False
        allocation = b.allocate(b.granularity)
        exported = b.export(allocation)
        assert exported.fd is None and len(exported.payload) > 64
        allocation.close()
    finally:
        b.close()
