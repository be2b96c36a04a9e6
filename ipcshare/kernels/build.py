"""Build ipcshare's kernels ahead of their first call: into the package (the shipped
CUBINs, from setup.py when the package is built or installed) or into the kernel cache
(``ipcshare kernels build``, what a cluster admin runs once per image).

Every (source, architecture) is one NVRTC compile; a process pool runs them side by side,
heaviest first, so a build takes about the sum of the compiles over the cores.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from ..runtime.errors import KernelCompileError
from .compiler import (
    KERNEL_SOURCES,
    compile_kernel_source,
    compile_uncached,
    kernel_build,
    nvrtc_version,
)
from .shipped import MANIFEST_FORMAT, MANIFEST_NAME, ShippedCubin, find_shipped, read_manifest

__all__ = ["archs_to_ship", "parse_archs", "build_shipped", "build_cache",
           "default_jobs"]


Progress = Callable[[str], None]


def parse_archs(text: str) -> tuple[str, ...]:
    """``"sm_80, sm_90"`` -> ``("sm_80", "sm_90")``; ``"none"`` -> ``()``.

    Raises:
        KernelCompileError: an entry not of the form sm_90 / sm_90a.
    """
    archs = tuple(dict.fromkeys(part for part in text.replace(",", " ").split() if part))
    if archs == ("none",):
        return ()
    for arch in archs:
        kernel_build("empty.cu", arch=arch)  # refuses a malformed architecture
    return archs


def archs_to_ship() -> tuple[str, ...]:
    """``$IPCSHARE_KERNEL_ARCHS`` where set, else shipped.DEFAULT_ARCHS.

    Raises:
        KernelCompileError: a malformed architecture in the variable.
    """
    from ..runtime import settings
    from .shipped import DEFAULT_ARCHS

    configured = settings.kernel_archs()
    return parse_archs(configured) if configured else DEFAULT_ARCHS


def default_jobs() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _compile_for_shipping(source: str, arch: str) -> tuple[str, str, bytes, float]:
    started = time.perf_counter()
    cubin = compile_uncached(kernel_build(source, arch=arch))
    return source, arch, cubin, time.perf_counter() - started


def _compile_into_cache(source: str, arch: str) -> tuple[str, str, bytes, float]:
    started = time.perf_counter()
    cubin = compile_kernel_source(source, arch=arch)
    return source, arch, cubin, time.perf_counter() - started


def _run_pool(work: Sequence[tuple[str, str]], task: Callable, jobs: int
              ) -> Iterable[tuple[str, str, bytes, float]]:
    """``task(source, arch)`` for each of ``work`` on ``jobs`` processes, as they finish."""
    if not work:
        return
    if jobs <= 1 or len(work) == 1:
        for source, arch in work:
            yield task(source, arch)
        return
    # fork: the workers need nothing but this module, whichever way the parent found it
    # (setup.py imports it from the source tree).
    context = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    with concurrent.futures.ProcessPoolExecutor(min(jobs, len(work)),
                                                mp_context=context) as pool:
        futures = [pool.submit(task, source, arch) for source, arch in work]
        try:
            for future in concurrent.futures.as_completed(futures):
                yield future.result()
        except BaseException:
            for future in futures:
                future.cancel()
            raise


def _ordered(sources: Iterable[str], archs: Iterable[str]) -> list[tuple[str, str]]:
    # COLLECTIVE_UNITS lists the units heaviest first (3-25 s each) and the other sources
    # take a second or two: by source, then arch, the pool starts the long compiles first
    # and ends on short ones.
    from .compiler import COLLECTIVE_UNITS

    archs = tuple(archs)
    rank = {unit: index for index, unit in enumerate(COLLECTIVE_UNITS)}
    ordered = sorted(sources, key=lambda source: rank.get(source, len(rank)))
    return [(source, arch) for source in ordered for arch in archs]


def build_shipped(directory: Path, archs: Sequence[str], *, reuse: Sequence[Path] = (),
                  jobs: int | None = None, progress: Progress | None = None,
                  commit: str | None = None) -> list[ShippedCubin]:
    """Write the CUBINs of every kernel source for ``archs`` and their manifest (with
    ``commit``, what the sources were checked out at, where known) into ``directory``; a
    CUBIN already in ``directory`` or a ``reuse`` folder under the same key (source,
    headers, options, NVRTC version) is copied, not compiled again. A CUBIN that the
    folder's previous manifest listed and this build does not is removed (an earlier
    build wrote it); a file no manifest of ours names is left alone.

    Raises:
        KernelCompileError: NVRTC missing, or a source does not compile.
    """
    progress = progress or _stderr
    jobs = jobs or default_jobs()
    major, minor = nvrtc_version()
    nvrtc = f"{major}.{minor}"
    directory.mkdir(parents=True, exist_ok=True)
    # What an earlier build wrote here (setuptools also copies the tree's folder, with
    # its manifest, into a build folder): the only files this build may remove.
    earlier = {entry.file for entry in read_manifest(directory).values()}
    entries: dict[tuple[str, str], ShippedCubin] = {}
    todo: list[tuple[str, str]] = []
    for source, arch in _ordered(KERNEL_SOURCES, archs):
        build = kernel_build(source, arch=arch)
        found = None
        for folder in (directory, *reuse):
            entry = read_manifest(folder).get((source, arch))
            if entry is not None and entry.nvrtc == nvrtc and entry.key == build.key:
                found = find_shipped(build, folder)  # checks the bytes too
                if found is not None:
                    break
        if found is None:
            todo.append((source, arch))
        else:
            entries[(source, arch)] = _write(directory, build.name, arch, build.key, nvrtc,
                                             found)
    kept = len(entries)
    if kept:
        progress(f"ipcshare kernels: {kept} CUBINs unchanged since the last build")
    started = time.perf_counter()
    for done, (source, arch, cubin, seconds) in enumerate(
            _run_pool(todo, _compile_for_shipping, jobs), 1):
        build = kernel_build(source, arch=arch)
        entries[(source, arch)] = _write(directory, source, arch, build.key, nvrtc, cubin)
        progress(f"ipcshare kernels: [{done}/{len(todo)}] {source} {arch} "
                 f"{len(cubin) / 1e6:.1f} MB in {seconds:.1f} s")
    ordered = [entries[item] for item in _ordered(KERNEL_SOURCES, archs)]
    manifest = {"format": MANIFEST_FORMAT, "nvrtc": nvrtc, "commit": commit,
                "cubins": [entry.as_json() for entry in ordered]}
    _replace(directory / MANIFEST_NAME, json.dumps(manifest, indent=1).encode() + b"\n")
    # CUBINs an earlier build shipped and this one does not (an architecture dropped):
    # named by that build's manifest, so provably ours.
    wanted = {entry.file for entry in ordered}
    for name in sorted(earlier - wanted):
        if Path(name).name != name or not name.endswith(".cubin"):
            continue   # a manifest entry is a file name in this folder, nothing else
        try:
            (directory / name).unlink()
        except OSError:
            pass
    if todo:
        progress(f"ipcshare kernels: {len(todo)} compiled in "
                 f"{time.perf_counter() - started:.0f} s on {min(jobs, len(todo))} processes")
    return ordered


def build_cache(archs: Sequence[str], *, sources: Sequence[str] | None = None,
                jobs: int | None = None, progress: Progress | None = None
                ) -> list[tuple[str, str, str]]:
    """Compile ``sources`` (every kernel source by default) for ``archs`` into the kernel
    cache, skipping what is shipped or cached already; ``[(source, arch, where)]`` with
    where ``shipped``, ``cached`` or ``compiled``.

    Raises:
        KernelCompileError: NVRTC missing, or a source does not compile.
    """
    from .compiler import cached_path
    from .shipped import shipped_state

    progress = progress or _stderr
    jobs = jobs or default_jobs()
    version = nvrtc_version()
    done: list[tuple[str, str, str]] = []
    todo: list[tuple[str, str]] = []
    for source, arch in _ordered(sources or KERNEL_SOURCES, archs):
        build = kernel_build(source, arch=arch)
        if shipped_state(build) == "shipped":
            done.append((source, arch, "shipped"))
        elif cached_path(build, version).is_file():
            done.append((source, arch, "cached"))
        else:
            todo.append((source, arch))
    for source, arch, where in done:
        progress(f"ipcshare kernels: {source} {arch} {where} already")
    for count, (source, arch, _cubin, seconds) in enumerate(
            _run_pool(todo, _compile_into_cache, jobs), 1):
        done.append((source, arch, "compiled"))
        progress(f"ipcshare kernels: [{count}/{len(todo)}] {source} {arch} compiled in "
                 f"{seconds:.1f} s")
    return done


def _write(directory: Path, source: str, arch: str, key: str, nvrtc: str,
           cubin: bytes) -> ShippedCubin:
    file = f"{Path(source).stem}-{arch}.cubin"
    path = directory / file
    try:
        same = path.read_bytes() == cubin
    except OSError:
        same = False
    if not same:
        _replace(path, cubin)
    return ShippedCubin(source, arch, key, nvrtc, file, hashlib.sha256(cubin).hexdigest())


def _replace(path: Path, data: bytes) -> None:
    # Write then rename: a reader never sees half a file.
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as exc:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise KernelCompileError(f"cannot write {path}: {exc.strerror}") from None


def _stderr(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
