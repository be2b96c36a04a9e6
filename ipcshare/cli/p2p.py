"""``ipcshare p2p``: P2P direct (one process, every GPU, peer pointers and cuMemcpyPeerAsync)
against IPC windows (one process per GPU) on the same sizes; its flags and exit policy
(0 verified, 3 a mismatch, 1 an error or a failed IPC half)."""

from __future__ import annotations

import argparse
import json
import shlex
import sys

from .size_flags import add_size_flags

__all__ = ["add_p2p_flags", "run_p2p_command"]

def add_p2p_flags(parser: argparse.ArgumentParser) -> None:
    """The p2p flags, on its subparser."""
    add_size_flags(parser, smallest="1M", largest="1M", factor=2)
    add = parser.add_argument
    add("-n", "--iters", dest="iters", type=int, default=20, metavar="N",
        help="timed iterations (default 20)")
    add("-w", "--warmup_iters", dest="warmup", type=int, default=5, metavar="N",
        help="untimed warm-up iterations (default 5)")
    add("-c", "--check", dest="checks", type=int, default=1, metavar="N",
        help="verified iterations per size (default 1)")
    add("--op", choices=("ring", "allgather", "both"), default="both",
        help="which op (default both)")
    add("--mode", choices=("kernel", "copy", "both"), default="both",
        help="kernel: stores through peer pointers; copy: cuMemcpyPeerAsync (default both)")
    add("--peer-access", dest="peer_access", choices=("on", "off"), default="on",
        help="off: never enable peer access, so peer copies go host-staged (default on)")
    add("--no-ipc", dest="ipc", action="store_false",
        help="skip the IPC half (one process per GPU under mpiexec)")
    add("--mpiexec", metavar="COMMAND",
        help="how to start the IPC half, e.g. 'mpiexec --bind-to none' (default: the "
             "mpiexec next to this Python, else on PATH)")
    add("--json", metavar="FILE", help="write the results as JSON")


def run_p2p_command(args: argparse.Namespace) -> int:
    """Run ``ipcshare p2p``; returns the exit status.

    Raises:
        IpcShareError: no GPUs, started under a launcher, bad sizes, an unwritable
            --json, or a driver failure; main() prints it as one line.
    """
    from ..p2p.ipc_half import default_mpiexec
    from ..p2p.runner import P2pOptions, run_p2p
    from ..runtime.config import PatternOptions, parse_size
    from ..runtime.errors import BackendUnavailable, ConfigError
    from ..runtime.output_files import check_writable
    from ..topology.world import launcher_world_size
    from .exit_codes import EXIT_ERROR, EXIT_MEASUREMENT, EXIT_OK, EXIT_WRONG
    from .option_origins import OptionOrigins

    launched = launcher_world_size()
    if launched is not None:
        name, ranks = launched
        raise ConfigError("p2p runs as one process over every GPU and starts the IPC half "
                          f"itself: run it without mpiexec / srun ({name}={ranks})")
    sweep_fields = ("min_bytes", "max_bytes", "step_factor", "iters", "warmup", "checks")
    with OptionOrigins.of(args, sweep_fields).naming_options():
        sweep = PatternOptions(min_bytes=parse_size(args.min_bytes, what="min_bytes"),
                               max_bytes=parse_size(args.max_bytes, what="max_bytes"),
                               step_factor=args.step_factor, iters=args.iters,
                               warmup=args.warmup, checks=args.checks)
    check_writable(args.json)
    mpiexec = None
    if args.ipc:
        mpiexec = tuple(shlex.split(args.mpiexec)) if args.mpiexec else None
        if mpiexec is None:
            found = default_mpiexec()
            if found is None:
                raise ConfigError("no mpiexec found for the IPC half: pass --mpiexec COMMAND, "
                                  "or --no-ipc")
            mpiexec = (found,)
    options = P2pOptions(
        sweep=sweep, ops=("ring", "allgather") if args.op == "both" else (args.op,),
        modes=("kernel", "copy") if args.mode == "both" else (args.mode,),
        peer_access=args.peer_access == "on", mpiexec=mpiexec)
    try:
        document = run_p2p(options, emit=lambda line: print(line, flush=True))
    except BackendUnavailable as exc:
        raise BackendUnavailable(
            f"p2p needs 2 or more GPUs visible to this one process, but {exc}; run it on a "
            "node with several GPUs (and no CUDA_VISIBLE_DEVICES narrowing it to one)") from None
    if args.json:
        try:
            with open(args.json, "w") as out:
                json.dump(document, out, indent=1)
                out.write("\n")
        except OSError as exc:
            raise ConfigError(f"cannot write {args.json!r}: {exc.strerror or exc}") from None
    if document["wrong_total"]:
        return EXIT_WRONG
    if document["measurement_errors"]:
        sys.stderr.write(f"ipcshare: error: {len(document['measurement_errors'])} measurement "
                         f"error(s), figures that are not results; the first: "
                         f"{document['measurement_errors'][0]}\n")
        return EXIT_MEASUREMENT
    failed = any((entry["ipc"] or {}).get("error") for entry in document["ops"].values())
    return EXIT_ERROR if failed else EXIT_OK
