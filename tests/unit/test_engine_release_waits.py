"""A closing window meets its own unmet signal waits from the host (CudaEngine.release_waits),
so a stream stuck on a peer that never signalled drains before its memory is freed. The
driver's two copies are replaced by a dictionary of words: no GPU needed."""

from __future__ import annotations

import ctypes
import types

import pytest

cuda_engine = pytest.importorskip("ipcshare.backends.cuda_engine")
from ipcshare.runtime import cuda_driver  # noqa: E402


class _Words:
    """cuMemcpyDtoH / cuMemcpyHtoD over a dict of 64-bit words (address -> value)."""

    def __init__(self) -> None:
        self.words: dict[int, int] = {}
        self.writes: list[int] = []

    def cuMemcpyDtoH(self, dst: int, src: int, size: int):
        ctypes.c_uint64.from_address(dst).value = self.words.get(src, 0) & ((1 << 8 * size) - 1)
        return (cuda_driver.SUCCESS,)

    def cuMemcpyHtoD(self, dst: int, src: int, size: int):
        self.words[dst] = ctypes.c_uint64.from_address(src).value & ((1 << 8 * size) - 1)
        self.writes.append(dst)
        return (cuda_driver.SUCCESS,)


@pytest.mark.parametrize("wide", [True, False])
def test_only_unmet_waits_on_the_given_pad_are_met(monkeypatch, wide):
    words = _Words()
    monkeypatch.setattr(cuda_engine, "driver", words)
    engine = cuda_engine.CudaEngine.__new__(cuda_engine.CudaEngine)
    engine.wide_signals = wide
    engine._mask = (1 << 64) - 1 if wide else (1 << 32) - 1
    pad = types.SimpleNamespace(ptr=0x10000, nbytes=65536)
    unmet, met, elsewhere = pad.ptr + 8 * 261, pad.ptr + 8 * 262, 0x90000
    words.words[met] = 5
    engine._pending = {unmet: (7, 0.5, "waiting for rank 1"), met: (5, 0.5, "done"),
                       elsewhere: (1, 0.5, "another window")}
    assert engine.release_waits(pad) == 1
    assert words.writes == [unmet] and words.words[unmet] == 7
    assert elsewhere not in words.words
    assert engine.release_waits(pad) == 0  # met now: nothing more to write
