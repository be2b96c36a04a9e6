"""Bandwidth and latency per ordered pair of a node's ranks, one pair at a time (as
p2pBandwidthLatencyTest does): the writer copies a large block from its window into the
owner's window through its mapping (the copy engine on GPUs, memcpy on the host), timed
with the engine's timer (CUDA events on GPUs), then repeats 4-byte writes for latency.
The owner checks what arrived, so a fast number is also a correct one. A pair of GPUs
without peer access is measured on its fallback path (relay or host-staged, ``path`` in
the row): the writer pushes staged chunks while the owner pulls them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..patterns.seeding import seeded_bytes
from ..runtime.errors import IpcShareError
from .paths import PathSpec, close_group_noting, close_window_together, describe_failure, open_group
from .plan import EXPECTED_MIN_GBPS

__all__ = ["measure_pairs", "link_kind", "judge_rows", "checksum", "LATENCY_BYTES"]

LATENCY_BYTES = 4
_SEED_ITERATION = 0xB0B  # any iteration the matrix does not use


def checksum(data: np.ndarray) -> tuple[int, int]:
    """(sum, position-weighted sum) of the 64-bit words of ``data`` (padded to whole
    words), both wrapping at 2**64: cheap enough for 64 MiB per pair, and a lost, changed
    or misplaced word changes it."""
    data = np.ascontiguousarray(data, dtype=np.uint8).reshape(-1)
    if data.nbytes % 8:
        data = np.concatenate([data, np.zeros(8 - data.nbytes % 8, dtype=np.uint8)])
    words = data.view(np.uint64)
    weights = np.arange(1, words.size + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return (int(np.add.reduce(words, dtype=np.uint64)),
                int(np.add.reduce(words * weights, dtype=np.uint64)))


def measure_pairs(spec: PathSpec, comm: Any, members: list[int], *, nbytes: int,
                  repeats: int, latency_writes: int, timeout: float,
                  world_rank: int) -> dict[str, Any]:
    """Collective over the node's ``comm``: time every ordered pair on ``spec``.

    Returns this rank's record: ``rows`` (pairs where it wrote: GB/s and latency) and
    ``received`` (pairs where it owned the window: whether the bytes arrived intact).
    A failure to set up the path is recorded, not raised.
    """
    count = comm.Get_size()
    record: dict[str, Any] = {"path": spec.name, "bytes": nbytes, "status": "ok", "rows": [],
                              "received": []}
    if count < 2:
        record["status"] = "skipped"
        return record
    try:
        group = open_group(spec, comm, timeout=timeout, world_rank=world_rank)
    except IpcShareError as exc:
        record.update(status="failed", failure=describe_failure(exc, members))
        return record
    try:
        try:
            window = group.window(2 * nbytes)
        except IpcShareError as exc:
            record.update(status="failed", failure=describe_failure(exc, members))
            return record
        record["device"] = group.backend.describe_device()
        _time_every_pair(window, comm, members, record, nbytes=nbytes, repeats=repeats,
                         latency_writes=latency_writes)
        closing = close_window_together(window)
        if closing:
            record["close_error"] = closing
    finally:
        close_group_noting(group, record)
    return record


def _time_every_pair(window: Any, comm: Any, members: list[int], record: dict[str, Any], *,
                     nbytes: int, repeats: int, latency_writes: int) -> None:
    me, count = comm.Get_rank(), comm.Get_size()
    engine = window.engine
    outbox = window.local.slice(0, nbytes)
    mine = seeded_bytes(_SEED_ITERATION, members[me], nbytes)
    try:
        engine.upload(outbox, mine)
        engine.synchronize()
        stage_error = None
    except Exception as exc:
        stage_error = f"{type(exc).__name__}: {exc}"
    sums = comm.allgather(checksum(mine))
    del mine
    for writer in range(count):
        for owner in range(count):
            if writer == owner:
                continue
            comm.Barrier()
            staged = window.path(owner if me == writer else writer) not in ("direct", "self")
            if me == writer:
                row: dict[str, Any] = {"writer": members[me], "owner": members[owner],
                                       "path": window.path(owner)}
                if stage_error:
                    row["error"] = stage_error
                else:
                    try:
                        if staged:
                            copies = _staged_copies(window, sends=[(owner, outbox)])
                        else:
                            target = window.peer(owner).slice(nbytes, nbytes)
                            copies = _direct_copies(engine, target, outbox)
                        row.update(_time_one_pair(engine, outbox.nbytes, copies, repeats,
                                                  latency_writes))
                    except Exception as exc:
                        row["error"] = f"{type(exc).__name__}: {exc}"
                record["rows"].append(row)
            elif me == owner and staged:
                # Without peer access the owner pulls what the writer pushes, call for call.
                try:
                    big, tiny = _staged_copies(
                        window, receives=[(writer, window.local.slice(nbytes, nbytes))])
                    for _ in range(1 + repeats):
                        big()
                    for _ in range(1 + latency_writes):
                        tiny()
                    engine.synchronize()
                except Exception:
                    pass  # the writer's row and this owner's readback tell what went wrong
            comm.Barrier()
            if me == owner:
                received: dict[str, Any] = {"writer": members[writer], "owner": members[me]}
                try:
                    got = engine.download(window.local.slice(nbytes, nbytes))
                    received["intact"] = checksum(got) == tuple(sums[writer])
                except Exception as exc:
                    received.update(intact=False, error=f"{type(exc).__name__}: {exc}")
                record["received"].append(received)


def _direct_copies(engine: Any, target: Any, source: Any) -> tuple[Any, Any]:
    """(the block copy, the 4-byte copy) into a peer's mapped window."""
    tiny_target, tiny_source = target.slice(0, LATENCY_BYTES), source.slice(0, LATENCY_BYTES)
    return (lambda: engine.copy(target, source),
            lambda: engine.copy(tiny_target, tiny_source))


