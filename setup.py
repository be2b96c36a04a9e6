"""The package's metadata is in pyproject.toml; this file adds one build step: NVRTC
compiles the kernels for the architectures the package ships (ipcshare/kernels/build.py),
into the wheel, or into the source tree for an editable install, so that a first call
loads them instead of compiling (docs/GPU.md, "Shipped kernels and the cache")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildPyWithKernels(build_py):
    """build_py, then the shipped CUBINs and their manifest."""

    def run(self) -> None:
        super().run()
        sys.path.insert(0, str(ROOT))
        try:
            from ipcshare.kernels.build import archs_to_ship, build_shipped
            from ipcshare.kernels.shipped import SHIPPED_DIR_NAME
        finally:
            sys.path.remove(str(ROOT))
        in_tree = ROOT / "ipcshare" / "kernels" / SHIPPED_DIR_NAME
        # An editable install runs the package from the source tree: its CUBINs go there.
        target = in_tree if self.editable_mode else \
            Path(self.build_lib) / "ipcshare" / "kernels" / SHIPPED_DIR_NAME
        build_shipped(target, archs_to_ship(), reuse=[in_tree] if target != in_tree else [],
                      commit=_commit())


def _commit() -> str | None:
    """The checkout's commit (with -dirty for uncommitted changes), None outside git."""
    try:
        done = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
                              capture_output=True, text=True, timeout=30)
    except OSError:
        return None
    return done.stdout.strip() or None


setup(cmdclass={"build_py": BuildPyWithKernels})
