"""The nccl baseline: NCCL called directly through nccl4py (NVIDIA's Python binding), no
torch.distributed in between. Each size is timed twice, on plain device buffers and on
buffers from ncclMemAlloc registered as symmetric windows (NCCL >= 2.27 then runs its
symmetric kernels; multicast stays off), and the faster is reported with its path."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..liveness.consensus import collective_step
from ..runtime.errors import ConfigError
from ..runtime.nvlink_multicast import keep_multicast_off
from ..topology.world import World
from .base import SizePlan
from .baseline_gpu import (
    REDUCTION_OPS,
    GpuBaseline,
    check_one_gpu_per_rank,
    import_torch_cuda,
)

__all__ = ["Nccl4pyBaseline"]

_OPS = ("allgather", "ring", *REDUCTION_OPS)
_FLAG = "--baseline nccl"
# ncclCommWindowRegister with NCCL_WIN_COLL_SYMMETRIC: NCCL's symmetric kernels.
_SYMMETRIC_SINCE = (2, 27)
_PROBE_BYTES = 1 << 16


class Nccl4pyBaseline(GpuBaseline):
    """Times the NCCL equivalent of a pattern through nccl4py's ``Communicator``.

    Collective over ``world``: rank 0 makes an NCCL unique id, MPI broadcasts it, every
    rank joins the communicator on its GPU (``device``: the CUDA ordinal the ipcshare
    backend bound; None on the host backend). Buffers are torch tensors; every call goes
    through nccl4py's Python API, as a user's would (a few µs each, eager; nothing in
    a CUDA graph). ``close()`` destroys the communicator.

    Raises:
        ConfigError: an op it cannot time, nccl4py or torch with CUDA missing, no
            device, or two ranks on one GPU; on every rank.
    """

    name = "nccl"
    label = "NCCL called directly (nccl4py)"
    path_column = True

    def __init__(self, world: World, case: Any, device: int | None) -> None:
        keep_multicast_off()
        self._comm: Any = None
        self._windows: list[Any] = []
        with collective_step(world, "nccl baseline setup"):
            type(self).check_case(case)
            try:
                import nccl.core as nccl
            except ImportError as exc:
                raise ConfigError(
                    f"{_FLAG} calls NCCL through nccl4py, which is not importable here "
                    f"({exc}); install nccl4py (with cuda-core and an NCCL library), or use "
                    "--baseline torch (NCCL through torch.distributed)") from None
            torch = import_torch_cuda(_FLAG)
            if device is None:
                raise ConfigError(f"{_FLAG} needs a GPU backend (cuda-ipc or cuda-vmm), not "
                                  "host; use --baseline mpi")
            super().__init__(world, case, torch, int(device))
        check_one_gpu_per_rank(world, self.device.index, _FLAG)
        self._nccl = nccl
        unique_id = None
        with collective_step(world, "nccl unique id"):
            if world.rank == 0:
                unique_id = nccl.get_unique_id()
        unique_id = world.comm.bcast(unique_id, root=0)  # nccl4py's UniqueId pickles
        with collective_step(world, "nccl communicator init"):
            self._comm = nccl.Communicator.init(world.size, world.rank, unique_id)
        versions = nccl.get_version()
        library = versions.libnccl
        self.version = (f"NCCL {library.version if library else 'unknown'} "
                        f"(nccl4py {versions.nccl4py})")
        release = tuple(library.version.release[:2]) if library else (0, 0)
        self._symmetric = self._symmetric_windows_work(release)
        if not self._symmetric:
            self.version += "; symmetric windows unavailable, plain buffers only"

    @classmethod
    def check_case(cls, case: Any) -> None:
        if case.name not in _OPS:
            raise ConfigError(f"{_FLAG} times {', '.join(_OPS)}, not {case.name}")

    def _symmetric_windows_work(self, release: tuple[int, ...]) -> bool:
        """Collective: whether every rank registers a symmetric window (NCCL fills the
        handle only where it supports them), tried once on a small buffer."""
        works = release >= _SYMMETRIC_SINCE
        if works:
            try:
                probe = self._allocate("symmetric", _PROBE_BYTES)
                works = all(window.handle != 0 for window in self._windows)
                self._torch.cuda.synchronize(self.device)
                del probe
            except Exception:  # NCCL refused: time plain buffers, and say so
                works = False
            finally:
                self._release("symmetric")
        return all(self.world.comm.allgather(works))

    def _paths(self, mode: str) -> tuple[str | None, ...]:
        return ("plain", "symmetric") if self._symmetric else ("plain",)

    def _allocate(self, path: str | None, nbytes: int) -> Any:
        torch = self._torch
        if path == "plain":
            return torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        tensor = self._nccl.torch.empty(nbytes, dtype=torch.uint8, device=self.device.index)
        # Collective; the same sizes in the same order on every rank, so each buffer sits
        # at the same offset of its window everywhere (what symmetric kernels need).
        self._windows.append(self._comm.register_window(
            tensor, self._nccl.WindowFlag.COLL_SYMMETRIC))
        return tensor

    def _release(self, path: str | None) -> None:
        # Deregister before the memory goes (ncclMemFree when the tensor is dropped); in
        # place, as a view from for_pattern shares the list with its baseline.
        while self._windows:
            self._windows.pop().close()

    def _bind(self, path: str | None, inputs: Any, output: Any, plan: SizePlan,
              mode: str) -> Callable[[], None]:
        comm, stream = self._comm, self._stream.cuda_stream
        if self.op == "allgather":
            return lambda: comm.allgather(inputs, output, stream=stream)
        if self.op == "ring":
            return self._ring(output, plan.block_bytes)
        reduce_op = getattr(self._nccl.NcclRedOp, self.case.op.upper())
        if self.op == "allreduce":
            return lambda: comm.allreduce(inputs, output, reduce_op, stream=stream)
        return lambda: comm.reduce_scatter(inputs, output, reduce_op, stream=stream)

    def _ring(self, output: Any, block: int) -> Callable[[], None]:
        """n - 1 steps, each a grouped send to the next rank and receive from the
        previous one (NCCL orders the steps on the stream)."""
        nccl, comm, stream = self._nccl, self._comm, self._stream.cuda_stream
        n, me = self.world.size, self.world.rank
        views = [output[r * block:(r + 1) * block] for r in range(n)]
        if n == 1:
            return lambda: views[0].copy_(views[0])
        nxt, prev = (me + 1) % n, (me - 1) % n
        steps = [(views[(me - step) % n], views[(me - step - 1) % n]) for step in range(n - 1)]

        def ring() -> None:
            for outgoing, incoming in steps:
                nccl.group_start()
                comm.send(outgoing, nxt, stream=stream)
                comm.recv(incoming, prev, stream=stream)
                nccl.group_end()
        return ring

    def close(self) -> None:
        """Destroy the communicator (idempotent; collective like its creation; a view
        from ``for_pattern`` owns nothing)."""
        if self._owner and self._comm is not None:
            comm, self._comm = self._comm, None
            self._torch.cuda.synchronize(self.device)
            self._release(None)
            comm.destroy()
