"""A suite's ``p2p`` case: P2P direct, one process over the GPUs of the job's ranks,
against IPC windows on the case's backend, one rank per GPU, on the same sizes.

Rank 0 runs the direct half as a child, ``python -m ipcshare p2p --no-ipc``, whose
CUDA_VISIBLE_DEVICES names the ranks' GPUs by UUID in rank order (GPU g of the child is
rank g's GPU, whatever each rank was given to see); the other ranks wait for it with a
deadline. Then every rank measures the pattern through IPC windows with the driver, as
the suite's ring and all-gather cases do: that is the IPC half (no child mpiexec inside
an mpiexec'd job). The direct modes come back as the case's baselines, ``p2p-kernel`` and
``p2p-copy``, so the outputs show what IPC costs against P2P direct wherever they show
a baseline.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from collections.abc import Callable
from typing import Any

from ..liveness.deadline_waits import watched_allgather
from ..p2p.child_job import ipcshare_command, run_child
from ..p2p.ipc_half import parse_window_setup_ms
from ..patterns.base import Pattern
from ..patterns.driver import run_pattern
from ..patterns.results import BaselineResult, Measurement, Row, RunResult
from ..runtime.errors import BackendError
from ..runtime.gpu_names import format_uuid
from ..topology.world import World, format_ranks
from ..window import Group
from .suite import BenchCase

__all__ = ["P2pCaseRun", "DIRECT_DEADLINE_S", "no_gpu_reason", "skip_reason",
           "group_skip_reason", "run_p2p_case", "direct_half_arguments"]

# How long rank 0's child may take over the direct half of one case (every size, both
# modes); the other ranks wait a minute longer before they give up on rank 0.
DIRECT_DEADLINE_S = 900.0
# What each direct mode is, as the outputs name baselines.
_LABELS = {"p2p-kernel": "P2P direct: p2p_push kernel storing through peer pointers",
           "p2p-copy": "P2P direct: cuMemcpyPeerAsync (copy engine)"}
# The variables by which launchers make a process one of their ranks (Open MPI, MPICH's
# Hydra, PMIx, Slurm's PMI): the child is no rank of this job, and ``ipcshare p2p``
# refuses to run as one.
_RANK_VARIABLES = ("OMPI_COMM_WORLD_", "OMPI_UNIVERSE_SIZE", "PMI_", "PMIX_", "MPI_LOCALRANKID",
                   "MPI_LOCALNRANKS")


@dataclasses.dataclass
class P2pCaseRun:
    """One run of a p2p case: the IPC rows as ours with the direct modes as baselines;
    the direct modes that did not run, with why; what the direct half reported beside
    its rows (GPUs, peer access pair by pair, setup times)."""

    result: RunResult
    missing: dict[str, str]
    details: dict[str, Any]


def no_gpu_reason(world: World) -> str | None:
    """Collective: why no rank of the job sees a GPU (rank 0's reason), or None when one
    does."""
    from ..backends import gpu_count

    seen = world.comm.allgather(gpu_count())
    if any(count > 0 for count, _reason in seen):
        return None
    return seen[0][1]


def skip_reason(case: BenchCase, world: World, no_gpu: str | None) -> str | None:
    """Why p2p ``case`` cannot run in this job, alike on every rank (``no_gpu`` from
    :func:`no_gpu_reason`); None when it can."""
    if no_gpu is not None:
        return (f"no rank sees a GPU, and P2P direct against IPC needs 2 or more, one rank "
                f"each ({no_gpu})")
    if case.backend == "host":
        return "its backend is host: P2P direct against IPC needs GPU memory"
    if world.size < 2:
        return "one rank: P2P direct against IPC needs 2 or more GPUs, one rank each"
    if world.node_count > 1:
        return (f"the job spans {world.node_count} nodes: P2P direct is one process over "
                "one node's GPUs; run it in a job of one node")
    from ..p2p.gpus import P2P_MAX_TARGETS

    if world.size > P2P_MAX_TARGETS:
        return (f"{world.size} ranks: P2P direct's kernel pushes to at most "
                f"{P2P_MAX_TARGETS} GPUs")
    return None


def group_skip_reason(group: Group) -> str | None:
    """Why p2p cases cannot run over ``group`` (alike on every rank), or None."""
    if group.shared_gpus:
        shared = "; ".join(f"{format_uuid(uuid)} by ranks {format_ranks(ranks)}"
                           for uuid, ranks in group.shared_gpus.items())
        return f"ranks share GPUs ({shared}): P2P direct against IPC needs a GPU per rank"
    return None


def run_p2p_case(group: Group, case: BenchCase, pattern: Pattern, *,
                 emit: Callable[[str], None],
                 before_size: Callable[[int], None] | None = None) -> P2pCaseRun:
    """Collective: the direct half on rank 0, then the IPC half on every rank with
    ``pattern`` (the case's pattern op and algorithm).

    Raises:
        BackendError: the direct half failed or gave other sizes (on every rank).
        IpcShareError: the IPC half failed, as the driver raises it (on every rank).
    """
    world = group.world
    say = emit if world.rank == 0 else (lambda _line: None)
    uuids = group.collective("GPUs of the p2p case", format_uuid(group.backend.uuid))
    outcome = _direct_half(group, case, uuids, say)
    if "error" in outcome:
        raise BackendError(f"the P2P direct half on {world.where(0)} failed: "
                           f"{outcome['error']} ({outcome['command']})")
    document = outcome["document"]
    seen: list[str] = []

    def keep(line: str) -> None:
        seen.append(line)
        emit(line)

    # One buffer set, no rotation: the direct half reuses its buffers too.
    ipc = run_pattern(group, pattern, case.options, emit=keep, timing="nccl-tests",
                      before_size=before_size)
    # Only rank 0 sees the table; every rank keeps the same result.
    setup_ms = group.collective("p2p case window setup",
                                parse_window_setup_ms("\n".join(seen)))[0]
    baselines, missing = _direct_baselines(document, case.p2p_op, ipc.rows)
    entry = document["ops"][case.p2p_op]
    details = {"command": outcome["command"], "gpus": document["gpus"],
               "devices": document["devices"], "peer_access": document["peer_access"],
               "setup_ms": document["setup_ms"], "allocate_ms": entry["allocate_ms"],
               "ipc_window_setup_ms": setup_ms}
    result = dataclasses.replace(ipc, baseline=baselines[0] if baselines else None,
                                 extra_baselines=baselines[1:])
    return P2pCaseRun(result, missing, details)


def direct_half_arguments(case: BenchCase) -> list[str]:
    """The ``ipcshare`` arguments of a p2p case's direct half: its pattern and sweep, and
    ``--peer-access off`` for a host-staged case."""
    options = case.options
    args = ["p2p", "--no-ipc", "--op", case.p2p_op, "-b", str(options.min_bytes),
            "-e", str(options.max_bytes), "-f", str(options.step_factor),
            "-n", str(options.iters), "-w", str(options.warmup), "-c", str(options.checks)]
    if not case.p2p_peer_access:
        args += ["--peer-access", "off"]
    return args


def _direct_half(group: Group, case: BenchCase, uuids: list[str],
                 say: Callable[[str], None]) -> dict[str, Any]:
    """Collective: rank 0 runs the child while the others wait; everyone gets
    ``{"document", "command"}`` or ``{"error", "command"}``."""
    args = direct_half_arguments(case)
    outcome = None
    if group.world.rank == 0:
        command = "python -m ipcshare " + shlex.join(args)
        say(f"# P2P direct half: {command}, one process over the ranks' GPUs "
            f"({', '.join(uuid[:12] for uuid in uuids)})")
        environment = {key: value for key, value in os.environ.items()
                       if not key.startswith(_RANK_VARIABLES)}
        environment["CUDA_VISIBLE_DEVICES"] = ",".join(uuids)
        try:
            run = run_child(ipcshare_command(*args), timeout_s=DIRECT_DEADLINE_S,
                            env=environment)
        except Exception as exc:  # the others must hear of it, not wait for the deadline
            outcome = {"error": f"{type(exc).__name__}: {exc}", "command": command}
        else:
            for line in run.stdout.splitlines():
                say(line)
            outcome = ({"error": run.error or "no result", "command": command}
                       if run.document is None
                       else {"document": run.document, "command": command})
    # A plain barrier would hold the others forever if rank 0 died: wait with a deadline
    # and the peer watch.
    return watched_allgather(group.world.comm, outcome, watch=group.watch,
                             timeout=DIRECT_DEADLINE_S + 60.0,
                             what="the P2P direct half on rank 0")[0]


def _direct_baselines(document: dict[str, Any], op: str, rows: list[Row]
                      ) -> tuple[list[BaselineResult], dict[str, str]]:
    """The direct modes of ``document`` as baselines with one row per row of ours (same
    size, our primary mode's name), and the modes that did not run, with why.

    Raises:
        BackendError: the direct half measured other sizes than the IPC half.
    """
    from ..p2p.direct import MODES

    by_size = {row["size"]: row for row in document["ops"][op]["rows"]}
    if [row.size for row in rows] != list(by_size):
        raise BackendError(f"the P2P direct half measured sizes {list(by_size)}, the IPC "
                           f"half {[row.size for row in rows]}")
    version = f"ipcshare {document['ipcshare']}, one process over {document['gpus']} GPUs"
    baselines, missing = [], {}
    for mode in (f"p2p-{mode}" for mode in MODES):
        field = mode.replace("-", "_")
        if not all(field in row for row in by_size.values()):
            missing[mode] = _why_not_run(document)
            continue
        baselines.append(BaselineResult(mode, version, [
            Row(row.size, row.count,
                {next(iter(row.modes)): Measurement.from_dict(by_size[row.size][field])})
            for row in rows], _LABELS[mode]))
    return baselines, missing


def _why_not_run(document: dict[str, Any]) -> str:
    """Why ``ipcshare p2p`` left out its kernel mode: pairs without peer access."""
    from ..p2p.peer_access import PeerPair, describe_pairs

    refused = describe_pairs([PeerPair(**pair) for pair in document["peer_access"]])
    return ("no peer access (" + "; ".join(refused) + "): a kernel can only dereference "
            "peers it has access to") if refused else "not run"
