"""Argument parsing and the error policy: one clear line per rank, no traceback, and a
non-zero exit status that says what went wrong."""

from __future__ import annotations

import argparse
import re
import sys
import threading
from collections.abc import Sequence
from typing import Any

from .. import __version__
from ..runtime import settings
from .exit_codes import EXIT_ERROR, EXIT_OK, EXIT_READER_GONE, EXIT_SLOW, EXIT_USAGE, EXIT_WRONG
from .option_origins import as_flags, flag_names
from .result_file import add_result_flag
from .same_command import PATTERN_COMMANDS, CommandLineError

__all__ = ["main", "build_parser", "EXIT_OK", "EXIT_ERROR", "EXIT_USAGE", "EXIT_WRONG",
           "EXIT_SLOW"]



class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line, not usage text plus an error, and is
    raised (main() prints it once the other ranks know, so none waits for this one)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # A dash and a digit is a value, as Python 3.13's argparse reads it: older ones
        # took `-b -4K` for a flag, and said "expected one argument" instead of the size
        # rule's "must be at least 1 byte".
        self._negative_number_matcher = re.compile(r"^-\.?\d")

    def error(self, message: str) -> None:  # type: ignore[override]
        raise CommandLineError(self.prog, message)

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            # argparse refuses them at the top, pointing at `ipcshare --help`: the help
            # that lists what the command takes is the command's.
            command = getattr(parsed, "command", None)
            prog = f"{self.prog} {command}" if command else self.prog
            raise CommandLineError(prog, f"unrecognized arguments: {' '.join(extras)}")
        # The command as typed, for result documents (main() or a caller may pass the
        # arguments, so sys.argv need not be them).
        parsed.typed = [self.prog, *(sys.argv[1:] if args is None else args)]
        return parsed


INTER_HELP = ("auto | nccl | mpi: what carries the hierarchical collectives between nodes "
              "(nccl: NCCL through nccl4py, GPU backends; auto: nccl where importable on a "
              "GPU backend, else mpi)")


def _add_pattern_flags(parser: argparse.ArgumentParser) -> None:
    # Defaults are None so that a YAML config can fill what the command line leaves out.
    add = parser.add_argument
    add("--backend", help="auto | host | cuda-ipc | cuda-vmm (default auto)")
    add("--exchange", help="auto | mpi | socket | pidfd (default auto)")
    add("--handle", help="cuda-vmm handle type: posix-fd | fabric (default posix-fd)")
    add("-b", "--minbytes", dest="min_bytes", metavar="SIZE",
        help="smallest size, with K/M/G suffixes (default 1M)")
    add("-e", "--maxbytes", dest="max_bytes", metavar="SIZE",
        help="largest size (default 1M)")
    add("-f", "--stepfactor", dest="step_factor", type=int, metavar="F",
        help="multiply the size by F between rows (default 2)")
    add("-n", "--iters", dest="iters", type=int, metavar="N", help="timed iterations (default 20)")
    add("-w", "--warmup_iters", dest="warmup", type=int, metavar="N",
        help="untimed warm-up iterations (default 5)")
    add("-c", "--check", dest="checks", type=int, metavar="N",
        help="verified iterations per size, 0 to skip checks (default 1)")
    add("-d", "--datatype", dest="datatype", help="element type (default float32)")
    add("--baseline", help="none | mpi | nccl (NCCL called directly through nccl4py, plain "
                           "and symmetric buffers) | torch (NCCL through torch.distributed) | "
                           "torch-symm (PyTorch symmetric memory all-reduce): time the baseline "
                           "on the same sizes")
    add("--algo", help="auto | copy-engine | hierarchical (IPC in nodes, MPI between) | "
                       "push | pull | ring (all-gather kernels, GPU only) | leader (one "
                       "kernel per GPU, for ranks sharing GPUs) | one-shot | two-shot "
                       "(all-reduce) | ll (low-latency all-gather / all-reduce, GPU only) | "
                       "ll-two-shot (low-latency two-shot all-reduce, GPU only) | stepped "
                       "(collectives whose kernels never spin, for ranks sharing GPUs; GPU "
                       "only)")
    add("--inter", help=INTER_HELP)
    add("--graph", action="store_true", default=None, help="CUDA-graph timing mode")
    add("--timing", help="nccl-tests (back-to-back operations, averaged; default) | latency "
                         "(one operation per sample: p50 with p5 / p95, for ours and the "
                         "baseline; with --graph each sample replays a one-operation graph)")
    add("--after-kernel", dest="after_kernel", action="store_true", default=None,
        help="launch an empty kernel on the stream before every operation, ours and the "
             "GPU baseline's, as when a collective follows the compute that produced its "
             "input (GPU backends)")
    add("--min-bw", dest="min_bw", type=float, metavar="GBPS",
        help="exit with status 4 when average busbw is below GBPS")
    add("--config", metavar="FILE.yaml", help="YAML config; flags override it")
    add("--json", metavar="FILE", help="write the results as JSON (rank 0)")
    add_result_flag(parser)
    add("--plot", metavar="FILE.png", help="draw busbw and time against size, ours and the "
        "baseline's: .png, .svg or .pdf (rank 0; needs matplotlib)")


