"""``ipcshare ring``, ``allgather``, ``allreduce``, ``reducescatter`` and ``alltoall``."""

from __future__ import annotations

import argparse
import json
import sys

from ..backends import check_handle
from ..liveness.consensus import collective_step
from ..liveness.deadline_waits import first_meeting_patience, watched_allgather
from ..liveness.pidfd_watch import PeerWatch
from ..runtime.config import PatternOptions, format_size, merge_options
from ..runtime.errors import ConfigError, OptionError, WindowTooLarge
from ..runtime.output_files import check_writable
from ..topology.world import World, describe_disagreement
from .option_origins import OptionOrigins
from .pattern_plot import check_plot, write_run_plot

__all__ = ["run_pattern_command", "resolve_options", "check_same_run"]

_OPTION_KEYS = ("backend", "exchange", "handle", "min_bytes", "max_bytes", "step_factor",
                "iters", "warmup", "checks", "datatype", "baseline", "graph", "after_kernel",
                "json", "min_bw", "algo", "inter", "op", "timing", "register", "splits")


def resolve_options(args: argparse.Namespace,
                    origins: OptionOrigins | None = None) -> PatternOptions:
    """Defaults, then the YAML config, then the flags given on the command line
    (``origins``: those of ``args``, read here when not given).

    Raises:
        ConfigError: a bad config file or value, naming the option as the user gave it
            (the flag typed, or the config's key and file).
    """
    origins = origins or OptionOrigins.of(args, _OPTION_KEYS)
    with origins.naming_options():
        try:
            return merge_options(origins.from_file, origins.from_flags)
        except OptionError:
            raise
        except ConfigError as exc:  # the flags' keys are known: an unknown one is the file's
            raise ConfigError(f"config file {origins.config_path!r}: {exc}") from None


def _run_facts(args: argparse.Namespace, options: PatternOptions) -> list[tuple[str, object, str]]:
    """What every rank must run alike: ``(topic, value compared, the user's spelling)``.
    Sizes are compared as the sweep they make, so ``-b 1024K`` and ``-b 1M`` agree."""
    def given(flag: str, key: str, default: str) -> str:
        text = getattr(args, key, None)
        return f"{flag} {default if text is None else str(text).strip()}"

    def switch(flag: str, on: bool) -> str:
        return flag if on else f"no {flag}"

    sizes = options.sizes()
    sweep = " ".join([given("-b", "min_bytes", format_size(options.min_bytes)),
                      given("-e", "max_bytes", format_size(options.max_bytes))]
                     + ([given("-f", "step_factor", str(options.step_factor))]
                        if len(sizes) > 1 else []))
    return [
        ("the operation", args.command, args.command),
        ("the sizes to run", tuple(sizes), sweep),
        ("the iterations", options.iters, f"-n {options.iters}"),
        ("the warm-up", options.warmup, f"-w {options.warmup}"),
        ("the checks", options.checks, f"-c {options.checks}"),
        ("the datatype", options.datatype, f"-d {options.datatype}"),
        ("the algorithm", options.algo, f"--algo {options.algo}"),
        ("the engine between nodes", options.inter, f"--inter {options.inter}"),
        ("the reduction", options.op, f"-o {options.op}"),
        ("the registration", options.register, f"-R {options.register}"),
        ("the splits", options.splits, f"--splits {options.splits}"),
        ("the baseline", options.baseline, f"--baseline {options.baseline}"),
        ("graph mode", options.graph, switch("--graph", options.graph)),
        ("the timing", options.timing, f"--timing {options.timing}"),
        ("the kernel before each operation", options.after_kernel,
         switch("--after-kernel", options.after_kernel)),
        ("the exchange", options.exchange, f"--exchange {options.exchange}"),
        ("the handle", options.handle, f"--handle {options.handle}"),
    ]


def check_same_run(facts: list[list[tuple[str, object, str]]]) -> None:
    """Raise unless every rank's run facts (``_run_facts``, by rank) agree, naming what
    each rank asked for as the user spelled it: ``ranks disagree on the sizes to run:
    rank 0 asks for -b 1M -e 1M, rank 1 for -b 2M -e 2M``.

    Raises:
        ConfigError: the ranks would run different things (and wait for each other in
            different calls).
    """
    differ = [i for i, (_topic, value, _text) in enumerate(facts[0])
              if any(rank[i][1] != value for rank in facts)]
    if not differ:
        return
    topics = [facts[0][i][0] for i in differ]
    what = topics[0] if len(topics) == 1 else f"{', '.join(topics[:-1])} and {topics[-1]}"
    asked = [" ".join(rank[i][2] for i in differ) for rank in facts]
    raise ConfigError(f"ranks disagree on {what}: " + describe_disagreement(
        asked, verb=("asks for", "ask for"), then="for"))