def _staged_copies(window: Any, *, sends: list = (), receives: list = ()) -> tuple[Any, Any]:
    """(the block copy, the 4-byte copy) through the window's staged copies (relay or
    host-staged): the sender's half or the receiver's, which the other end mirrors."""
    def tiny(transfers: list) -> list:
        return [(peer, buffer.slice(0, LATENCY_BYTES)) for peer, buffer in transfers]
    return (window.staged.bind(window.engine, sends=sends, receives=receives),
            window.staged.bind(window.engine, sends=tiny(sends), receives=tiny(receives)))


def _time_one_pair(engine: Any, nbytes: int, copies: tuple[Any, Any], repeats: int,
                   latency_writes: int) -> dict[str, float]:
    big, tiny = copies
    big()  # warm-up: first touch, lazy peer mappings
    timer = engine.timer()
    timer.start()
    for _ in range(repeats):
        big()
    seconds = timer.stop() / repeats
    tiny()
    timer.start()
    for _ in range(latency_writes):
        tiny()
    latency = timer.stop() / latency_writes
    return {"gbps": round(nbytes / seconds / 1e9, 3), "latency_us": round(latency * 1e6, 3)}


def link_kind(writer_uuid: str | None, owner_uuid: str | None,
              links: dict[str, dict] | None) -> str:
    """``same-gpu``, ``nvlink``, ``pcie`` or ``unknown`` for two ranks' GPUs, from the
    node's ``nvidia-smi topo -m`` links keyed ``'<uuid>|<uuid>'``."""
    if writer_uuid is None or owner_uuid is None:
        return "unknown"
    if writer_uuid == owner_uuid:
        return "same-gpu"
    link = (links or {}).get(f"{writer_uuid}|{owner_uuid}")
    return link["kind"] if link else "unknown"


def judge_rows(rows: list[dict[str, Any]], kinds: dict[tuple[int, int], str]) -> None:
    """Mark each GPU row with its link kind, the floor it is held to and ``slow`` when
    it is correct but below that floor (``kinds`` maps (writer, owner) to a link kind).
    Rows measured on a fallback path (relay, host-staged) get no floor."""
    for row in rows:
        kind = kinds.get((row["writer"], row["owner"]))
        if kind is None:
            continue
        row["link"] = kind
        if row.get("path", "direct") != "direct":
            continue  # a relay or host-staged fallback: the link's floor does not apply
        floor = EXPECTED_MIN_GBPS[kind]
        row["expected_min_gbps"] = floor
        row["slow"] = "gbps" in row and row["gbps"] < floor
