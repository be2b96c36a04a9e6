"""The package's shipped CUBINs on a GPU: where the package ships this GPU's architecture,
every kernel source is served from it, a communicator loads every collective unit with no
compile and nothing written to an empty cache, every entry point resolves in the loaded
modules, and a first all-reduce is right. One process (a world of one)."""

from __future__ import annotations

import pytest

import ipcshare
from ipcshare.kernels import compiler
from ipcshare.kernels.compiler import COLLECTIVE_UNITS, KERNEL_SOURCES, device_arch, kernel_build
from ipcshare.kernels.shipped import shipped_state

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu]


def test_a_first_call_runs_on_the_shipped_kernels(tmp_path, monkeypatch):
    arch = device_arch(0)
    states = {source: shipped_state(kernel_build(source, arch=arch)) for source in KERNEL_SOURCES}
    if set(states.values()) == {"missing"}:
        pytest.skip(f"this install ships no {arch} kernels (IPCSHARE_KERNEL_ARCHS at its build)")
    assert set(states.values()) == {"shipped"}, states
    compiled: list[str] = []

    def refuse(name, text, options, arch):
        compiled.append(name)
        raise AssertionError(f"{name} compiled for {arch}: the shipped CUBIN should serve")
    monkeypatch.setattr(compiler, "_compile", refuse)
    monkeypatch.setenv("IPCSHARE_KERNEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("IPCSHARE_KERNEL_TRACE", raising=False)
    with ipcshare.Group(backend="cuda-vmm") as g, g.communicator(max_bytes=1 << 20) as comm:
        kernels = g.backend.kernels("collectives.cu")
        for entries in COLLECTIVE_UNITS.values():
            for entry in entries:
                kernels.function(entry)  # CUDA_ERROR_NOT_FOUND would raise
        torch.cuda.set_device(g.backend.device)
        x = torch.full((1000,), 3.0, device=f"cuda:{g.backend.device}")
        comm.all_reduce(x, op="sum")
        torch.cuda.synchronize()
        assert bool((x == 3.0 * g.size).all())
    assert compiled == []
    assert not list((tmp_path / "cache").glob("*.cubin"))
