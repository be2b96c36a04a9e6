"""What one CUBIN is built from (``KernelBuild``): a kernel source's name and text, the
architecture, every NVRTC option, and the key that digests them with every header a kernel
may include. Reading files only: neither NVRTC nor a GPU is needed, so the compiler
(compiler.py) and the shipped CUBINs (shipped.py) both name builds from here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from importlib import resources
from pathlib import Path

from ..runtime.errors import KernelCompileError

__all__ = ["KernelBuild", "kernel_build", "include_dir", "package_dir"]

_OPTIONS = ("-std=c++17", "-default-device", "--use_fast_math")


def package_dir() -> Path:
    return Path(str(resources.files("ipcshare.kernels")))


def include_dir() -> Path:
    """The folder to pass as ``--include-path`` so ``#include <ipcshare/signal.cuh>`` works."""
    return package_dir() / "include"


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
    return package_dir() / "src"


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


@dataclasses.dataclass(frozen=True)
class KernelBuild:
    """What one CUBIN is built from: the source's name and text, the architecture, every
    NVRTC option, and ``key``, the digest of source, headers and options (the NVRTC
    version completes it where the CUBIN is cached or shipped)."""

    name: str
    text: str
    arch: str
    options: tuple[str, ...]
    key: str

    @property
    def stem(self) -> str:
        return Path(self.name).stem


def kernel_build(source: str | os.PathLike, *, arch: str = "sm_90", code: str | None = None,
                 options: tuple[str, ...] = ()) -> KernelBuild:
    """The build of ``source`` (a file in ipcshare/kernels/src, a path, or a name with
    ``code``) for ``arch``; reads files only, NVRTC is not needed.

    Raises:
        KernelCompileError: a bad architecture, or the source cannot be read.
    """
    if not arch.startswith("sm_") or not arch[3:].rstrip("a").isdigit():
        raise KernelCompileError(f"architecture {arch!r} is not of the form sm_90 / sm_90a")
    name, text = _source_text(source, code)
    all_options = (f"--gpu-architecture={arch}", *_OPTIONS,
                   f"--include-path={include_dir()}", f"--include-path={_source_dir()}",
                   *options)
    return KernelBuild(name, text, arch, all_options, _cache_key(text, all_options))
