"""torch.distributed's NCCL process group over MPI ranks, for the torch baseline and
``ipcshare vs-torch``: its rendezvous is a TCPStore that rank 0 opens on a port the
kernel picks while binding it (port 0), announced to the other ranks over MPI. Picking a
free port, releasing it and letting torch bind it later races every other process of the
node for that port: on a 4-GPU node, `ipcshare vs-torch` lost that race
(EADDRINUSE) on 2026-11-27."""

from __future__ import annotations

from typing import Any

from ..runtime.errors import IpcShareError

__all__ = ["start_nccl_process_group"]


def start_nccl_process_group(dist: Any, comm: Any, *, rank: int, size: int, device: Any,
                             host: str = "127.0.0.1", timeout: Any = None) -> None:
    """Collective over ``comm`` (mpi4py): ``dist.init_process_group("nccl")`` with rank
    ``rank`` of ``size`` on ``device`` (a torch.device), meeting at ``host`` (rank 0's
    address as the others reach it); ``timeout`` (a datetime.timedelta) bounds the
    store's waits, torch's default when None.

    Raises:
        IpcShareError: rank 0 could not open the store (on every rank; rank 0 names why).
        Whatever torch raises on a rank that fails to join or init.
    """
    store = port = failure = None
    waits = {} if timeout is None else {"timeout": timeout}
    if rank == 0:
        try:
            # Not waiting for the others: they learn the port only after this returns.
            store = dist.TCPStore(host, 0, size, is_master=True, wait_for_workers=False,
                                  **waits)
            port = store.port
        except Exception as exc:  # every rank must still reach the bcast below
            failure = f"{type(exc).__name__}: {exc}"
    port, failure = comm.bcast((port, failure), root=0)
    if port is None:
        raise IpcShareError(f"rank 0 could not open torch.distributed's rendezvous store "
                            f"at {host}: {failure}")
    if rank != 0:
        store = dist.TCPStore(host, port, size, is_master=False, **waits)
    dist.init_process_group("nccl", store=store, rank=rank, world_size=size,
                            device_id=device)
