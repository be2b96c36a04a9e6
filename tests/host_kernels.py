"""Kernel headers' host-side arithmetic (``IPCSHARE_HD`` functions), compiled for this
host with its C++ compiler and loaded through ctypes, so tests run the kernels' own rules
instead of a Python copy of them."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

import ipcshare.kernels

__all__ = ["build_for_host"]

_KERNELS = Path(ipcshare.kernels.__file__).parent


def build_for_host(folder: Path, shim: str, what: str) -> ctypes.CDLL:
    """``shim`` (C++ that includes kernel headers and exports ``extern "C"`` functions),
    compiled in ``folder`` as a shared library and loaded. Skips the test where the host
    has no C++ compiler (``what`` says what it would have built)."""
    compiler = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        pytest.skip(f"needs a C++ compiler to build {what} for the host")
    (folder / "shim.cpp").write_text(shim)
    library = folder / "shim.so"
    subprocess.run([compiler, "-std=c++17", "-O1", "-shared", "-fPIC",
                    f"-I{_KERNELS / 'include'}", f"-I{_KERNELS / 'src'}",
                    str(folder / "shim.cpp"), "-o", str(library)],
                   check=True, capture_output=True, text=True)
    return ctypes.CDLL(str(library))