def build_parser() -> argparse.ArgumentParser:
    """The ``ipcshare`` parser (no MPI, no CUDA: ``--help`` works anywhere)."""
    parser = _Parser(prog="ipcshare",
                     description="Share GPU or host memory between MPI ranks; verify and time it.")
    parser.add_argument("--version", action="version", version=f"ipcshare {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    info = commands.add_parser("info", help="what each rank sees: host, MPI, backends, devices")
    info.add_argument("--json", metavar="FILE", help="write the facts as JSON (rank 0)")
    info.add_argument("--inter", default="auto", help=INTER_HELP + "; info says which one "
                      "a run would use")
    for name, text in (("ring", "each rank writes into the next rank's window, n-1 steps"),
                       ("allgather", "every rank gathers every rank's block, single copy")):
        _add_pattern_flags(commands.add_parser(name, help=text))
        commands.choices[name].set_defaults(op=None, register=None)
    for name, text in (("allreduce", "every rank's array reduced into every rank's (library "
                                     "Communicator.all_reduce)"),
                       ("reducescatter", "every rank gets its block of the reduction (library "
                                         "Communicator.reduce_scatter)")):
        command = commands.add_parser(name, help=text)
        _add_pattern_flags(command)
        command.add_argument("-o", "--op", dest="op", choices=("sum", "max", "min"),
                             help="reduction (default sum)")
        _add_register_flag(command)
    alltoall = commands.add_parser(
        "alltoall", help="block r of every rank's input to rank r (library "
                         "Communicator.all_to_all / all_to_all_v; host memory for now)")
    _add_pattern_flags(alltoall)
    alltoall.add_argument("--splits", dest="splits",
                          help="even (all_to_all: equal blocks) | random | skewed (most "
                               "elements to one rank): how each rank's input is split "
                               "between the ranks; random and skewed run all_to_all_v on "
                               "seeded splits, zero-size ones among them (default even)")
    _add_register_flag(alltoall)
    alltoall.set_defaults(op=None)
    from .bench import add_bench_flags

    add_bench_flags(commands.add_parser(
        "bench", help="run a YAML suite of cases against MPI / NCCL: tables, JSON, plot, report"))
    from .doctor import add_doctor_flags

    add_doctor_flags(commands.add_parser(
        "doctor", help="validate sharing on every node: capability matrix, limits, causes, fixes"))
    from .p2p import add_p2p_flags

    add_p2p_flags(commands.add_parser(
        "p2p", help="one process over every GPU: peer access, ring and all-gather by peer "
                    "pointers and cuMemcpyPeerAsync, against IPC windows"))
    from .kernels import add_kernels_flags

    add_kernels_flags(commands.add_parser(
        "kernels", help="which architectures' kernels are ready (shipped, cached, missing); "
                        "kernels build --arch sm_90: compile them into the cache ahead of a job"))
    from .vs_torch import add_vs_torch_flags

    add_vs_torch_flags(commands.add_parser(
        "vs-torch", help="what a PyTorch user sees: ipcshare's all-reduce, all-gather, "
                         "reduce-scatter and all-to-all against NCCL through torch.distributed "
                         "on the same CUDA tensors, checked and timed (needs torch and a GPU "
                         "per rank)"))
    for name in (*PATTERN_COMMANDS, "p2p", "vs-torch"):
        # Errors about a value name the flag the user typed (cli.option_origins).
        command = commands.choices[name]
        command.set_defaults(option_flags=flag_names(command))
    return parser


def _add_register_flag(command) -> None:
    command.add_argument("-R", "--register", dest="register", type=int, choices=(0, 1),
                         help="1: register the arrays with the communicator "
                              "(Communicator.register), so calls read them in place "
                              "instead of copying them in (default 0)")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ipcshare`` command; returns the exit status (``EXIT_READER_GONE``
    where the command went well but the reader of its output left: cli/reader_gone.py)."""
    from ..topology.world import launcher_world_size
    from .reader_gone import StdoutGuard

    guard = StdoutGuard.install(alone=launcher_world_size() is None)
    try:
        status = _run_command(argv)
    finally:
        guard.uninstall()
    if guard.reader_gone and status == EXIT_OK:
        status = EXIT_READER_GONE
    _finish_mpi(status)
    return status


# How long MPI_Finalize may take once this rank is done: every rank arrives within
# moments of the others after the command's last collective step, unless a peer left
# without it (its job failed there), which MPICH's finalize would wait for for ever.
FINALIZE_BOUND_S = 30.0


def _finish_mpi(status: int) -> None:
    """Finalize MPI here, bounded, or leave without it (status ``status`` either way).

    A process that gave up on an MPI request leaves without MPI_Finalize: a request that
    never completed would be completed into freed memory, or waited for
    (runtime/abandoned_requests.py), and its peers may have left without it. So does one
    that gave up on a stopped or dead peer (which could not answer MPI_Finalize). It first
    waits until the other ranks have spoken, at most as long as a peer waiting in a
    collective may still take to time out and say so (the exchange timeout, plus a
    margin): hydra ends the whole job when the first process leaves without MPI_Finalize,
    cutting off the peers' lines (seen at a 1 ms exchange timeout). Any other process
    finalizes now, under a watchdog that ends it with ``status`` after
    ``FINALIZE_BOUND_S``, should a peer that left without finalizing hold it there.
    """
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return
    from ..liveness.exit_policy import (
        leave_after_peer_death,
        leaving_without_finalize,
        stopped_peers_to_wake,
    )
    from ..runtime.abandoned_requests import abandoned
    from ..runtime.errors import SettingError

    if abandoned() or leaving_without_finalize():
        try:
            linger = settings.exchange_timeout()
        except SettingError:  # the command refused it already; not a traceback now
            linger = settings.DEFAULT_EXCHANGE_TIMEOUT_S
        # A stopped peer without a guard (stopped before it armed one) is continued on
        # the way out: nobody else would end it, and the launcher would wait for it.
        leave_after_peer_death(status, linger=linger + 0.5, wake=stopped_peers_to_wake())
    watchdog = threading.Timer(FINALIZE_BOUND_S,
                               lambda: leave_after_peer_death(status, linger=0))
    watchdog.daemon = True
    watchdog.start()
    try:
        mpi.Finalize()
    finally:
        watchdog.cancel()


def _run_command(argv: Sequence[str] | None) -> int:
    from ..runtime.errors import IpcShareError, PeerDied
    from ..topology.world import launcher_world_size

    asked_for, done = None, 0  # --help or --version: argparse printed it, would leave
    try:
        args, usage_error = build_parser().parse_args(argv), None
    except CommandLineError as exc:
        args, usage_error = None, exc
    except SystemExit as exc:
        if launcher_world_size() is None:
            raise
        line = list(sys.argv[1:] if argv is None else argv)
        asked_for = "--version" if "--version" in line else "--help"
        args, usage_error, done = None, None, exc.code
    try:
        # p2p is one process that starts its own jobs: under a launcher it refuses by
        # itself, without MPI.
        if launcher_world_size() is not None and (args is None or args.command != "p2p"):
            # Every command starts with a collective of its own: a rank stopped by its
            # command line (or done after printing its help), or running another
            # command, would leave the others waiting in theirs for ever. So all ranks
            # first learn how every rank's line went.
            from .same_command import agree_on_command

            agree_on_command(asked_for if args is None else args.command, usage_error)
            if asked_for is not None:  # every rank asked for it: each printed it
                return int(done or 0)
        elif usage_error is not None:
            raise usage_error
        if args.command is None:
            build_parser().print_help()
            return EXIT_USAGE
        if args.command == "info":
            from .info import run_info

            return run_info(args)
        if args.command == "bench":
            from .bench import run_bench_command

            return run_bench_command(args)
        if args.command == "doctor":
            from .doctor import run_doctor_command

            return run_doctor_command(args)
        if args.command == "p2p":
            from .p2p import run_p2p_command

            return run_p2p_command(args)
        if args.command == "kernels":
            from .kernels import run_kernels_command

            return run_kernels_command(args)
        if args.command == "vs-torch":
            from .vs_torch import run_vs_torch_command

            return run_vs_torch_command(args)
        from .run_pattern import run_pattern_command

        return run_pattern_command(args)
    except PeerDied as exc:
        # Every survivor found out by itself and cleaned up on the way here.
        from ..liveness.exit_policy import (
            DEFAULT_EXIT_GRACE_S,
            leave_after_peer_death,
            peer_exit_grace,
        )

        if settings.debug():
            import traceback

            traceback.print_exc()
        sys.stderr.write(f"ipcshare: error: {exc}\n")
        try:
            grace = peer_exit_grace()
        except IpcShareError:
            # The pattern commands refused a bad value at their start; the others read it
            # only here, on the way out after a death: the default then, not a traceback.
            grace = DEFAULT_EXIT_GRACE_S
        leave_after_peer_death(EXIT_ERROR, linger=grace + 0.5)
    except CommandLineError as exc:
        sys.stderr.write(exc.line + "\n")
        return EXIT_USAGE
    except IpcShareError as exc:
        # Raised collectively: every rank gets here with the same story, nobody waits.
        # The library's words, in the flags of the command the user typed.
        if settings.debug():
            import traceback

            traceback.print_exc()
        text = as_flags(str(exc), getattr(args, "option_flags", {}))
        sys.stderr.write(f"ipcshare: error: {text}\n")
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # A process alone in its world whose reader left (``ipcshare info | head -1``):
        # StdoutGuard raised this after pointing stdout at /dev/null, and the with-blocks
        # on the way here closed what the command opened. Not an internal error.
        return EXIT_READER_GONE
    except Exception as exc:
        _abort_job(exc)
        return EXIT_ERROR


def _abort_job(exc: BaseException) -> None:
    """An unexpected error on one rank: say so, then abort the job so nobody waits."""
    if settings.debug():
        import traceback

        traceback.print_exc()
    rank = "?"
    try:
        from mpi4py import MPI

        rank = str(MPI.COMM_WORLD.Get_rank())
        sys.stderr.write(f"ipcshare: internal error on rank {rank}: {type(exc).__name__}: {exc}"
                         " (IPCSHARE_DEBUG=1 shows the traceback)\n")
        sys.stderr.flush()
        if MPI.Is_initialized() and not MPI.Is_finalized() and MPI.COMM_WORLD.Get_size() > 1:
            MPI.COMM_WORLD.Abort(EXIT_ERROR)
    except ImportError:
        sys.stderr.write(f"ipcshare: internal error: {type(exc).__name__}: {exc}\n")
