"""The nccl baseline: NCCL called directly through nccl4py (NVIDIA's Python binding), no
torch.distributed in between. Each size is timed twice, on plain device buffers and on
buffers from ncclMemAlloc registered as symmetric windows (NCCL >= 2.27 then runs its
symmetric kernels; multicast stays off), and the faster is reported with its path.

All-to-all: ncclAlltoAll for even splits, NCCL's all-to-all-v (a ncclSend and a ncclRecv
per peer inside one group, as torch's all_to_all_single with splits does) otherwise, the
counts from the case's split matrix. In NCCL 2.28 symmetric windows change nothing for
send / recv, nor for ncclAlltoAll on an ordinary communicator (it becomes grouped send /
recv that never looks at windows): they matter only to its copy-engine all-to-all, which
runs where both buffers are symmetric windows of a communicator made with
NCCL_CTA_POLICY_ZERO, on one node. So the symmetric path of an even all-to-all is that
one (windows registered on a zero-CTA communicator split from the first), and uneven
splits are timed on plain buffers only."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..liveness.consensus import collective_step
from ..patterns.base import SizePlan
from ..runtime.errors import ConfigError
from ..runtime.nvlink_multicast import keep_multicast_off
from ..topology.world import World
from .gpu import (
    ALL_TO_ALL,
    REDUCTION_OPS,
    GpuBaseline,
    all_to_all_splits,
    check_one_gpu_per_rank,
    import_torch_cuda,
)

__all__ = ["Nccl4pyBaseline"]

_OPS = ("allgather", "ring", *REDUCTION_OPS, ALL_TO_ALL)
_FLAG = "--baseline nccl"
# ncclCommWindowRegister with NCCL_WIN_COLL_SYMMETRIC: NCCL's symmetric kernels.
_SYMMETRIC_SINCE = (2, 27)
# ncclAlltoAll, and its copy-engine path on symmetric windows of a zero-CTA communicator.
_ALL_TO_ALL_SINCE = (2, 28)
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
        # The zero-CTA communicator of the copy-engine all-to-all, made at its first use
        # ("comm"), and whether its windows register ("works"): a dict, so a view from
        # for_pattern shares it with its baseline, which alone destroys it.
        self._zero_cta: dict[str, Any] = {}
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
        self._release_number = release
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
        works = release >= _SYMMETRIC_SINCE and self._a_window_registers()
        return all(self.world.comm.allgather(works))

    def _a_window_registers(self, before: Callable[[], None] | None = None) -> bool:
        """Whether this rank registers a symmetric window on a small buffer, after
        ``before`` (NCCL fills the handle only where it supports them; an error is a no)."""
        try:
            if before is not None:
                before()
            probe = self._allocate("symmetric", _PROBE_BYTES)
            works = all(window.handle != 0 for window in self._windows)
            self._torch.cuda.synchronize(self.device)
            del probe
        except Exception:  # NCCL refused: plain buffers, and the version says so
            works = False
        finally:
            self._release("symmetric")
        return works

    def _check_plan(self, plan: SizePlan) -> None:
        if self.op == ALL_TO_ALL and self._release_number < _ALL_TO_ALL_SINCE:
            raise ConfigError(f"{_FLAG} times all-to-all with ncclAlltoAll and grouped "
                              f"send / recv: it needs NCCL 2.28 or later, not "
                              f"{self.version}; use --baseline torch")

    def _paths(self, mode: str) -> tuple[str | None, ...]:
        if self.op == ALL_TO_ALL:
            even = self.case.splits == "even"
            return ("plain", "symmetric") if even and self._copy_engine_works() else ("plain",)
        return ("plain", "symmetric") if self._symmetric else ("plain",)

    def _copy_engine_works(self) -> bool:
        """Collective, once: whether a communicator with NCCL_CTA_POLICY_ZERO splits from
        ours and registers symmetric windows on every rank (where it does, ncclAlltoAll on
        two of its windows runs on the copy engines). Said in the version otherwise."""
        state = self._zero_cta
        if "works" not in state:
            nccl = self._nccl

            def split_zero_cta() -> None:
                state["comm"] = self._comm.split(
                    0, self.world.rank, nccl.NCCLConfig(cta_policy=nccl.CTAPolicy.ZERO))
            works = (self._symmetric and self._release_number >= _ALL_TO_ALL_SINCE
                     and self._a_window_registers(split_zero_cta))
            state["works"] = all(self.world.comm.allgather(works))
            self.version += ("; all-to-all's symmetric path: windows of a zero-CTA "
                             "communicator (NCCL's copy-engine all-to-all)" if state["works"]
                             else "; no copy-engine all-to-all (a zero-CTA communicator or "
                             "its windows refused), plain buffers only")
        return bool(state["works"])

    def _allocate(self, path: str | None, nbytes: int) -> Any:
        torch = self._torch
        if path == "plain":
            return torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        tensor = self._nccl.torch.empty(nbytes, dtype=torch.uint8, device=self.device.index)
        # All-to-all's symmetric path runs on the zero-CTA communicator (once made): its
        # windows. The first probe, before it exists, registers on ours.
        comm = self._zero_cta.get("comm", self._comm) if self.op == ALL_TO_ALL else self._comm
        # Collective; the same sizes in the same order on every rank, so each buffer sits
        # at the same offset of its window everywhere (what symmetric kernels need).
        self._windows.append(comm.register_window(tensor, self._nccl.WindowFlag.COLL_SYMMETRIC))
        return tensor

    def _release(self, path: str | None) -> None:
        # Deregister before the memory goes (ncclMemFree when the tensor is dropped); in
        # place, as a view from for_pattern shares the list with its baseline.
        while self._windows:
            self._windows.pop().close()

    def _bind(self, path: str | None, inputs: Any, output: Any, plan: SizePlan,
              mode: str) -> Callable[[], None]:
        comm, stream = self._comm, self._stream.cuda_stream
        if self.op == ALL_TO_ALL:
            return self._all_to_all(path, inputs, output, plan)
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

    def _all_to_all(self, path: str | None, inputs: Any, output: Any,
                     plan: SizePlan) -> Callable[[], None]:
        """ncclAlltoAll for even splits (on the zero-CTA communicator for the symmetric
        path); otherwise NCCL's all-to-all-v: in one group, a ncclSend of each rank's bytes
        and a ncclRecv of what each rank sends here, pairs with no bytes left out (both
        ends read the count from the same matrix). In place, the array is copied aside
        first (``_all_to_all_source``)."""
        nccl, stream = self._nccl, self._stream.cuda_stream
        source, copy_aside = self._all_to_all_source(path, inputs, output)
        splits = all_to_all_splits(self.case, plan, self.world.size, self.world.rank)
        if splits.even:
            comm = self._zero_cta["comm"] if path == "symmetric" else self._comm

            def run() -> None:
                comm.alltoall(source, output, stream=stream)
        else:
            comm = self._comm
            sends = [(source[start:start + nbytes], peer) for peer, (start, nbytes)
                     in enumerate(zip(splits.send_offsets, splits.send, strict=True)) if nbytes]
            receives = [(output[start:start + nbytes], peer) for peer, (start, nbytes)
                        in enumerate(zip(splits.receive_offsets, splits.receive, strict=True))
                        if nbytes]

            def run() -> None:
                nccl.group_start()
                for view, peer in sends:
                    comm.send(view, peer, stream=stream)
                for view, peer in receives:
                    comm.recv(view, peer, stream=stream)
                nccl.group_end()
        if copy_aside is None:
            return run

        def copy_aside_then_all_to_all() -> None:
            copy_aside()
            run()
        return copy_aside_then_all_to_all

    def close(self) -> None:
        """Destroy the communicators (idempotent; collective like their creation; a view
        from ``for_pattern`` owns nothing)."""
        if self._owner and self._comm is not None:
            comm, self._comm = self._comm, None
            self._torch.cuda.synchronize(self.device)
            self._release(None)
            zero_cta = self._zero_cta.pop("comm", None)
            if zero_cta is not None:
                zero_cta.destroy()
            comm.destroy()
