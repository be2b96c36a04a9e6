"""Compile ipcshare's CUDA C++ kernels with NVRTC to CUBIN for one architecture, cached on
disk by (source hash, architecture, NVRTC version).

CUBIN, not PTX: an NVRTC newer than the node's driver emits PTX the driver cannot load,
while machine code for the exact architecture (sm_90 on H100/H200) always loads.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

from ..runtime import settings
from ..runtime.errors import KernelCompileError
from ..runtime.nvrtc import check_nvrtc, nvrtc_bindings

__all__ = ["KERNEL_SOURCES", "include_dir", "nvrtc_version", "compile_kernel_source",
           "cache_dir", "device_arch"]

# Kernel source files shipped in ipcshare/kernels/src, and the entry points each defines.
_REDUCING_COLLECTIVES = ("all_reduce_one_shot", "all_reduce_two_shot", "reduce_scatter_one_shot",
                         "all_reduce_ll", "all_reduce_ll_two_shot", "reduce_scatter_ll",
                         "all_reduce_stepped", "reduce_scatter_stepped", "all_reduce_copy_engine",
                         "all_reduce_push", "reduce_scatter_push", "reduce_scatter_ll128",
                         "all_reduce_ll128", "all_reduce_ll128_two_shot")
KERNEL_SOURCES = {
    "allgather.cu": ("allgather_push", "allgather_pull", "allgather_ring", "allgather_scatter"),
    # collectives/gpu_path.py names them <collective>_<dtype>_<op>.
    "collectives.cu": ("all_gather_pull_bytes", "all_gather_push_bytes", "all_gather_ll_bytes",
                       "all_gather_ll128_bytes", "all_gather_stepped_bytes",
                       *(f"all_to_all{v}_{algo}_bytes" for v in ("", "_v")
                         for algo in ("pull", "balanced", "ll", "ll128")),
                       "all_to_all_push_bytes", "all_to_all_v_push_bytes",
                       "all_to_all_v_eager_bytes", "publish_call", "finish_call",
                       *(f"stage_and_publish_{kind}"
                         for kind in ("bytes", "float32", "float16", "bfloat16", "int32")), *(
        f"{name}_{dtype}_{op}" for name in _REDUCING_COLLECTIVES
        for dtype in ("float32", "float16", "bfloat16", "int32") for op in ("sum", "max", "min"))),
    "barrier.cu": ("device_barrier",),
    "empty.cu": ("empty_kernel",),
    "p2p_direct.cu": ("p2p_push", "p2p_spin"),
}
_OPTIONS = ("-std=c++17", "-default-device", "--use_fast_math")


def _package_dir() -> Path:
    return Path(str(resources.files("ipcshare.kernels")))


def include_dir() -> Path:
    """The folder to pass as ``--include-path`` so ``#include <ipcshare/signal.cuh>`` works."""
    return _package_dir() / "include"


