"""``ipcshare kernels``: which architectures' kernels are ready where (shipped in the
package, in the kernel cache, or missing: the first call compiles them), and
``ipcshare kernels build --arch sm_90``, which compiles them into the cache ahead of a job
(what a cluster admin runs once per image)."""

from __future__ import annotations

import argparse
import json
import sys

from .. import __version__
from ..runtime.errors import ConfigError, KernelCompileError
from ..runtime.output_files import check_writable
from .exit_codes import EXIT_ERROR, EXIT_OK

__all__ = ["add_kernels_flags", "run_kernels_command", "kernel_states", "node_archs"]


def add_kernels_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", nargs="?", choices=("status", "build"), default="status",
                        help="status (default): what is ready for which architecture | "
                             "build: compile into the kernel cache what is neither shipped "
                             "nor cached yet")
    parser.add_argument("--arch", dest="archs", action="append", metavar="sm_XY",
                        help="an architecture (repeat for more; commas work too). status: "
                             "the shipped ones and this node's by default; build: this "
                             "node's GPUs' by default")
    parser.add_argument("-j", "--jobs", type=int, metavar="N",
                        help="build: compiles side by side (default: this process's cores)")
    parser.add_argument("--json", metavar="FILE", help="status: write the table as JSON")


def node_archs() -> tuple[tuple[str, ...], str | None]:
    """(architectures of this node's GPUs, in ordinal order without repeats; why none
    where there are none)."""
    from ..backends import gpu_count

    gpus, reason = gpu_count()
    if not gpus:
        return (), reason
    from ..kernels.compiler import device_arch

    return tuple(dict.fromkeys(device_arch(ordinal) for ordinal in range(gpus))), None


def kernel_states(archs: tuple[str, ...]) -> dict[str, dict[str, str]]:
    """``{source: {arch: shipped | cached | stale | missing}}``: stale is a shipped CUBIN
    that does not serve (other sources, headers, options or NVRTC) with none cached;
    cached needs NVRTC here (its version is part of the cache's key)."""
    from ..kernels.compiler import KERNEL_SOURCES, cached_path, kernel_build, nvrtc_version
    from ..kernels.shipped import shipped_state

    try:
        version = nvrtc_version()
    except KernelCompileError:
        version = None
    states: dict[str, dict[str, str]] = {}
    for source in KERNEL_SOURCES:
        row = states[source] = {}
        for arch in archs:
            build = kernel_build(source, arch=arch)
            shipped = shipped_state(build)
            if shipped == "shipped":
                row[arch] = "shipped"
            elif version is not None and cached_path(build, version).is_file():
                row[arch] = "cached"
            else:
                row[arch] = shipped
    return states


def _archs_from(values: list[str] | None) -> tuple[str, ...]:
    from ..kernels.build import parse_archs

    return parse_archs(" ".join(values or ()))


def run_kernels_command(args: argparse.Namespace) -> int:
    """Run ``ipcshare kernels [status|build]``; returns the exit status: status exits 1
    where a kernel of this node's GPUs is missing (its first call would compile it).

    Raises:
        KernelCompileError: a malformed --arch, NVRTC missing (build), or a source that
            does not compile.
        ConfigError: build without an architecture on a node without GPUs, or --jobs
            below 1 or without build.
        ConfigError: --json cannot be written.
    """
    asked = _archs_from(args.archs)
    here, no_gpu = node_archs()
    if args.action == "build":
        return _build(asked or here, no_gpu, args.jobs)
    if args.jobs is not None:
        raise ConfigError("--jobs is for `ipcshare kernels build`")
    if args.json:
        check_writable(args.json)
    from ..kernels.shipped import DEFAULT_ARCHS, installed_nvrtc, read_manifest, shipped_dir

    shipped_archs = tuple(dict.fromkeys(arch for _, arch in read_manifest()))
    archs = asked or tuple(dict.fromkeys((*DEFAULT_ARCHS, *shipped_archs, *here)))
    states = kernel_states(archs)
    _print_table(states, archs, here, no_gpu, installed_nvrtc(), shipped_dir())
    missing = sorted({source for source, row in states.items() for arch in here
                      if row.get(arch) in ("missing", "stale")})
    if args.json:
        from ..kernels.compiler import cache_dir

        with open(args.json, "w", encoding="utf-8") as out:
            json.dump({"ipcshare": __version__, "shipped_dir": str(shipped_dir()),
                       "cache_dir": str(cache_dir()), "node_archs": list(here),
                       "installed_nvrtc": installed_nvrtc(), "states": states}, out, indent=1)
    if missing:
        sys.stderr.write(f"ipcshare kernels: {len(missing)} of this node's kernels would "
                         f"compile on their first call; ipcshare kernels build "
                         f"{' '.join('--arch ' + arch for arch in here)} compiles them now\n")
        return EXIT_ERROR
    return EXIT_OK


def _print_table(states: dict[str, dict[str, str]], archs: tuple[str, ...],
                 here: tuple[str, ...], no_gpu: str | None, nvrtc: str | None,
                 shipped: object) -> None:
    from ..kernels.compiler import cache_dir

    print(f"ipcshare {__version__} kernels: shipped in {shipped}, cache {cache_dir()}")
    print(f"NVRTC package: {nvrtc or 'none installed (only shipped kernels load)'}; "
          f"this node: {', '.join(here) if here else f'no GPU ({no_gpu})'}")
    width = max(len(source) for source in states)
    heads = [arch + ("*" if arch in here else "") for arch in archs]
    print(f"{'source':<{width}}  " + "  ".join(f"{head:<8}" for head in heads).rstrip())
    for source, row in states.items():
        print(f"{source:<{width}}  " + "  ".join(f"{row[arch]:<8}" for arch in archs).rstrip())
    if here:
        print("* this node's GPU architecture")


def _build(archs: tuple[str, ...], no_gpu: str | None, jobs: int | None) -> int:
    from ..kernels.build import build_cache

    if not archs:
        raise ConfigError(f"no GPU here ({no_gpu}): name the architectures to build, "
                          "e.g. --arch sm_90")
    if jobs is not None and jobs < 1:
        raise ConfigError(f"--jobs {jobs}: must be at least 1")

    def progress(line: str) -> None:
        print(line, flush=True)
    build_cache(archs, jobs=jobs, progress=progress)
    return EXIT_OK
