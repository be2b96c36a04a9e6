"""The parts of ``ipcshare p2p`` that need no GPU: the kernel argument layout, the IPC
half's parsing and merging, and how rows and sizes line up with the IPC runs."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

pytest.importorskip("cuda.bindings")

from ipcshare.p2p import direct, ipc_half
from ipcshare.p2p.gpus import P2P_MAX_TARGETS, PushArgs
from ipcshare.patterns.results import Measurement, Row
from ipcshare.runtime.config import PatternOptions


def test_push_args_match_the_kernels_struct():
    # struct PushArgs { char* targets[8]; const char* source; unsigned long long bytes; }
    assert ctypes.sizeof(PushArgs) == 8 * P2P_MAX_TARGETS + 8 + 8
    assert PushArgs.source.offset == 8 * P2P_MAX_TARGETS
    source = Path(direct.__file__).parents[1] / "kernels" / "src" / "p2p_direct.cu"
    assert f"#define P2P_MAX_TARGETS {P2P_MAX_TARGETS}" in source.read_text()


def test_the_window_setup_line_of_an_ipc_table_is_read():
    stdout = ("# ipcshare 0.1.0  op: allgather\n#  window setup: 41.37 ms for 8392704 bytes "
              "per rank (slowest rank): allocate 1.00\n")
    assert ipc_half.parse_window_setup_ms(stdout) == 41.37
    assert ipc_half.parse_window_setup_ms("no table") is None


def test_ipc_rows_join_the_direct_rows_of_the_same_size():
    kernel = Measurement(10.0, 100.0, 50.0, 0)
    ipc = ipc_half.IpcRun(["mpiexec"], {2048: Measurement(20.0, 50.0, 25.0, 1)})
    rows = ipc_half.merge_rows([Row(1024, 256, {"p2p-kernel": kernel}),
                                Row(2048, 512, {"p2p-kernel": kernel})], ipc)
    assert list(rows[0].modes) == ["p2p-kernel"]
    assert list(rows[1].modes) == ["p2p-kernel", "ipc"] and rows[1].wrong == 1


@pytest.mark.parametrize("count", [2, 3, 4, 8])
def test_direct_sizes_are_those_of_the_ipc_runs(count):
    sweep = PatternOptions(min_bytes=1024, max_bytes=1 << 20, step_factor=4)
    for op in direct.OPS:
        pattern = direct.pattern_of(op)
        assert pattern.name == op
        plans = [pattern.plan(size, count, direct.ELEMENT_SIZE) for size in sweep.sizes()]
        assert all(plan.block_bytes % direct.ELEMENT_SIZE == 0 for plan in plans)
    assert direct.events_needed(count) == count + 1


def test_gpu_handles_release_in_reverse_on_their_gpu_once_and_past_a_failure():
    from ipcshare.p2p.gpus import GpuHandles

    log = []

    class Gpus:
        def activate(self, gpu):
            log.append(("on", gpu))

    def fail(name):
        log.append(("release", name))
        raise RuntimeError("already gone")

    handles = GpuHandles(Gpus())
    handles.own(0, lambda name: log.append(("release", name)), "kernels 0")
    handles.own(1, fail, "stream 1")
    handles.own(1, lambda name: log.append(("release", name)), "event 1")
    handles.close()
    assert log == [("on", 1), ("release", "event 1"), ("on", 1), ("release", "stream 1"),
                   ("on", 0), ("release", "kernels 0")]
    handles.close()   # idempotent: nothing released twice
    assert len(log) == 6
