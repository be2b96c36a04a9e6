"""The kernel cache on a cold start, without NVRTC: ranks of a node compiling the same
kernel at once compile it once, and a compile that takes long says so on stderr."""

from __future__ import annotations

import threading
import time

import pytest

from ipcshare.kernels import compiler


@pytest.fixture
def slow_compiler(tmp_path, monkeypatch):
    """NVRTC replaced by a fake that takes 0.3 s and counts its compiles."""
    calls: list[str] = []

    def fake_compile(name, text, options, arch):
        calls.append(name)
        time.sleep(0.3)
        return b"\x7fELF fake cubin of " + name.encode()

    monkeypatch.setattr(compiler, "nvrtc_version", lambda: (13, 0))
    monkeypatch.setattr(compiler, "_compile", fake_compile)
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
    shutil.copytree(compiler._package_dir(), moved)
    monkeypatch.setattr(compiler, "_package_dir", lambda: moved)
    assert compiler.include_dir() == moved / "include"
    compiler.compile_kernel_source("barrier.cu")
    assert slow_compiler == ["barrier.cu"]  # found in the cache
    header = next((moved / "include").rglob("*.cuh"))
    header.write_text(header.read_text() + "\n// changed\n")
    compiler.compile_kernel_source("barrier.cu")
    assert slow_compiler == ["barrier.cu", "barrier.cu"]
