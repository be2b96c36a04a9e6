"""``ipcshare ring`` and ``ipcshare allgather``."""

from __future__ import annotations

import argparse
import json
import sys

from ..config import PatternOptions, load_yaml_config, merge_options
from ..consensus import collective_step
from ..topology import World

__all__ = ["run_pattern_command", "resolve_options"]

_OPTION_KEYS = ("backend", "exchange", "handle", "min_bytes", "max_bytes", "step_factor",
                "iters", "warmup", "checks", "datatype", "baseline", "graph", "after_kernel",
                "json", "min_bw", "algo")


def resolve_options(args: argparse.Namespace) -> PatternOptions:
    """Defaults, then the YAML config, then the flags given on the command line."""
    from_file = load_yaml_config(args.config) if args.config else {}
    from_flags = {key: getattr(args, key) for key in _OPTION_KEYS}
    return merge_options(from_file, from_flags)


def run_pattern_command(args: argparse.Namespace) -> int:
    from ..patterns import make_pattern
    from ..patterns.driver import run_pattern
    from ..peer_watch import peer_exit_grace
    from ..window import Group
    from .main import EXIT_OK, EXIT_SLOW, EXIT_WRONG

    world = World.from_comm()
    try:
        with collective_step(world, "reading options"):
            options = resolve_options(args)
            pattern = make_pattern(args.command, options.algo)
    finally:
        world.close()
    with Group(options.backend, options.exchange, handle=options.handle) as group:
        # A rank stuck in a blocking MPI collective (the driver's timing reductions) when
        # a peer dies cannot notice it: the watch ends it after this grace.
        group.watch.exit_if_stuck(grace=peer_exit_grace())
        with collective_step(group.world, "choosing the algorithm"):
            if options.algo in ("push", "pull", "ring") and group.backend_name == "host":
                from ..errors import ConfigError

                raise ConfigError(f"--algo {options.algo} runs GPU kernels: it needs a GPU "
                                  "backend (cuda-ipc or cuda-vmm), not host")
        baseline = _make_baseline(options.baseline, group, pattern.name)
        try:
            result = run_pattern(group, pattern, options, baseline=baseline,
                                 emit=lambda line: print(line, flush=True),
                                 graph=bool(options.graph),
                                 after_kernel=bool(options.after_kernel))
        finally:
            if baseline is not None and hasattr(baseline, "close"):
                baseline.close()
        if options.json:
            with collective_step(group.world, f"writing {options.json}"):
                if group.rank == 0:
                    _write_json(options.json, result.to_dict())
    if result.wrong_total:
        sys.stderr.write(f"ipcshare: error: {result.wrong_total} wrong elements\n")
        return EXIT_WRONG
    if options.min_bw is not None and result.avg_busbw < options.min_bw:
        sys.stderr.write(f"ipcshare: error: average busbw {result.avg_busbw:.2f} GB/s is below "
                         f"--min-bw {options.min_bw:g}\n")
        return EXIT_SLOW
    return EXIT_OK


def _make_baseline(name: str, group, op: str):
    if name == "none":
        return None
    if name == "mpi":
        from ..patterns.baseline_mpi import MpiBaseline

        return MpiBaseline(group.world, op)
    from ..errors import ConfigError

    if group.backend_name == "host":
        raise ConfigError(f"baseline {name!r} needs a GPU backend and torch; use --baseline mpi")
    from ..patterns.baseline_nccl import NcclBaseline

    return NcclBaseline(group.world, op, group.backend.device)


def _write_json(path: str, document: dict) -> None:
    from ..errors import ConfigError

    try:
        with open(path, "w") as out:
            json.dump(document, out, indent=1)
            out.write("\n")
    except OSError as exc:
        raise ConfigError(f"cannot write {path!r}: {exc.strerror}") from None
