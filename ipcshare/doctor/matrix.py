"""The capability matrix, filled by real work: for every path and every ordered pair of a
node's ranks (owner, peer), the peer writes seeded bytes into the owner's window through
its own mapping and the owner reads them back.

A path is first tried as users run it: one window over all of the node's ranks. When
that fails, the full run retries it pair by pair (round-robin rounds, disjoint pairs at
once), so a cell says which pairs work and which do not, not only that one of them broke.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from ..patterns.seeding import POISON_BYTE, seeded_bytes
from ..runtime.errors import ErrorFacts, IpcShareError, error_facts
from .paths import PathSpec, close_group_noting, close_window_together, describe_failure, open_group

__all__ = ["probe_path", "pair_rounds", "run_matrix", "cell_seed", "indirect_pairs"]


def cell_seed(path_index: int, owner: int, peer: int, nbytes: int) -> np.ndarray:
    """The bytes ``peer`` writes into ``owner``'s window on path ``path_index``: distinct
    for every (path, owner, peer), so a block landing in the wrong place is caught."""
    return seeded_bytes(path_index + 1, (peer << 16) | (owner & 0xFFFF), nbytes)


def pair_rounds(count: int) -> list[list[tuple[int, int]]]:
    """Round-robin schedule: every unordered pair of ``range(count)`` exactly once, each
    round a set of disjoint pairs (the circle method)."""
    players: list[int | None] = list(range(count)) + ([None] if count % 2 else [])
    rounds = []
    for _ in range(len(players) - 1):
        half = len(players) // 2
        facing = zip(players[:half], reversed(players[half:]), strict=True)
        pairs = [(min(a, b), max(a, b)) for a, b in facing if a is not None and b is not None]
        rounds.append(pairs)
        players = [players[0], players[-1], *players[1:-1]]
    return rounds


# The typed facts of a failure (errno, cuda_error, peer_unreachable) that its cells carry.
_FACT_KEYS = tuple(field.name for field in dataclasses.fields(ErrorFacts))


def _fail_cells(owner: int, peers: list[int], failure: dict[str, Any]) -> list[dict[str, Any]]:
    facts = {key: failure.get(key) for key in _FACT_KEYS}
    return [{"owner": owner, "peer": peer, "result": "fail", "step": failure["step"],
             "error": failure["error"], "message": failure["message"], **facts}
            for peer in peers]


def _cell_error(exc: BaseException, prefix: str = "") -> dict[str, Any]:
    """A failed write or read as its cell records it: the text and the error's typed facts."""
    return {"message": f"{prefix}{type(exc).__name__}: {exc}", **error_facts(exc).to_dict()}


def _exchange_facts(group: Any, members: list[int]) -> dict[str, Any]:
    exchange = group.exchange
    refusal = exchange.pidfd_refusal if exchange is not None else None
    # The typed fact the doctor's rules read: the refused rank in the job's numbering.
    evidence = None if refusal is None else {"rank": members[refusal.rank],
                                             "errno": refusal.errno}
    return {"exchange_used": group.exchange_name,
            "fallback_reason": exchange.fallback_reason if exchange is not None else None,
            "pidfd_refusal": evidence}


def probe_path(spec: PathSpec, comm: Any, members: list[int], *, path_index: int,
               slot_bytes: int, timeout: float, world_rank: int) -> dict[str, Any]:
    """Collective over ``comm`` (ranks of one node; ``members`` are their world ranks):
    open ``spec``, build one window, let every rank write into every other rank's window,
    read back. Never raises for a failure of the path itself: it is recorded.

    Returns this rank's record: the path's status, the failing step and message when
    setup failed, and the cells where this rank is the owner.
    """
    me, count = comm.Get_rank(), comm.Get_size()
    owner = members[me]
    peers = [members[r] for r in range(count) if r != me]
    record: dict[str, Any] = {"path": spec.name, **spec.to_dict(), "status": "ok",
                              "cells": []}
    try:
        group = open_group(spec, comm, timeout=timeout, world_rank=world_rank)
    except IpcShareError as exc:
        failure = describe_failure(exc, members)
        record.update(status="failed", failure=failure, cells=_fail_cells(owner, peers, failure))
        return record
    try:
        record["device"] = group.backend.describe_device()
        try:
            window = group.window(2 * count * slot_bytes)
        except IpcShareError as exc:
            failure = describe_failure(exc, members)
            record.update(status="failed", failure=failure,
                          cells=_fail_cells(owner, peers, failure),
                          **_exchange_facts(group, members))
            return record
        record.update(_exchange_facts(group, members))
        record["setup_ms"] = {step: round(ms, 3) for step, ms in window.setup_ms.items()}
        if window.paths.has_fallbacks:
            record["pair_paths"] = indirect_pairs(window, members)
        record["cells"] = _write_and_read_back(window, comm, members, path_index, slot_bytes)
        closing = close_window_together(window)
        if closing:
            record["close_error"] = closing
    finally:
        close_group_noting(group, record)
    if any(cell["result"] != "ok" for cell in record["cells"]):
        record["status"] = "failed"
    return record