def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the NVRTC library that compiles our kernels.

    Raises:
        KernelCompileError: NVRTC is not installed or cannot be loaded.
    """
    nvrtc = nvrtc_bindings()
    try:
        major, minor = check_nvrtc(nvrtc, "nvrtcVersion", nvrtc.nvrtcVersion())
    except RuntimeError as exc:  # the bindings could not find libnvrtc
        raise KernelCompileError(f"NVRTC library not found: {exc}; "
                                 "pip install nvidia-cuda-nvrtc") from exc
    return int(major), int(minor)


def cache_dir() -> Path:
    """Where CUBINs are kept: ``$IPCSHARE_KERNEL_CACHE`` or ``~/.cache/ipcshare/kernels``."""
    configured = settings.kernel_cache()
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ipcshare" / "kernels"


def device_arch(ordinal: int) -> str:
    """``sm_XY`` for CUDA device ``ordinal`` (compute capability X.Y)."""
    from ..runtime import cuda_driver

    major = cuda_driver.device_attribute(ordinal, "COMPUTE_CAPABILITY_MAJOR")
    minor = cuda_driver.device_attribute(ordinal, "COMPUTE_CAPABILITY_MINOR")
    return f"sm_{major}{minor}"


def _source_text(source: str | os.PathLike, code: str | None) -> tuple[str, str]:
    if code is not None:
        return str(source), code
    path = Path(source)
    if not path.is_absolute():
        path = _source_dir() / path
    try:
        return path.name, path.read_text()
    except OSError as exc:
        raise KernelCompileError(f"kernel source {str(path)!r} cannot be read: {exc.strerror}") \
            from None


def _source_dir() -> Path:
    """The folder of the shipped kernel sources, also an include path: a source's parts
    (``#include "collectives/push.cuh"``) live beside it."""
    return _package_dir() / "src"


def _headers_digest() -> str:
    """A digest of every header a kernel may include (public and the sources' parts), so
    a cached CUBIN is never reused after any of them changed."""
    digest = hashlib.sha256()
    for root in (include_dir(), _source_dir()):
        for header in sorted(root.rglob("*.cuh")):
            digest.update(str(header.relative_to(root)).encode())
            digest.update(header.read_bytes())
    return digest.hexdigest()


def _cache_key(text: str, options: tuple[str, ...]) -> str:
    """The CUBIN's cache key: source, headers and options, where our own include folders
    count by their headers' content (the digest), not by where the package lies. One tree
    checked out twice, or unpacked on another machine, then finds the same CUBINs."""
    own = {f"--include-path={include_dir()}": "--include-path=<ipcshare include>",
           f"--include-path={_source_dir()}": "--include-path=<ipcshare sources>"}
    placed = (own.get(option, option) for option in options)
    return hashlib.sha256("\0".join((text, _headers_digest(), *placed)).encode()).hexdigest()[:20]


def compile_kernel_source(source: str | os.PathLike, *, arch: str = "sm_90",
                          code: str | None = None, options: tuple[str, ...] = (),
                          use_cache: bool = True) -> bytes:
    """CUBIN for ``source`` (a file in ipcshare/kernels/src, a path, or a name with ``code``).

    Raises:
        KernelCompileError: NVRTC missing, or the source does not compile (the message
            carries NVRTC's log).
    """
    if not arch.startswith("sm_") or not arch[3:].rstrip("a").isdigit():
        raise KernelCompileError(f"architecture {arch!r} is not of the form sm_90 / sm_90a")
    name, text = _source_text(source, code)
    major, minor = nvrtc_version()
    all_options = (f"--gpu-architecture={arch}", *_OPTIONS,
                   f"--include-path={include_dir()}", f"--include-path={_source_dir()}",
                   *options)
    key = _cache_key(text, all_options)
    cached = cache_dir() / f"{Path(name).stem}-{key}-{arch}-nvrtc{major}.{minor}.cubin"
    if not use_cache:
        with _note_if_slow(name, arch, None):
            return _compile(name, text, all_options, arch)
    if cached.is_file():
        return cached.read_bytes()
    # Ranks of a node starting together on a cold cache: one compiles (and says so),
    # the others wait for its file instead of each spending the same half minute.
    with _compile_lock(cached):
        if cached.is_file():
            return cached.read_bytes()
        with _note_if_slow(name, arch, cached.parent):
            cubin = _compile(name, text, all_options, arch)
        _store(cached, cubin)
    return cubin


# A compile still running after this long gets one line on stderr: collectives.cu takes
# 30-60 s on a fresh machine (2026-11-28), which a user would otherwise take for a hang.
COMPILE_NOTE_AFTER_S = 3.0


@contextlib.contextmanager
def _note_if_slow(name: str, arch: str, cache: Path | None) -> Iterator[None]:
    def note() -> None:
        kept = f"kept in {cache} for later runs" if cache is not None else "not cached"
        sys.stderr.write(f"ipcshare: compiling {name} for {arch} with NVRTC (once per machine "
                         f"and version, up to a minute; {kept})\n")
        sys.stderr.flush()
    timer = threading.Timer(COMPILE_NOTE_AFTER_S, note)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


@contextlib.contextmanager
def _compile_lock(cached: Path) -> Iterator[None]:
    """An exclusive lock beside ``cached`` (a ``.lock`` file it leaves in the cache for
    the next cold start); no lock where the cache cannot be written or locked."""
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(cached.with_name(cached.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            pass  # a file system without locks (some NFS): every rank compiles, as before
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _compile(name: str, text: str, options: tuple[str, ...], arch: str) -> bytes:
    nvrtc = nvrtc_bindings()
    program = check_nvrtc(nvrtc, "nvrtcCreateProgram",
                     nvrtc.nvrtcCreateProgram(text.encode(), name.encode(), 0, [], []))
    try:
        encoded = [option.encode() for option in options]
        (err,) = nvrtc.nvrtcCompileProgram(program, len(encoded), encoded)
        if int(err) != 0:
            size = check_nvrtc(nvrtc, "nvrtcGetProgramLogSize",
                               nvrtc.nvrtcGetProgramLogSize(program))
            log = b" " * size
            check_nvrtc(nvrtc, "nvrtcGetProgramLog", nvrtc.nvrtcGetProgramLog(program, log))
            text_log = log.decode(errors="replace").rstrip("\x00 \n")
            raise KernelCompileError(f"NVRTC could not compile {name} for {arch}:\n{text_log}")
        size = check_nvrtc(nvrtc, "nvrtcGetCUBINSize", nvrtc.nvrtcGetCUBINSize(program))
        cubin = b" " * size
        check_nvrtc(nvrtc, "nvrtcGetCUBIN", nvrtc.nvrtcGetCUBIN(program, cubin))
        return cubin
    finally:
        nvrtc.nvrtcDestroyProgram(program)


def _store(path: Path, data: bytes) -> None:
    # Write then rename: ranks compiling the same kernel at once never see half a file.
    # The only files it ever removes or replaces are the temporary file it just made and
    # the cache entry of this exact kernel (docs/RELIABILITY.md, "What ipcshare deletes").
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    except OSError:
        return  # an unwritable cache only costs a recompile next time
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)  # ours: mkstemp made it a moment ago
        except OSError:
            pass
