"""The kernel cache on a cold start, without NVRTC: ranks of a node compiling the same
kernel at once compile it once, and a compile that takes long says so on stderr; the
package's shipped CUBINs serve without NVRTC, only under their exact key, and a build
writes them with their manifest, compiling only what changed."""

from __future__ import annotations

import hashlib
import json
import threading
import time

import pytest

from ipcshare.kernels import build, build_key, compiler, shipped
from ipcshare.runtime.errors import KernelCompileError


@pytest.fixture
def slow_compiler(tmp_path, monkeypatch):
    """NVRTC replaced by a fake that takes 0.3 s and counts its compiles."""
    calls: list[str] = []

    def fake_compile(name, text, options, arch):
        calls.append(name)
        time.sleep(0.3)
        return b"\x7fELF fake cubin of " + name.encode()

    monkeypatch.setattr(compiler, "nvrtc_version", lambda: (13, 0))
    monkeypatch.setattr(build, "nvrtc_version", lambda: (13, 0))
    monkeypatch.setattr(compiler, "_compile", fake_compile)
    monkeypatch.setattr(shipped, "installed_nvrtc", lambda: "13.0")
    monkeypatch.setattr(shipped, "shipped_dir", lambda: tmp_path / "shipped")
    monkeypatch.setenv("IPCSHARE_KERNEL_CACHE", str(tmp_path / "cache"))
    return calls


