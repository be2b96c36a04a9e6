"""CUDA C++ kernels shipped with ipcshare, as CUBINs built by NVRTC when the package is built
(shipped.py, build.py), or compiled at run time with NVRTC to CUBIN and cached (compiler.py).

``include/ipcshare/signal.cuh`` is the device-side signal API (release/acquire at system
scope, timeouts that report instead of hanging) for ipcshare's kernels and users' own.
"""

from __future__ import annotations

from .compiler import KERNEL_SOURCES, compile_kernel_source, include_dir, nvrtc_version

__all__ = ["KERNEL_SOURCES", "compile_kernel_source", "include_dir", "nvrtc_version"]