def _write_and_read_back(window: Any, comm: Any, members: list[int], path_index: int,
                         slot_bytes: int) -> list[dict[str, Any]]:
    """Inbox slot j of each window receives local rank j's bytes; outbox slot j stages
    what this rank sends to local rank j. Every failure is caught here so all ranks
    reach the same barriers."""
    me, count = comm.Get_rank(), comm.Get_size()
    engine = window.engine
    inbox_at, outbox_at = 0, count * slot_bytes
    write_errors: dict[int, dict[str, Any]] = {}
    try:
        engine.upload(window.local.slice(inbox_at, count * slot_bytes),
                      np.full(count * slot_bytes, POISON_BYTE, dtype=np.uint8))
        engine.synchronize()
    except Exception as exc:
        write_errors = {r: _cell_error(exc, "poison: ") for r in range(count)}
    comm.Barrier()  # every inbox is poisoned before anyone writes
    # Pairs without peer access go through the window's staged copies, where the owner
    # takes part: every rank pulls from its staged peers while it pushes to them.
    sends, receives, poison_failed = [], [], bool(write_errors)
    for target in range(count):
        if target == me or target in write_errors:
            continue
        try:
            staged = window.local.slice(outbox_at + target * slot_bytes, slot_bytes)
            engine.upload(staged, cell_seed(path_index, members[target], members[me], slot_bytes))
            # The window's group is ``comm`` itself: its rank numbers are comm's.
            if window.path(target) == "direct":
                engine.copy(window.peer(target).slice(inbox_at + me * slot_bytes, slot_bytes),
                            staged)
            else:
                sends.append((target, staged))
        except Exception as exc:
            write_errors[target] = _cell_error(exc)
    if window.staged is not None and not poison_failed:
        receives = [(peer, window.local.slice(inbox_at + peer * slot_bytes, slot_bytes))
                    for peer in window.staged.peers]
    if sends or receives:
        try:
            window.staged.bind(engine, sends=sends, receives=receives)()
        except Exception as exc:
            for target, _source in sends:
                write_errors.setdefault(target, _cell_error(exc))
    try:
        engine.synchronize()
    except Exception as exc:
        for target in range(count):
            write_errors.setdefault(target, _cell_error(exc))
    comm.Barrier()  # every write has landed (or failed) before anyone reads
    # What each writer failed to write, so owners can tell "never written" from "lost".
    failed_writes = comm.allgather({t: e for t, e in write_errors.items() if t != me})
    cells = []
    try:
        inbox = engine.download(window.local.slice(inbox_at, count * slot_bytes))
        read_error = None
    except Exception as exc:
        inbox, read_error = None, _cell_error(exc)
    for peer in range(count):
        if peer == me:
            continue
        cell: dict[str, Any] = {"owner": members[me], "peer": members[peer], "result": "ok",
                                "path": window.path(peer)}
        if me in failed_writes[peer]:
            cell.update(result="fail", step="write", **failed_writes[peer][me])
        elif read_error is not None:
            cell.update(result="fail", step="readback", **read_error)
        else:
            got = inbox[peer * slot_bytes:(peer + 1) * slot_bytes]
            expected = cell_seed(path_index, members[me], members[peer], slot_bytes)
            wrong = int(np.count_nonzero(got != expected))
            if wrong:
                first = int(np.flatnonzero(got != expected)[0])
                untouched = bool(np.all(got == POISON_BYTE))
                cell.update(result="fail", step="readback", wrong_bytes=wrong,
                            message=(f"{wrong} of {slot_bytes} bytes differ (first at byte "
                                     f"{first}){': nothing arrived' if untouched else ''}; "
                                     f"rank {members[peer]}'s write reported success"))
        cells.append(cell)
    return cells


def indirect_pairs(window: Any, members: list[int]) -> list[dict[str, Any]]:
    """The node's pairs without peer access (job ranks): their path, relay and why."""
    plan = window.paths
    pairs = []
    for pair, path in sorted(plan.indirect.items(), key=lambda item: sorted(item[0])):
        a, b = sorted(pair)
        pairs.append({"ranks": [members[a], members[b]], "path": path.kind,
                      "relay": None if path.relay is None else members[path.relay],
                      "devices": [plan.label(a), plan.label(b)], "reason": path.reason,
                      "disabled_by_setting": path.disabled_by_setting})
    return pairs


def run_matrix(paths: list[tuple[int, PathSpec]], comm: Any, members: list[int], *,
               slot_bytes: int, timeout: float, world_rank: int, pairwise: bool,
               before_path: Callable[[PathSpec], None]) -> list[dict[str, Any]]:
    """Collective over the node's ``comm``: ``probe_path`` for every ``(index, spec)``,
    then, when ``pairwise`` and a node-wide window failed on more than two ranks, the
    pair-by-pair retry. ``before_path`` runs first for each path (progress, liveness)."""
    records = []
    for index, spec in paths:
        before_path(spec)
        record = probe_path(spec, comm, members, path_index=index, slot_bytes=slot_bytes,
                            timeout=timeout, world_rank=world_rank)
        if pairwise and "failure" in record and comm.Get_size() > 2:
            record["cells"] = _pairwise_cells(spec, comm, members, path_index=index,
                                              slot_bytes=slot_bytes, timeout=timeout,
                                              world_rank=world_rank)
            record["pairwise"] = True
        records.append(record)
    return records


def _pairwise_cells(spec: PathSpec, comm: Any, members: list[int], *, path_index: int,
                    slot_bytes: int, timeout: float, world_rank: int) -> list[dict[str, Any]]:
    from ..topology.world import mpi

    MPI = mpi()
    me = comm.Get_rank()
    cells = []
    for pairs in pair_rounds(comm.Get_size()):
        mine = next((i for i, pair in enumerate(pairs) if me in pair), None)
        sub = comm.Split(MPI.UNDEFINED if mine is None else mine, key=me)
        if sub == MPI.COMM_NULL:
            continue
        try:
            pair = [members[r] for r in pairs[mine]]
            record = probe_path(spec, sub, pair, path_index=path_index, slot_bytes=slot_bytes,
                                timeout=timeout, world_rank=world_rank)
            for cell in record["cells"]:
                cell["pairwise"] = True
                cells.append(cell)
        finally:
            sub.Free()
    return cells