def run_pattern_command(args: argparse.Namespace) -> int:
    from ..baselines import make_baseline
    from ..liveness.exit_policy import peer_exit_grace
    from ..patterns import make_pattern
    from ..patterns.driver import run_pattern
    from ..window import Group

    world = World.from_comm()
    # The command's first agreements give up on a stopped or dead rank as a group's steps
    # do, and wait for a running one as long as ranks may take to arrive.
    watch = PeerWatch.open(world)
    patience = first_meeting_patience()
    try:
        with collective_step(world, "reading options", watch=watch, **patience):
            origins = OptionOrigins.of(args, _OPTION_KEYS)
            options = resolve_options(args, origins)
            with origins.naming_options():  # the Group would refuse it naming no flag
                check_handle(options.backend, options.handle)
            pattern = make_pattern(args.command, options.algo, op=options.op,
                                   datatype=options.datatype, inter=options.inter,
                                   register=options.register, splits=options.splits)
            if world.rank == 0:  # it alone writes: refuse now what would fail after the run
                check_writable(options.json)
                check_writable(getattr(args, "result", None))
            # Read here, where a bad value fails every rank together.
            grace = peer_exit_grace()
        # Before any window: a rank sweeping other sizes would otherwise be named only by
        # the window size its sizes make.
        facts = watched_allgather(world.comm, _run_facts(args, options), watch=watch,
                                  what="comparing options", **patience)
        with collective_step(world, "comparing options", watch=watch, **patience):
            check_same_run(facts)
    finally:
        watch.close()
        world.close(keep=bool(watch.failed))  # a request given up on may still arrive
    with Group(options.backend, options.exchange, handle=options.handle) as group:
        # A rank stuck in a blocking MPI collective (the driver's timing reductions) when
        # a peer dies cannot notice it: the watch ends it after this grace.
        group.watch.exit_if_stuck(grace=grace)
        # Every step from here waits at most the group's timeout and gives up on a dead
        # or stopped peer (Group.step): a stopped rank never holds the others for ever.
        with group.step("choosing the algorithm"):
            check_plot(getattr(args, "plot", None))
            if args.command == "alltoall":
                _check_all_to_all_memory(group, pattern)
            elif (options.algo in ("push", "pull", "ring", "ll", "ll-two-shot", "ll128",
                                   "ll128-two-shot")
                  and not group.backend.has_kernels):
                raise ConfigError(f"--algo {options.algo} runs GPU kernels: it needs a GPU "
                                  "backend (cuda-ipc or cuda-vmm), not host")
            if args.command in ("allreduce", "reducescatter"):
                _check_reduction_algo(args.command, options.algo, group)
        baseline = make_baseline(options.baseline, group, pattern)
        try:
            result = run_pattern(group, pattern, options, baseline=baseline,
                                 emit=lambda line: print(line, flush=True),
                                 graph=bool(options.graph),
                                 after_kernel=bool(options.after_kernel),
                                 timing=options.timing)
        except WindowTooLarge as exc:  # raised on every rank alike
            # The largest size of the sweep sizes the window: say where the user set it.
            largest = origins.name("max_bytes", format_size(options.max_bytes))
            raise ConfigError(f"{largest} is too large here: {exc}") from None
        finally:
            try:
                pattern.close()  # what crossing nodes opened (NCCL communicators, node groups)
            finally:
                if baseline is not None and hasattr(baseline, "close"):
                    baseline.close()
        status, complaint = _exit_verdict(result, options)
        # Every rank joins, --json or not: only rank 0's decides (it alone writes), and a
        # rank skipping the step would leave the others waiting in it.
        with group.step("writing the JSON"):
            if group.rank == 0 and options.json:
                _write_json(options.json, result.to_dict())
            if group.rank == 0 and getattr(args, "result", None):
                _write_result(args, options, result, status)
        if getattr(args, "plot", None):
            with group.step("drawing the plot"):
                write_run_plot(group.world, args.command, group.backend_name, options, result,
                               args.plot)
    if complaint:
        sys.stderr.write(f"ipcshare: error: {complaint}\n")
    return status