def test_ranks_starting_together_compile_a_kernel_once(slow_compiler):
    results: list[bytes] = []

    def rank() -> None:
        results.append(compiler.compile_kernel_source("barrier.cu"))

    threads = [threading.Thread(target=rank) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert slow_compiler == ["barrier.cu"]
    assert len(results) == 4 and len(set(results)) == 1


def test_a_long_compile_says_what_it_does_and_a_cached_one_says_nothing(
        slow_compiler, monkeypatch, capfd):
    monkeypatch.setattr(compiler, "COMPILE_NOTE_AFTER_S", 0.05)
    compiler.compile_kernel_source("barrier.cu", arch="sm_90")
    said = capfd.readouterr().err
    assert said.count("\n") == 1
    assert "ipcshare: compiling barrier.cu for sm_90 with NVRTC" in said
    assert "kept in " in said and "cache" in said
    compiler.compile_kernel_source("barrier.cu", arch="sm_90")
    assert capfd.readouterr().err == ""
    assert slow_compiler == ["barrier.cu"]


def test_a_quick_compile_says_nothing(slow_compiler, monkeypatch, capfd):
    monkeypatch.setattr(compiler, "COMPILE_NOTE_AFTER_S", 5.0)
    compiler.compile_kernel_source("barrier.cu", arch="sm_80", use_cache=False)
    assert capfd.readouterr().err == ""


def test_an_unwritable_cache_still_compiles(slow_compiler, tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("IPCSHARE_KERNEL_CACHE", str(blocked / "cache"))
    assert compiler.compile_kernel_source("barrier.cu").startswith(b"\x7fELF")
    assert compiler.compile_kernel_source("barrier.cu").startswith(b"\x7fELF")
    assert slow_compiler == ["barrier.cu", "barrier.cu"]


def test_a_cache_that_cannot_be_locked_still_compiles(slow_compiler, monkeypatch):
    def refuse(fd, operation):
        raise OSError(37, "No locks available")
    monkeypatch.setattr(compiler.fcntl, "flock", refuse)
    assert compiler.compile_kernel_source("barrier.cu").startswith(b"\x7fELF")
    assert compiler.compile_kernel_source("barrier.cu").startswith(b"\x7fELF")
    assert slow_compiler == ["barrier.cu"]  # the second call read the cache


def test_the_cache_key_does_not_depend_on_where_the_package_lies(slow_compiler, tmp_path,
                                                                monkeypatch):
    """A checkout elsewhere with the same kernels finds the CUBINs another compiled; a
    changed header does not."""
    import shutil

    compiler.compile_kernel_source("barrier.cu")
    moved = tmp_path / "elsewhere"
    shutil.copytree(build_key.package_dir(), moved)
    monkeypatch.setattr(build_key, "package_dir", lambda: moved)
    assert compiler.include_dir() == moved / "include"
    compiler.compile_kernel_source("barrier.cu")
    assert slow_compiler == ["barrier.cu"]  # found in the cache
    header = next((moved / "include").rglob("*.cuh"))
    header.write_text(header.read_text() + "\n// changed\n")
    compiler.compile_kernel_source("barrier.cu")
    assert slow_compiler == ["barrier.cu", "barrier.cu"]


def _ship(directory, source="barrier.cu", arch="sm_90", *, key=None, nvrtc="13.0",
          cubin=b"\x7fELF shipped barrier"):
    """A manifest in ``directory`` shipping ``cubin`` as ``source`` for ``arch``."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "barrier-sm_90.cubin").write_bytes(cubin)
    entry = shipped.ShippedCubin(
        source, arch, key or compiler.kernel_build(source, arch=arch).key, nvrtc,
        "barrier-sm_90.cubin", hashlib.sha256(cubin).hexdigest())
    (directory / shipped.MANIFEST_NAME).write_text(json.dumps(
        {"format": shipped.MANIFEST_FORMAT, "nvrtc": nvrtc, "cubins": [entry.as_json()]}))
    return cubin


def test_a_shipped_cubin_serves_without_nvrtc(slow_compiler, tmp_path, monkeypatch):
    def no_nvrtc():
        raise KernelCompileError("kernel compilation needs NVRTC")
    monkeypatch.setattr(compiler, "nvrtc_version", no_nvrtc)
    monkeypatch.setattr(shipped, "installed_nvrtc", lambda: None)
    cubin = _ship(tmp_path / "shipped")
    assert compiler.compile_kernel_source("barrier.cu", arch="sm_90") == cubin
    assert slow_compiler == []
    # Another architecture is not shipped: it needs NVRTC, which is not there.
    with pytest.raises(KernelCompileError, match="needs NVRTC"):
        compiler.compile_kernel_source("barrier.cu", arch="sm_80")


def test_a_shipped_cubin_serves_beside_an_nvrtc_of_another_version(slow_compiler, tmp_path):
    # torch's CUDA builds install their own nvidia-cuda-nvrtc: the shipped machine code of
    # these very sources still serves, and nothing compiles.
    cubin = _ship(tmp_path / "shipped", nvrtc="13.5")
    assert shipped.installed_nvrtc() == "13.0"
    assert compiler.compile_kernel_source("barrier.cu", arch="sm_90") == cubin
    assert slow_compiler == []


@pytest.mark.parametrize("mismatch", ["key", "bytes", "options", "file"])
def test_a_shipped_cubin_of_another_build_is_never_used(slow_compiler, tmp_path, mismatch):
    directory = tmp_path / "shipped"
    _ship(directory, key="0" * 20 if mismatch == "key" else None)
    if mismatch == "bytes":
        (directory / "barrier-sm_90.cubin").write_bytes(b"\x7fELF changed after the build")
    if mismatch == "file":
        (directory / "barrier-sm_90.cubin").unlink()
    options = ("-DOTHER",) if mismatch == "options" else ()
    cubin = compiler.compile_kernel_source("barrier.cu", arch="sm_90", options=options)
    assert cubin == b"\x7fELF fake cubin of barrier.cu"
    assert slow_compiler == ["barrier.cu"]
    state = shipped.shipped_state(compiler.kernel_build("barrier.cu", options=options))
    assert state == ("shipped" if mismatch in ("bytes", "file") else "stale")


def test_a_build_ships_every_source_and_compiles_only_what_changed(slow_compiler, tmp_path,
                                                                   monkeypatch):
    def quick_compile(name, text, options, arch):
        slow_compiler.append(name)
        return b"\x7fELF fake cubin of " + name.encode()
    monkeypatch.setattr(compiler, "_compile", quick_compile)
    directory = tmp_path / "package" / "cubin"
    lines: list[str] = []
    entries = build.build_shipped(directory, ("sm_90", "sm_80"), jobs=1,
                                  progress=lines.append)
    assert {(entry.source, entry.arch) for entry in entries} == {
        (source, arch) for source in compiler.KERNEL_SOURCES for arch in ("sm_90", "sm_80")}
    assert len(slow_compiler) == 2 * len(compiler.KERNEL_SOURCES)
    assert sum("] barrier.cu sm_80 " in line for line in lines) == 1
    manifest = shipped.read_manifest(directory)
    for entry in entries:
        assert manifest[(entry.source, entry.arch)] == entry
        got = shipped.find_shipped(compiler.kernel_build(entry.source, arch=entry.arch),
                                   directory)
        assert got == b"\x7fELF fake cubin of " + entry.source.encode()
    # Again, and with sm_80 dropped: nothing compiles, sm_80's files go (the earlier
    # manifest names them), and a file no manifest of ours names stays.
    (directory / "not-ours-sm_75.cubin").write_bytes(b"\x7fELF put here by someone else")
    del slow_compiler[:]
    build.build_shipped(directory, ("sm_90",), jobs=1, progress=lines.append)
    assert slow_compiler == []
    assert sorted(path.name for path in directory.glob("*.cubin")) == sorted(
        [*(f"{source[:-3]}-sm_90.cubin" for source in compiler.KERNEL_SOURCES),
         "not-ours-sm_75.cubin"])
    assert len(shipped.read_manifest(directory)) == len(compiler.KERNEL_SOURCES)


def test_an_architecture_list_is_read_as_written(monkeypatch):
    assert build.parse_archs("sm_80, sm_90 sm_90") == ("sm_80", "sm_90")
    assert build.parse_archs("none") == ()
    with pytest.raises(KernelCompileError, match="hopper"):
        build.parse_archs("sm_90,hopper")
    monkeypatch.delenv("IPCSHARE_KERNEL_ARCHS", raising=False)
    assert build.archs_to_ship() == shipped.DEFAULT_ARCHS
    monkeypatch.setenv("IPCSHARE_KERNEL_ARCHS", "sm_100")
    assert build.archs_to_ship() == ("sm_100",)


def test_the_collectives_load_by_unit_each_once_ranks_starting_apart():
    from ipcshare.kernels.launcher import CollectiveKernels
    from ipcshare.kernels.trace import TRACED_UNIT

    loads: list[str] = []

    class Unit:
        def __init__(self, name):
            self.name = name

        def function(self, entry):
            assert entry in compiler.COLLECTIVE_UNITS[self.name], (entry, self.name)
            return (self.name, entry)

        def global_array(self, symbol):
            return (self.name, symbol)

    units: dict[str, Unit] = {}

    def load(unit):
        if unit not in units:
            loads.append(unit)
            units[unit] = Unit(unit)
        return units[unit]

    kernels = CollectiveKernels(load)
    assert kernels.function("all_reduce_ll_two_shot_bfloat16_min") == (
        "collectives_ll.cu", "all_reduce_ll_two_shot_bfloat16_min")
    assert kernels.function("stage_and_publish_int32")[0] == "collectives_stepped.cu"
    assert kernels.global_array("ipcshare_trace") == (TRACED_UNIT, "ipcshare_trace")
    assert loads == ["collectives_ll.cu", "collectives_stepped.cu", TRACED_UNIT]
    with pytest.raises(KernelCompileError, match="no collective kernel is called 'nope'"):
        kernels.function("nope")
    # Rank 3 of a cold node starts at the fourth unit, then wraps round.
    del loads[:]
    units.clear()
    kernels.load_all(first=3)
    every = list(compiler.COLLECTIVE_UNITS)
    assert loads == every[3:] + every[:3]


def test_the_setting_turns_shipped_cubins_off(slow_compiler, tmp_path, monkeypatch):
    from ipcshare.runtime.errors import SettingError

    _ship(tmp_path / "shipped")
    monkeypatch.setenv("IPCSHARE_KERNEL_SHIPPED", "0")
    assert compiler.compile_kernel_source("barrier.cu") == b"\x7fELF fake cubin of barrier.cu"
    assert slow_compiler == ["barrier.cu"]
    monkeypatch.setenv("IPCSHARE_KERNEL_SHIPPED", "yes")
    with pytest.raises(SettingError, match="IPCSHARE_KERNEL_SHIPPED='yes': must be 0 or 1"):
        compiler.compile_kernel_source("barrier.cu")
    monkeypatch.setenv("IPCSHARE_KERNEL_SHIPPED", "1")
    assert compiler.compile_kernel_source("barrier.cu") == b"\x7fELF shipped barrier"
