"""NVRTC's checked call: the one module, beside ``cuda_driver``, that imports
``cuda.bindings`` (``nvrtc``, on first use), so that compile errors read
``nvrtcCompileProgram -> NVRTC_ERROR_COMPILATION`` wherever they come from."""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from typing import Any

from .errors import KernelCompileError

__all__ = ["nvrtc_bindings", "check_nvrtc"]


def nvrtc_bindings() -> Any:
    """The NVRTC bindings (imported on first use: compiling is optional).

    Raises:
        KernelCompileError: cuda-bindings or NVRTC is not installed.
    """
    _load_wheel_nvrtc_on_sys_path()
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:
        raise KernelCompileError(
            "kernel compilation needs NVRTC: pip install 'ipcshare[nvrtc]' "
            f"(cuda-bindings and nvidia-cuda-nvrtc) — {exc}") from exc
    return nvrtc


# Where an NVRTC wheel (nvidia-cuda-nvrtc 13, or 12) puts the library, as cuda-pathfinder
# looks for it.
_WHEEL_LIBRARIES = ("nvidia/cu13/lib/libnvrtc.so.13", "nvidia/cuda_nvrtc/lib/libnvrtc.so.12")


@functools.lru_cache(maxsize=1)
def _load_wheel_nvrtc_on_sys_path() -> str | None:
    """Load the NVRTC of the first wheel on ``sys.path`` (its path; None: none there).

    cuda-pathfinder, which cuda-bindings asks for the library, searches site-packages and
    the system, and takes a library already loaded first. A wheel on ``sys.path`` outside
    site-packages is otherwise not found: pip's isolated build environment (where the
    package's kernels are compiled), or ``pip install --target DIR`` with PYTHONPATH=DIR.
    Loading it here (it finds its builtins library beside itself) makes it the one used.
    """
    if not sys.platform.startswith("linux"):
        return None
    for entry in sys.path:
        for library in _WHEEL_LIBRARIES:
            path = os.path.join(entry or os.curdir, library)
            if os.path.isfile(path):
                try:
                    ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                except OSError:
                    continue  # not loadable here (another platform's wheel): look on
                return path
    return None


def check_nvrtc(nvrtc: Any, call: str, result: tuple) -> Any:
    """NVRTC's checked call: ``result`` is a binding's ``(err, *values)``; the values
    come back (one alone, several as a list).

    Raises:
        KernelCompileError: ``CALL -> NVRTC_ERROR_NAME``.
    """
    err, *values = result
    if int(err) != 0:
        _, name = nvrtc.nvrtcGetErrorString(err)
        raise KernelCompileError(f"{call} -> {name.decode() if isinstance(name, bytes) else name}")
    return values[0] if len(values) == 1 else values