def _exit_verdict(result, options: PatternOptions) -> tuple[int, str]:
    """The run's exit status and, when not 0, the line that says why."""
    from .exit_codes import EXIT_MEASUREMENT, EXIT_OK, EXIT_SLOW, EXIT_WRONG

    if result.wrong_total:
        return EXIT_WRONG, f"{result.wrong_total} wrong elements"
    errors = result.measurement_errors
    if errors:
        return EXIT_MEASUREMENT, (f"{len(errors)} measurement error(s), figures that are not "
                                  f"results (each under its row); the first: {errors[0]}")
    if options.min_bw is not None and result.avg_busbw < options.min_bw:
        return EXIT_SLOW, (f"average busbw {result.avg_busbw:.2f} GB/s is below --min-bw "
                           f"{options.min_bw:g}")
    return EXIT_OK, ""


def _write_result(args: argparse.Namespace, options: PatternOptions, result,
                  status: int) -> None:
    """The run's result document (``--result``): one launch, every row and baseline."""
    from ..patterns.result_rows import rows_from_run_json
    from ..runtime.result_document import new_launch_id
    from .result_file import write_result

    document = result.to_dict()
    rows = rows_from_run_json(
        document, launch=new_launch_id(),
        dtype=None if args.command == "ring" else options.datatype, algorithm=options.algo,
        extra_baselines=[baseline.to_dict() for baseline in result.extra_baselines])
    write_result(args.result, tool=f"ipcshare {args.command}", world_size=result.world_size,
                 rows=rows, exit_status=status,
                 measurement_errors=document.get("measurement_errors", ()),
                 argv=getattr(args, "typed", None))


def _check_reduction_algo(command: str, algo: str, group) -> None:
    """Refuse, before the table starts, an algorithm that the collective has on other
    memory than the group's (the library would refuse it at the first call), naming those
    it has here."""
    from ..collectives.algorithms import algorithm_names

    memory = "cuda" if group.backend.has_kernels else "host"
    collective = "all_reduce" if command == "allreduce" else "reduce_scatter"
    here = ("auto", "hierarchical", *algorithm_names(memory, collective))
    if algo not in here:
        where = "GPU" if memory == "cuda" else "host"
        raise ConfigError(f"--algo {algo} does not run {command} on {where} memory (backend "
                          f"{group.backend_name}); choose one of: {', '.join(here)}")


def _check_all_to_all_memory(group, pattern) -> None:
    """Refuse, before the table starts, what the library would refuse at the first call:
    all-to-all-v spanning nodes, all-to-all where ranks take turns on a GPU (its kernels
    need every rank running at once). (The case itself leaves out the in-place rows of
    all-to-all-v on GPUs: AllToAllCase.fit_memory.)"""
    if group.world.node_count > 1 and pattern.collective == "all_to_all_v":
        raise ConfigError(f"--splits {pattern.splits}: all_to_all_v does not span nodes (this "
                          f"job spans {group.world.node_count}): use --splits even, which "
                          "runs all_to_all hierarchically (IPC in nodes, --inter between)")
    from ..collectives.algorithms import algorithm_names

    memory = "cuda" if group.backend.device_memory else "host"
    here = ("auto", *algorithm_names(memory, pattern.collective))
    if pattern.algo not in here:
        where = "GPU" if memory == "cuda" else "host"
        if (pattern.collective == "all_to_all_v"
                and pattern.algo in algorithm_names(memory, "all_to_all")):
            raise ConfigError(f"--algo {pattern.algo} runs alltoall with --splits even only "
                              f"(all_to_all); --splits {pattern.splits} calls all_to_all_v, "
                              f"which it does not run on {where} memory; choose one of: "
                              f"{', '.join(here)}")
        raise ConfigError(f"--algo {pattern.algo} does not run alltoall on {where} memory "
                          f"(backend {group.backend_name}); choose one of: {', '.join(here)}")
    if not group.backend.device_memory:
        return
    if group.time_sliced_gpus:
        raise ConfigError("all-to-all: ranks of this job take turns on a GPU (several ranks "
                          "on one GPU without MPS), and its kernels need every rank running "
                          "at once: give each rank a GPU, or start MPS "
                          "(nvidia-cuda-mps-control -d) first")


def _write_json(path: str, document: dict) -> None:
    try:
        with open(path, "w") as out:
            json.dump(document, out, indent=1)
            out.write("\n")
    except OSError as exc:
        raise ConfigError(f"cannot write {path!r}: {exc.strerror}") from None
