"""``ipcshare info``: what every rank sees — host, process, MPI, memory paths, devices."""

from __future__ import annotations

import argparse
import json
import os
import platform

from .. import __version__
from ..collectives.across_nodes.engine import nccl4py_missing
from ..liveness.consensus import collective_step
from ..runtime import settings
from ..runtime.output_files import check_writable
from ..topology.gpu_sharing import GpuSharing, gpu_sharing, shared_gpus_advice
from ..topology.peer_paths import FALLBACK_ENV, PathPlan, fallback_choice, plan_paths
from ..topology.world import World, mpi_library_name
from ..window.setting_checks import check_settings
from .option_origins import as_flags

__all__ = ["run_info", "rank_facts", "pair_paths", "node_path_plans", "PAIR_PATHS"]

# How one rank reaches another's window: mapped directly (same node; on GPUs with peer
# access), through a third GPU's window or pinned host memory (same node, GPUs without
# peer access: see peer_paths), or through MPI (other node).
PAIR_PATHS = ("direct", "relay", "host-staged", "mpi")


def _namespace(kind: str) -> str:
    try:
        return os.readlink(f"/proc/self/ns/{kind}")
    except OSError:
        return "unknown"


def _pidfd_support() -> str:
    """Whether this kernel offers pidfd_getfd (probed on our own process)."""
    from ..exchange.pidfd import probe_self

    refused = probe_self()
    return "available" if refused is None else refused


