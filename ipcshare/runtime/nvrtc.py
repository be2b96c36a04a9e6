"""NVRTC's checked call: the one module, beside ``cuda_driver``, that imports
``cuda.bindings`` (``nvrtc``, on first use), so that compile errors read
``nvrtcCompileProgram -> NVRTC_ERROR_COMPILATION`` wherever they come from."""

from __future__ import annotations

from typing import Any

from .errors import KernelCompileError

__all__ = ["nvrtc_bindings", "check_nvrtc"]


def nvrtc_bindings() -> Any:
    """The NVRTC bindings (imported on first use: compiling is optional).

    Raises:
        KernelCompileError: cuda-bindings or NVRTC is not installed.
    """
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:
        raise KernelCompileError(
            "kernel compilation needs NVRTC: pip install 'ipcshare[nvrtc]' "
            f"(cuda-bindings and nvidia-cuda-nvrtc) — {exc}") from exc
    return nvrtc


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
