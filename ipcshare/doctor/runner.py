"""One doctor run, stage by stage, on every rank: environment, capability matrix,
bandwidth, limits and leak check, then rank 0 gathers every rank's results, judges each
node and prints the table and the cluster summary.

Stages run per node (their groups live on the node's communicator), so nodes never wait
for each other until the final gather. Each stage starts at a deadline-bounded meeting
point of the node's ranks and is watched by the watchdog, so a rank that dies or hangs
is named by the others instead of freezing the job.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from .. import __version__
from ..liveness.consensus import collective_step
from ..topology.world import World, mpi_library_name
from .environment import collect_rank_facts
from .liveness import Checkpoints, PeerLost, Watchdog, maybe_die_for_test
from .paths import GPU_PATHS, HOST_PATHS, PATHS_BY_NAME, PathSpec
from .plan import DoctorPlan

__all__ = ["run_doctor", "DoctorOutcome", "GPU_PATH_PREFERENCE"]

# Which working GPU path the bandwidth and limit stages use: what "auto" would pick first.
GPU_PATH_PREFERENCE = ("cuda-vmm/pidfd", "cuda-vmm/socket", "cuda-ipc")


@dataclasses.dataclass
class DoctorOutcome:
    """What every rank learns at the end: whether every node passed, and (rank 0) the
    document written to --json / --yaml."""

    passed: bool
    document: dict[str, Any] | None = None


class _Stages:
    """The per-rank state of one run: where it is, how long each stage took, and the
    node meeting points."""

    def __init__(self, world: World, plan: DoctorPlan, watchdog: Watchdog,
                 progress: Callable[[str], None]) -> None:
        self.world = world
        self.plan = plan
        self.watchdog = watchdog
        self.progress = progress
        self.members = list(world.local_ranks)
        self.node = Checkpoints(world.local_comm, timeout=plan.timeout_s,
                                name_rank=lambda r: world.where(world.local_ranks[r]))
        self.seconds: dict[str, float] = {}
        self._stage: str | None = None
        self._started = time.perf_counter()

    def begin(self, stage: str, value: Any = None) -> list[Any]:
        """Enter ``stage``: the test hook, the watchdog, progress, then the node's
        meeting point (returns every local rank's ``value``).

        Raises:
            PeerLost: a rank of the node did not come.
        """
        now = time.perf_counter()
        if self._stage is not None:
            self.seconds[self._stage] = round(now - self._started, 3)
        self._stage, self._started = stage, now
        maybe_die_for_test(self.world.rank, stage)
        self.watchdog.arm(stage)
        self.progress(stage)
        return self.node.meet(stage, value)

    def finish(self) -> None:
        if self._stage is not None:
            self.seconds[self._stage] = round(time.perf_counter() - self._started, 3)
            self._stage = None


def _environment(stages: _Stages) -> tuple[dict[str, Any], bool, Any]:
    world, plan = stages.world, stages.plan
    stages.begin("environment")
    facts = collect_rank_facts(local_rank=world.local_rank, local_size=world.local_size,
                               node_facts=world.local_rank == 0, probe_acs=plan.probe_pci_acs)
    counts = stages.begin("environment gpus", facts["gpu"]["count"])
    gpu_node = any(counts)
    context = None
    bound = facts["gpu"].get("bound")
    if bound is not None:
        # Hold the device's primary context for the whole run: otherwise every group
        # would create and destroy it again (slow, and it moves the leak check).
        try:
            from ..runtime import cuda_driver

            context = cuda_driver.PrimaryContext(bound)
        except Exception as exc:
            facts["gpu"]["error"] = f"{type(exc).__name__}: {exc}"
    return facts, gpu_node, context


def _matrix(stages: _Stages, gpu_node: bool) -> list[dict[str, Any]]:
    from .matrix import run_matrix

    specs = list(HOST_PATHS) + (list(GPU_PATHS) if gpu_node else [])
    plan, world = stages.plan, stages.world
    return run_matrix(list(enumerate(specs)), world.local_comm, stages.members,
                      slot_bytes=plan.matrix_slot_bytes, timeout=plan.group_timeout_s,
                      world_rank=world.rank, pairwise=plan.pairwise_diagnosis,
                      before_path=lambda spec: stages.begin(f"matrix {spec.name}"))


def _working_paths(stages: _Stages, records: list[dict[str, Any]]) -> tuple[PathSpec | None,
                                                                          PathSpec | None]:
    """The host path and the GPU path that worked on every rank of the node."""
    mine = [r["path"] for r in records if r["status"] == "ok"]
    everyone = stages.begin("matrix verdict", mine)
    working = set(everyone[0]).intersection(*everyone[1:])
    host = PATHS_BY_NAME["host-shm"] if "host-shm" in working else None
    gpu = next((PATHS_BY_NAME[name] for name in GPU_PATH_PREFERENCE if name in working), None)
    return host, gpu


def _bandwidth(stages: _Stages, host: PathSpec | None, gpu: PathSpec | None
               ) -> dict[str, Any]:
    from .bandwidth import measure_pairs

    plan, world = stages.plan, stages.world
    result: dict[str, Any] = {}
    for side, spec, nbytes in (("host", host, plan.host_bandwidth_bytes),
                               ("gpu", gpu, plan.gpu_bandwidth_bytes)):
        if spec is None:
            continue
        stages.begin(f"bandwidth {spec.name}")
        result[side] = measure_pairs(spec, world.local_comm, stages.members, nbytes=nbytes,
                                     repeats=plan.bandwidth_repeats,
                                     latency_writes=plan.latency_writes,
                                     timeout=plan.group_timeout_s, world_rank=world.rank)
    return result


def _staging(stages: _Stages, facts: dict[str, Any], gpu_node: bool) -> dict[str, Any] | None:
    """Local rank 0 of a node whose ranks see 2 or more GPUs runs the host-staging probe
    (full runs); everyone else waits for it at the next stage."""
    plan, world = stages.plan, stages.world
    if not plan.staging_probe_bytes or not gpu_node:
        return None
    stages.begin("host-staging probe")
    if world.local_rank != 0 or ((facts.get("gpu") or {}).get("count") or 0) < 2:
        return None
    from .staging import run_staging_probe

    return run_staging_probe(nbytes=plan.staging_probe_bytes,
                             timeout_s=min(60.0, plan.stage_budget_s * 0.8))


def _limits(stages: _Stages, host: PathSpec | None, gpu: PathSpec | None,
            gpu_ordinal: int | None) -> tuple[dict[str, Any], dict[str, Any]]:
    from .limits import (
        compare_snapshots,
        probe_gpu_memory_facts,
        probe_largest_export,
        probe_window_limit,
        resource_snapshot,
    )

    plan, world = stages.plan, stages.world
    stages.begin("limits")
    before = resource_snapshot(gpu_ordinal)
    windows = []
    for spec in (host, gpu):
        if spec is None:
            continue
        stages.begin(f"limits windows {spec.name}")
        windows.append(probe_window_limit(
            spec, world.local_comm, stages.members, bound=plan.window_bound,
            budget_s=plan.window_time_budget_s, timeout=plan.group_timeout_s,
            world_rank=world.rank))
    stages.begin("limits exports")
    exports = [probe_largest_export(spec, local_rank=world.local_rank,
                                    local_size=world.local_size,
                                    cap=plan.gpu_export_cap if spec.gpu else plan.host_export_cap,
                                    bisect_steps=plan.export_bisect_steps)
               for spec in (host, gpu) if spec is not None]
    per_rank: dict[str, Any] = {"exports": exports}
    if gpu_ordinal is not None:
        per_rank["gpu_memory"] = probe_gpu_memory_facts(gpu_ordinal, va_cap=plan.va_probe_cap)
    stages.begin("leak check")
    after = resource_snapshot(gpu_ordinal)
    return {"windows": windows, "per_rank": per_rank}, compare_snapshots(before, after)


def run_doctor(plan: DoctorPlan, *, json_path: str | None = None, yaml_path: str | None = None,
               emit: Callable[[str], None] = print, error_status: int = 1,
               progress_stream: Any = None) -> DoctorOutcome:
    """Collective over MPI.COMM_WORLD: the whole doctor. Rank 0 prints the table and the
    cluster summary through ``emit`` and writes the files; every rank returns whether
    every node passed. ``error_status`` is the exit status the watchdog leaves with.

    Raises:
        ConfigError: an output file cannot be written (on every rank).
        PeerLost: a rank did not answer in time (on every rank that can still hear);
            the caller should leave without MPI_Finalize, which could wait for the lost
            rank.
    """
    from ..runtime.errors import ConfigError
    from ..runtime.output_files import check_writable
    from .report import Progress

    started = time.perf_counter()
    world = World.from_comm()
    with collective_step(world, "checking the output files"):
        if world.rank == 0:
            check_writable(json_path)
            check_writable(yaml_path)
    progress = Progress(enabled=world.rank == 0, stream=progress_stream)
    watchdog = Watchdog(budget_s=plan.stage_budget_s, who=world.where(), status=error_status)
    stages = _Stages(world, plan, watchdog, progress.step)
    everyone = Checkpoints(world.comm, timeout=plan.stage_budget_s, name_rank=world.where)
    context = None
    try:
        facts, gpu_node, context = _environment(stages)
        records = _matrix(stages, gpu_node)
        host, gpu = _working_paths(stages, records)
        bandwidth = _bandwidth(stages, host, gpu)
        staging = _staging(stages, facts, gpu_node)
        gpu_ordinal = facts["gpu"].get("bound") if context is not None else None
        limits, leak = _limits(stages, host, gpu, gpu_ordinal)
        stages.begin("report")
        stages.finish()
        result = {"rank": world.rank, "local_rank": world.local_rank, "node": world.node_index,
                  "environment": facts, "matrix": records, "bandwidth": bandwidth,
                  "staging": staging,
                  "limits": limits, "leak": leak, "stage_seconds": stages.seconds}
        # The job-wide gather has its own deadline; the stage watchdog would only race it.
        watchdog.stop()
        results = everyone.gather("report", result)
        document = None
        answer: dict[str, Any] = {"passed": False, "error": None}
        if world.rank == 0:
            document, answer = _judge(results, plan, started, json_path, yaml_path, emit,
                                      progress)
        answer = everyone.release("report", answer)
    except PeerLost as exc:
        progress.done()
        if world.rank == 0:
            _write_partial(json_path, yaml_path, plan, started, exc)
        raise  # leave the communicators alone: a lost rank may still owe them messages
    finally:
        watchdog.stop()
        if context is not None:
            try:
                context.close()
            except Exception:
                pass  # the verdict is made; a release error must not replace it
    stages.node.close()
    everyone.close()
    world.close()
    if answer["error"]:
        raise ConfigError(answer["error"])
    return DoctorOutcome(passed=answer["passed"], document=document)


def _judge(results: list[dict[str, Any]], plan: DoctorPlan, started: float,
           json_path: str | None, yaml_path: str | None, emit: Callable[[str], None],
           progress: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Rank 0: the document, the table and the summary on screen, the files."""
    from ..runtime.errors import ConfigError
    from .cluster import render_summary
    from .report import render_header, render_node, write_outputs
    from .verdict import build_document

    document = build_document(results, version=__version__, quick=plan.quick,
                              mpi_library=_mpi_library(),
                              elapsed_s=time.perf_counter() - started)
    progress.done()
    lines = render_header(document)
    for key, node in document["nodes"].items():
        lines += [""] + render_node(key, node)
    lines += [""] + render_summary(document)
    for line in lines:
        emit(line)
    answer: dict[str, Any] = {"passed": document["pass"], "error": None}
    try:
        write_outputs(document, json_path=json_path, yaml_path=yaml_path)
    except ConfigError as exc:
        answer["error"] = str(exc)
    return document, answer


def _mpi_library() -> str:
    try:
        return mpi_library_name()
    except Exception:
        return "MPI"


def _write_partial(json_path: str | None, yaml_path: str | None, plan: DoctorPlan,
                   started: float, error: BaseException | None) -> None:
    """After a lost rank, rank 0 still leaves a verdict for CI: failed, and why."""
    from .report import write_outputs

    document = {"ipcshare": __version__, "quick": plan.quick, "pass": False,
                "elapsed_s": round(time.perf_counter() - started, 3),
                "error": str(error), "nodes": {}}
    try:
        write_outputs(document, json_path=json_path, yaml_path=yaml_path)
    except Exception:
        pass  # the error line on stderr is the verdict that matters now
