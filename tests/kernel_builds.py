"""The kernels a test run checks, built once per run: the package's shipped CUBIN where it
serves (the install compiled it with the same NVRTC from the same sources), else compiled
now and kept for the rest of the run. Tests that need a variant (phase stamps, another
architecture) ask for that unit alone."""

from __future__ import annotations

import functools

__all__ = ["run_cubin"]


@functools.cache
def run_cubin(source: str, arch: str = "sm_90", options: tuple[str, ...] = ()) -> bytes:
    """The CUBIN of kernel source ``source`` (a file of kernels/src) for ``arch``.

    Raises:
        KernelCompileError: NVRTC missing (and nothing shipped), or it does not compile.
    """
    from ipcshare.kernels.compiler import compile_uncached, kernel_build
    from ipcshare.kernels.shipped import find_shipped

    build = kernel_build(source, arch=arch, options=options)
    shipped = find_shipped(build)
    return shipped if shipped is not None else compile_uncached(build)
