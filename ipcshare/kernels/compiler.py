"""ipcshare's CUDA C++ kernels as CUBIN for one architecture: the CUBIN shipped in the
package (kernels/shipped.py) where it was built from the same source, headers and options
by the same NVRTC, else compiled with NVRTC and cached on disk by (source, headers,
options, NVRTC version).

CUBIN, not PTX: an NVRTC newer than the node's driver emits PTX the driver cannot load,
while machine code for the exact architecture (sm_90 on H100/H200) always loads.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from ..runtime import settings
from ..runtime.errors import KernelCompileError
from ..runtime.nvrtc import check_nvrtc, nvrtc_bindings
from .build_key import KernelBuild, include_dir, kernel_build

__all__ = ["KERNEL_SOURCES", "COLLECTIVE_UNITS", "COLLECTIVES", "collective_unit",
           "include_dir", "nvrtc_version", "compile_kernel_source", "compile_uncached",
           "KernelBuild", "kernel_build", "cached_path", "cache_dir", "device_arch"]

# Kernel source files shipped in ipcshare/kernels/src, and the entry points each defines.
_DTYPES = ("float32", "float16", "bfloat16", "int32")


def _reductions(*collectives: str) -> tuple[str, ...]:
    """Entry points ``<collective>_<dtype>_<op>`` (collectives/gpu_path.py's names)."""
    return tuple(f"{name}_{dtype}_{op}" for name in collectives for dtype in _DTYPES
                 for op in ("sum", "max", "min"))


# The collectives, one translation unit a kernel family (kernels/src/collectives_*.cu), so
# that a call compiles (where nothing was shipped for its GPU) only its family, ranks of a
# node compile different families side by side, and a build spreads over its cores.
# Heaviest first: a build's pool starts them first.
COLLECTIVE_UNITS: dict[str, tuple[str, ...]] = {
    "collectives_ll128.cu": (*_reductions("reduce_scatter_ll128", "all_reduce_ll128",
                                          "all_reduce_ll128_two_shot"),
                             "all_gather_ll128_bytes"),
    "collectives_ll.cu": (*_reductions("all_reduce_ll", "all_reduce_ll_two_shot",
                                       "reduce_scatter_ll"), "all_gather_ll_bytes"),
    "collectives_push.cu": (*_reductions("all_reduce_push", "reduce_scatter_push"),
                            "all_gather_push_bytes"),
    "collectives_all_to_all.cu": (*(f"all_to_all{v}_{algo}_bytes" for v in ("", "_v")
                                    for algo in ("pull", "balanced", "ll", "ll128")),
                                  "all_to_all_push_bytes", "all_to_all_v_push_bytes",
                                  "all_to_all_v_eager_bytes"),
    "collectives_one_shot.cu": (*_reductions("all_reduce_one_shot", "all_reduce_two_shot",
                                             "reduce_scatter_one_shot"),
                                "all_gather_pull_bytes"),
    "collectives_stepped.cu": (*_reductions("all_reduce_stepped", "reduce_scatter_stepped"),
                               "all_gather_stepped_bytes", "guest_copy_out_bytes",
                               *(f"stage_and_publish_{kind}" for kind in ("bytes", *_DTYPES))),
    "collectives_copy_engine.cu": (*_reductions("all_reduce_copy_engine"), "publish_call",
                                   "guard_all_to_all_output", "guard_all_reduce_output",
                                   "finish_call"),
}
# The name under which a backend's ``kernels()`` gives every collective unit at once.
COLLECTIVES = "collectives.cu"
KERNEL_SOURCES: dict[str, tuple[str, ...]] = {
    "allgather.cu": ("allgather_push", "allgather_pull", "allgather_ring", "allgather_scatter"),
    **COLLECTIVE_UNITS,
    "barrier.cu": ("device_barrier",),
    "empty.cu": ("empty_kernel",),
    "p2p_direct.cu": ("p2p_push", "p2p_spin"),
}
_UNIT_OF_ENTRY = {entry: unit for unit, entries in COLLECTIVE_UNITS.items()
                  for entry in entries}


def collective_unit(entry: str) -> str:
    """The translation unit (a file of kernels/src) that defines collective ``entry``.

    Raises:
        KernelCompileError: no collective unit defines it.
    """
    unit = _UNIT_OF_ENTRY.get(entry)
    if unit is None:
        raise KernelCompileError(f"no collective kernel is called {entry!r}")
    return unit


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


def cached_path(build: KernelBuild, nvrtc: tuple[int, int]) -> Path:
    """The cache's file for ``build`` compiled by NVRTC ``nvrtc`` (major, minor)."""
    major, minor = nvrtc
    return cache_dir() / f"{build.stem}-{build.key}-{build.arch}-nvrtc{major}.{minor}.cubin"


def compile_kernel_source(source: str | os.PathLike, *, arch: str = "sm_90",
                          code: str | None = None, options: tuple[str, ...] = (),
                          use_cache: bool = True) -> bytes:
    """CUBIN for ``source`` (a file in ipcshare/kernels/src, a path, or a name with ``code``):
    the package's shipped CUBIN where its key matches (NVRTC is then neither imported nor
    called), else the cache's, else compiled now and cached. ``use_cache=False`` compiles
    whatever is shipped or cached.

    Raises:
        KernelCompileError: NVRTC missing, or the source does not compile (the message
            carries NVRTC's log).
        SettingError: IPCSHARE_KERNEL_SHIPPED is not 0 or 1.
    """
    build = kernel_build(source, arch=arch, code=code, options=options)
    if not use_cache:
        return compile_uncached(build)
    if code is None:
        from .shipped import find_shipped

        shipped = find_shipped(build)
        if shipped is not None:
            return shipped
    cached = cached_path(build, nvrtc_version())
    if cached.is_file():
        return cached.read_bytes()
    # Ranks of a node starting together on a cold cache: one compiles (and says so),
    # the others wait for its file instead of each spending the same half minute.
    with _compile_lock(cached):
        if cached.is_file():
            return cached.read_bytes()
        with _note_if_slow(build.name, arch, cached.parent):
            cubin = _compile(build.name, build.text, build.options, arch)
        _store(cached, cubin)
    return cubin


def compile_uncached(build: KernelBuild) -> bytes:
    """Compile ``build`` with NVRTC now, whatever is shipped or cached.

    Raises:
        KernelCompileError: NVRTC missing, or the source does not compile.
    """
    with _note_if_slow(build.name, build.arch, None):
        return _compile(build.name, build.text, build.options, build.arch)


# A compile still running after this long gets one line on stderr: a collective unit takes
# 3-25 s on a 2-core machine (2026-12-06), which a user would otherwise take for a hang.
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
