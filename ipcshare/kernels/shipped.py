"""The CUBINs shipped inside the package (ipcshare/kernels/cubin/), built by NVRTC when the
package is built or installed (kernels/build.py, from setup.py), with a manifest that gives
each one's key: the digest of source, headers and options, and the NVRTC version that
built it.

A shipped CUBIN serves a call only when the key the call computes now matches (the same
source, headers and options): anything else falls back to the cache and NVRTC
(compiler.py). The NVRTC that built it is recorded, not required: the CUBIN is machine
code, and an NVRTC of another version installed beside it (every CUDA build of torch brings
one) compiles nothing here. Finding, reading and checking one imports and calls no
NVRTC, so a node without NVRTC runs the shipped architectures.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from importlib import metadata
from pathlib import Path

from .build_key import KernelBuild, package_dir

__all__ = ["SHIPPED_DIR_NAME", "MANIFEST_NAME", "MANIFEST_FORMAT", "DEFAULT_ARCHS",
           "ShippedCubin", "shipped_dir", "read_manifest", "manifest_facts", "installed_nvrtc",
           "find_shipped", "shipped_state", "cubin_arch"]

SHIPPED_DIR_NAME = "cubin"
MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 1
# What a default build ships: A100, H100/H200, B200/GB200.
DEFAULT_ARCHS = ("sm_80", "sm_90", "sm_100")
# The distribution whose library cuda-bindings loads for NVRTC (the ``nvrtc`` extra).
NVRTC_DISTRIBUTION = "nvidia-cuda-nvrtc"


@dataclasses.dataclass(frozen=True)
class ShippedCubin:
    """One manifest entry: ``file`` (in the manifest's folder) holds the CUBIN of
    ``source`` for ``arch`` with key ``key``, compiled by NVRTC ``nvrtc`` ("13.5");
    ``sha256`` of its bytes."""

    source: str
    arch: str
    key: str
    nvrtc: str
    file: str
    sha256: str

    def as_json(self) -> dict[str, str]:
        return dataclasses.asdict(self)


def shipped_dir() -> Path:
    """The package's folder of shipped CUBINs (it may not exist: a build that shipped none)."""
    return package_dir() / SHIPPED_DIR_NAME


def manifest_facts(directory: Path | None = None) -> dict:
    """The manifest's own fields (format, nvrtc, commit: what the CUBINs were built from),
    without its entries; empty where there is none or it cannot be read."""
    path = (shipped_dir() if directory is None else directory) / MANIFEST_NAME
    try:
        with open(path, encoding="utf-8") as file:
            data = json.load(file)
    except (OSError, ValueError):
        return {}
    return {key: value for key, value in data.items() if key != "cubins"} \
        if isinstance(data, dict) else {}


def read_manifest(directory: Path | None = None) -> dict[tuple[str, str], ShippedCubin]:
    """``{(source, arch): entry}`` of the manifest in ``directory`` (the package's by
    default); empty where there is none or it cannot be read (nothing is then shipped)."""
    path = (shipped_dir() if directory is None else directory) / MANIFEST_NAME
    try:
        stat = path.stat()
    except OSError:
        return {}
    # Read once per version of the file: every kernel a process loads asks.
    return dict(_read_manifest(str(path), stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=8)
def _read_manifest(path: str, _mtime_ns: int, _size: int
                   ) -> tuple[tuple[tuple[str, str], ShippedCubin], ...]:
    try:
        with open(path, encoding="utf-8") as file:
            data = json.load(file)
        if data.get("format") != MANIFEST_FORMAT:
            return ()
        entries = [ShippedCubin(**entry) for entry in data["cubins"]]
    except (OSError, ValueError, KeyError, TypeError):
        return ()
    return tuple(((entry.source, entry.arch), entry) for entry in entries)


@functools.lru_cache(maxsize=1)
def installed_nvrtc() -> str | None:
    """"major.minor" of the installed NVRTC package, from its metadata (NVRTC itself is
    not loaded), or None where none is installed (a system CUDA's NVRTC is not seen here:
    the shipped CUBINs then serve)."""
    try:
        version = metadata.version(NVRTC_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None
    return ".".join(version.split(".")[:2])


def shipped_state(build: KernelBuild, directory: Path | None = None) -> str:
    """``"shipped"`` (this build's CUBIN is shipped and would serve), ``"stale"`` (one is
    shipped for the source and architecture but for other sources, headers or options, or
    IPCSHARE_KERNEL_SHIPPED=0 turns them off) or ``"missing"``.

    Raises:
        SettingError: IPCSHARE_KERNEL_SHIPPED is not 0 or 1.
    """
    from ..runtime import settings

    entry = read_manifest(directory).get((build.name, build.arch))
    if entry is None:
        return "missing"
    if not settings.kernel_shipped():
        return "stale"
    if entry.key != build.key:
        return "stale"
    return "shipped"


def find_shipped(build: KernelBuild, directory: Path | None = None) -> bytes | None:
    """The shipped CUBIN of ``build``, or None: none shipped, another key, or a file that
    does not read back as it was written."""
    directory = shipped_dir() if directory is None else directory
    if shipped_state(build, directory) != "shipped":
        return None
    entry = read_manifest(directory)[(build.name, build.arch)]
    try:
        cubin = (directory / entry.file).read_bytes()
    except OSError:
        return None
    if hashlib.sha256(cubin).hexdigest() != entry.sha256:
        return None
    return cubin


# ELF64 e_flags of a CUBIN: the SM version in its low bits (bits 0-7 up to CUDA 12's ABI;
# CUDA 13 moved it to bits 8-15 with e_ident[EI_ABIVERSION] 8 and above).
def cubin_arch(cubin: bytes) -> str:
    """``sm_XY`` that a CUBIN (ELF64, machine EM_CUDA) was built for.

    Raises:
        ValueError: not a CUBIN.
    """
    import struct

    if cubin[:4] != b"\x7fELF" or len(cubin) < 0x40:
        raise ValueError("not an ELF file")
    machine, = struct.unpack_from("<H", cubin, 0x12)
    if machine != 190:  # EM_CUDA
        raise ValueError(f"ELF machine {machine}, not CUDA (190)")
    flags, = struct.unpack_from("<I", cubin, 0x30)
    abi_version = cubin[8]
    sm = (flags >> 8) & 0xFF if abi_version >= 8 else flags & 0xFF
    return f"sm_{sm}"
