"""Stream-ordered work on the caller's streams, and CUDA graphs that replay ipcshare's
operations: bytes really move, peers really synchronise, every replay verifies."""

from __future__ import annotations

import numpy as np
import pytest

import ipcshare
from ipcshare.patterns import make_pattern
from ipcshare.patterns.driver import run_pattern
from ipcshare.patterns.seeding import seeded_bytes
from ipcshare.runtime.config import merge_options
from ipcshare.runtime.errors import ConfigError, KernelCompileError
from ipcshare.window import USER_SLOT_BASE

pytestmark = [pytest.mark.gpu, pytest.mark.mpi]

GRAPH_ALGOS = ["copy-engine", "push", "pull", "ring", "auto"]


@pytest.mark.nvrtc
@pytest.mark.parametrize("timing", ["nccl-tests", "latency"])
@pytest.mark.parametrize("algo", GRAPH_ALGOS)
def test_graph_replays_of_every_allgather_verify(comm, algo, timing):
    if comm.size > 8:
        pytest.skip("kernels take at most 8 ranks")
    opts = merge_options({"backend": "cuda-vmm", "iters": 4, "warmup": 1, "checks": 3,
                          "min_bytes": 1, "max_bytes": 3 << 20, "step_factor": 11,
                          "datatype": "uint8", "algo": algo})
    with ipcshare.Group(backend="cuda-vmm") as g:
        try:
            result = run_pattern(g, make_pattern("allgather", algo), opts, timing=timing,
                                 rotate=2, emit=lambda _l: None, graph=True)
        except KernelCompileError as exc:  # the same on every rank
            pytest.skip(f"needs NVRTC: {exc}")
    assert comm.allgather(result.wrong_total) == [0] * comm.size
    assert result.timing == "graph"
    assert result.statistic == ("mean" if timing == "nccl-tests" else "median")
    assert len(result.rows) >= 6 and all(r.primary.time_us > 0 for r in result.rows)


@pytest.mark.nvrtc
def test_a_captured_exchange_replays_correctly_many_times(comm):
    """Each replay: device barrier, write my block (its value changes per replay through
    a device-side copy from a staging slot) into the next rank, device barrier."""
    n, me = comm.size, comm.rank
    nxt, prev = (me + 1) % n, (me - 1) % n
    block = 4096 + 3
    with ipcshare.Group(backend="cuda-vmm") as g:
        w = g.window(block * 2)
        engine = w.engine
        view = w.on_stream(engine.stream, graph_safe=True)
        source = w.local.slice(0, block)
        target = w.peer(nxt).slice(block, block)
        copy = engine.copier([(target, source)])

        def exchange() -> None:
            view.barrier()
            copy()
            view.barrier()
        try:
            graph = engine.capture(exchange)
        except KernelCompileError as exc:
            pytest.skip(f"needs NVRTC: {exc}")
        good = []
        try:
            for replay in range(5):
                engine.upload(source, seeded_bytes(replay, me, block))
                w.barrier()       # every rank's new source is in place (eager barrier)
                graph.launch()
                w.synchronize()
                got = engine.download(w.local.slice(block, block))
                good.append(bool(np.array_equal(got, seeded_bytes(replay, prev, block))))
                w.barrier()       # nobody overwrites a source before its peer has read it
        finally:
            graph.close()
            w.close()
    assert comm.allgather(good) == [[True] * 5] * n


def test_signals_and_barriers_run_on_a_torch_stream(comm):
    torch = pytest.importorskip("torch")
    n, me = comm.size, comm.rank
    nxt, prev = (me + 1) % n, (me - 1) % n
    count = 1 << 16
    with ipcshare.Group(backend="cuda-ipc") as g:
        torch.cuda.set_device(g.backend.device)
        stream = torch.cuda.Stream()
        w = g.window(count * 4)
        with torch.cuda.stream(stream):
            torch.from_dlpack(w.local).view(torch.float32)[:count].fill_(-1.0)
        w.barrier(stream=stream)
        with torch.cuda.stream(stream):
            peer = torch.from_dlpack(w.peer(nxt)).view(torch.float32)[:count]
            peer.copy_(torch.arange(count, device=peer.device, dtype=torch.float32) + me)
        w.put_signal(nxt, USER_SLOT_BASE + 2, 1, stream=stream)
        w.wait_signal(USER_SLOT_BASE + 2, 1, peer=prev, stream=stream)
        w.barrier(stream=stream)
        stream.synchronize()
        mine = torch.from_dlpack(w.local).view(torch.float32)[:count].cpu().numpy()
        expected = np.arange(count, dtype=np.float32) + prev
        ok = bool(np.array_equal(mine, expected))
        w.close()
    assert comm.allgather(ok) == [True] * n


def test_a_stream_of_another_device_is_refused(comm, gpus):
    from ipcshare.runtime import cuda_driver
    from ipcshare.runtime.cuda_driver import check, driver

    if gpus < 2:
        pytest.skip("needs two visible GPUs")
    with ipcshare.Group(backend="cuda-vmm") as g:
        w = g.window(4096)
        other = (g.backend.device + 1) % gpus
        with cuda_driver.primary_context(other):
            stream = check("cuStreamCreate", driver.cuStreamCreate(
                int(driver.CUstream_flags.CU_STREAM_NON_BLOCKING)))
            try:
                with pytest.raises(ConfigError, match=f"belongs to cuda:{other}"):
                    w.barrier(stream=stream)
                with pytest.raises(ConfigError, match="not a CUDA stream"):
                    w.on_stream("default")
            finally:
                driver.cuStreamDestroy(stream)
        w.close()