def rank_facts(world: World) -> dict:
    """Facts about this rank, cheap to gather (no memory is shared)."""
    from ..backends import gpu_count

    gpus, reason = gpu_count()
    facts = {
        "rank": world.rank, "host": world.hostname, "pid": os.getpid(),
        "local_rank": world.local_rank, "node": world.node_index,
        "pid_namespace": _namespace("pid"), "cores": len(os.sched_getaffinity(0)),
        "memfd": hasattr(os, "memfd_create"), "pidfd_getfd": _pidfd_support(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "gpus": gpus, "backend_auto": "cuda-vmm" if gpus else "host",
        "p2p_fallback": settings.raw(FALLBACK_ENV),
        "nccl4py": nccl4py_missing(),  # None: importable; else why not
    }
    if not gpus:
        facts["no_gpu_reason"] = reason
    else:
        try:
            from ..topology import devices

            facts["device"] = devices.bind_device(world.host_rank, world.host_size)
            facts["devices"] = devices.describe_devices()
            facts["p2p"] = devices.p2p_matrix()
            facts["handles"] = devices.handle_support(facts["device"])
            from ..runtime.cuda_driver import mps_client

            facts["mps"] = mps_client(facts["device"])
        except Exception as exc:
            facts["device_error"] = str(exc)
    return facts


def _sharing(facts: list[dict]) -> GpuSharing:
    """Every node's shared and time-sliced GPUs (``gpu_sharing`` node by node), merged."""
    by_node: dict[int, list[tuple[int, tuple[str, bool]]]] = {}
    for f in facts:
        if "device" in f and "devices" in f:
            uuid = f["devices"][f["device"]]["uuid"]
            by_node.setdefault(f["node"], []).append((f["rank"], (uuid, bool(f.get("mps")))))
    merged = GpuSharing({}, {})
    for ranks in by_node.values():
        node = gpu_sharing([rank for rank, _ in ranks], [device for _, device in ranks])
        merged.shared.update(node.shared)
        merged.time_sliced.update(node.time_sliced)
    return merged


def shared_gpus_of(facts: list[dict]) -> dict[str, list[int]]:
    """``{GPU uuid: ranks}`` for the GPUs that several ranks of one node are bound to."""
    return _sharing(facts).shared


def time_sliced_of(facts: list[dict], shared: dict[str, list[int]]) -> dict[str, list[int]]:
    """Those of the ``shared`` GPUs that some rank on them uses outside MPS."""
    return {uuid: ranks for uuid, ranks in _sharing(facts).time_sliced.items()
            if uuid in shared}


def node_path_plans(facts: list[dict]) -> dict[int, PathPlan]:
    """The path plan of each node (``peer_paths.plan_paths``, as windows make it), from
    every rank's facts; ``IPCSHARE_P2P_FALLBACK`` as the node's first rank has it.

    Raises:
        ConfigError: a malformed IPCSHARE_P2P_FALLBACK, or ``relay`` where a pair has no
            rank to relay through.
    """
    plans = {}
    for node in sorted({f["node"] for f in facts}):
        indices = [i for i, f in enumerate(facts) if f["node"] == node]
        members = [facts[i] for i in indices]
        ranks = [facts[i].get("rank", i) for i in indices]
        labels = [f"cuda:{f['device']}" if "device" in f else "host" for f in members]
        reach = [[_peer_access(a, b) for b in members] for a in members]
        reasons = [[_no_access_reason(a, b) for b in members] for a in members]
        plans[node] = plan_paths(ranks, labels, reach, reasons,
                                 fallback=fallback_choice(members[0].get("p2p_fallback")))
    return plans


def pair_paths(facts: list[dict]) -> list[list[str]]:
    """``paths[i][j]``: how rank i reaches rank j's window (one of ``PAIR_PATHS``; ``-``
    on the diagonal), from every rank's facts.

    Raises:
        ConfigError: as ``node_path_plans``.
    """
    plans = node_path_plans(facts)
    paths = []
    for i, a in enumerate(facts):
        row = []
        for j, b in enumerate(facts):
            if i == j:
                row.append("-")
            elif a["node"] != b["node"]:
                row.append("mpi")
            else:
                plan = plans[a["node"]]
                row.append(plan.kind(plan.ranks[_position(facts, i)],
                                     plan.ranks[_position(facts, j)]))
        paths.append(row)
    return paths


def _position(facts: list[dict], index: int) -> int:
    """Index of ``facts[index]`` among the ranks of its node."""
    node = facts[index]["node"]
    return sum(1 for f in facts[:index] if f["node"] == node)


def _peer_access(a: dict, b: dict) -> bool:
    """Whether rank ``a``'s device may map rank ``b``'s (host memory: always). Device
    ordinals only compare between ranks that see the same devices."""
    if "device" not in a or "device" not in b or a["device"] == b["device"]:
        return True
    if a.get("cuda_visible_devices") != b.get("cuda_visible_devices"):
        return True  # not comparable here; the doctor tries the pair for real
    return any(p["src"] == a["device"] and p["dst"] == b["device"] and p["access"]
               for p in a.get("p2p", []))


def _no_access_reason(a: dict, b: dict) -> str:
    """Why rank ``a``'s device may not map rank ``b``'s, as the P2P matrix says."""
    for p in a.get("p2p", []):
        if p["src"] == a.get("device") and p["dst"] == b.get("device"):
            return p.get("why") or "no peer access"
    return "no peer access reported"


def inter_choice(requested: str, facts: list[dict]) -> dict:
    """Which engine ``--inter requested`` would cross nodes with on the auto backend,
    from every rank's facts: ``{"requested", "engine" (nccl, mpi or None where it
    cannot run), "why"}``."""
    from ..collectives.across_nodes.choice import INTER_LABELS
    from ..collectives.across_nodes.engine import check_nccl_possible
    from ..runtime.errors import ConfigError

    backends = {f["backend_auto"] for f in facts}
    missing = sorted({f["nccl4py"] for f in facts if f.get("nccl4py")})
    backend = "host" if "host" in backends else "cuda-vmm"
    reason = "; ".join(missing) if missing else None
    if requested == "mpi":
        return {"requested": requested, "engine": "mpi", "why": INTER_LABELS["mpi"]}
    try:
        check_nccl_possible(backend, reason)
    except ConfigError as exc:
        if requested == "nccl":  # info's one flag among the library's arguments
            return {"requested": requested, "engine": None,
                    "why": as_flags(str(exc), {"inter": "--inter"})}
        why = ("no GPU backend on every rank" if backend == "host"
               else f"nccl4py not importable on every rank ({reason})")
        return {"requested": requested, "engine": "mpi",
                "why": f"{INTER_LABELS['mpi']}; auto: {why}"}
    return {"requested": requested, "engine": "nccl", "why": INTER_LABELS["nccl"]}


def run_info(args: argparse.Namespace) -> int:
    from ..runtime.config import INTER_ENGINES
    from ..runtime.errors import ConfigError

    world = World.from_comm()
    try:
        with collective_step(world, "reading the IPCSHARE_* settings"):
            check_settings()
        with collective_step(world, "reading options"):
            if args.inter not in INTER_ENGINES:
                raise ConfigError(f"unknown inter {args.inter!r}; choose one of: "
                                  f"{', '.join(INTER_ENGINES)}")
            if world.rank == 0:  # it alone writes: refuse now, while every rank can say so
                check_writable(args.json)
        facts = world.comm.gather(rank_facts(world), root=0)
    finally:
        world.close()
    if world.rank != 0:
        return 0
    paths = pair_paths(facts)
    plans = node_path_plans(facts)
    relays = {f"{a}-{b}": plan.path(a, b).relay for plan in plans.values()
              for a in plan.ranks for b in plan.ranks if plan.kind(a, b) == "relay"}
    document = {"ipcshare": __version__, "python": platform.python_version(),
                "mpi": mpi_library_name(),
                "world_size": world.size, "nodes": world.node_count,
                "virtual_nodes": world.virtual_nodes, "ranks": facts, "paths": paths,
                "relays": relays}
    print(f"ipcshare {__version__}  python {document['python']}  MPI: {document['mpi']}")
    virtual = (f" (virtual: IPCSHARE_VIRTUAL_NODES={world.virtual_nodes})"
               if world.virtual_nodes else "")
    print(f"world: {world.size} rank(s) on {world.node_count} node(s){virtual}")
    print(f"{'rank':>4} {'host':>12} {'node':>4} {'pid':>8} {'local':>5} {'cores':>5} "
          f"{'gpus':>4} {'auto backend':>12}  pidfd_getfd")
    for f in facts:
        print(f"{f['rank']:>4} {f['host']:>12} {f['node']:>4} {f['pid']:>8} "
              f"{f['local_rank']:>5} {f['cores']:>5} {f['gpus']:>4} {f['backend_auto']:>12}  "
              f"{f['pidfd_getfd']}")
    if world.size > 1:
        print("path from rank (row) to rank (column): direct = window mapped, mpi = other "
              "node; same node without peer access: relay:K = through rank K's window, "
              "host-staged = through pinned host memory")
        print("      " + "".join(f"{r:>12}" for r in range(world.size)))
        for r, row in enumerate(paths):
            cells = [f"relay:{relays[f'{r}-{c}']}" if cell == "relay" else cell
                     for c, cell in enumerate(row)]
            print(f"{r:>6}" + "".join(f"{cell:>12}" for cell in cells))
    document["inter"] = inter = inter_choice(args.inter, facts)
    if world.node_count > 1:
        print(f"between nodes: {inter['engine'] or 'none'} ({inter['why']})")
    namespaces = {f["pid_namespace"] for f in facts}
    if len(namespaces) > 1:
        print("note: ranks live in different PID namespaces: pidfd_getfd cannot reach peers, "
              "descriptors will go over unix sockets")
    shared = shared_gpus_of(facts)
    time_sliced = time_sliced_of(facts, shared)
    document["shared_gpus"] = {uuid: ranks for uuid, ranks in shared.items()}
    document["time_sliced_gpus"] = time_sliced
    if shared:
        print("note: " + shared_gpus_advice(shared, time_sliced))
    for f in facts:
        if "no_gpu_reason" in f and f["rank"] == 0:
            print(f"GPU: none ({f['no_gpu_reason']}); the auto backend is host shared memory")
        if "devices" in f:
            print(f"rank {f['rank']}: device {f['device']} "
                  + ", ".join(f"{k}={v}" for k, v in f["devices"][f["device"]].items())
                  + (", MPS client" if f.get("mps") else ""))
            print(f"rank {f['rank']}: handle types: {f.get('handles')}")
        if "device_error" in f:
            print(f"rank {f['rank']}: device error: {f['device_error']}")
    p2p = next((f["p2p"] for f in facts if "p2p" in f), None)
    if p2p:
        print("P2P matrix (access/native atomics/perf rank):")
        for row in p2p:
            print("  " + str(row))
    if args.json:
        try:
            with open(args.json, "w") as out:
                json.dump(document, out, indent=1, default=str)
                out.write("\n")
        except OSError as exc:
            raise ConfigError(f"cannot write {args.json!r}: {exc.strerror or exc}") from None
    return 0
