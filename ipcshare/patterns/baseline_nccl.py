"""The NCCL baseline: torch.distributed all_gather_into_tensor / batched isend-irecv on
device tensors, same sizes, same seeded data, same checks, timed the way nccl-tests
times (barrier, synchronize, host clock around back-to-back calls, synchronize)."""

from __future__ import annotations

import copy
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from ..consensus import collective_step
from ..errors import ConfigError
from ..topology import World, mpi
from .base import SizePlan
from .rotation import warmup_iterations
from .seeding import count_wrong, poison, seeded_bytes
from .timing import slowest_rank_samples

__all__ = ["NcclBaseline"]


def _free_port() -> int:
    # Port 0: the kernel picks a free one. It is released before torch binds it, so
    # another process could take it in between; a collision fails init loudly.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


class NcclBaseline:
    """Times the NCCL equivalent of a pattern through torch.distributed.

    Collective over ``world``: creates a NCCL process group with the MPI ranks and sizes
    (TCP rendezvous at a port rank 0 picks). ``device`` is this rank's CUDA ordinal, the
    one the ipcshare backend bound. ``close()`` destroys the process group.

    Raises:
        ConfigError: torch is missing or has no CUDA/NCCL, no device given, or two
            ranks share a GPU (NCCL needs one GPU per rank); on every rank.
    """

    name = "nccl"
    captures_graphs = True  # all-gather through torch.cuda.graph; see measure()
    # --after-kernel: a one-element add on the current stream before every operation
    # (the driver sets it; a kernel as small as the one it launches before ours).
    after_kernel = False

    def __init__(self, world: World, op: str, device: Any) -> None:
        self.world = world
        self.op = op
        self._group_ready = False
        # NVLink SHARP (multicast) can take shared GPUs out of service: never by default.
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        with collective_step(world, "nccl baseline setup"):
            if op not in ("allgather", "ring"):
                raise ConfigError(f"the nccl baseline knows allgather and ring, not {op!r}")
            if device is None:
                raise ConfigError("--baseline nccl needs a GPU backend (cuda-ipc or cuda-vmm)")
            try:
                import torch
                import torch.distributed as dist
            except ImportError as exc:
                raise ConfigError(
                    f"--baseline nccl needs PyTorch with CUDA, and torch is not importable "
                    f"({exc}); use --baseline mpi") from None
            if not torch.cuda.is_available():
                raise ConfigError("--baseline nccl needs PyTorch with CUDA; this torch sees no "
                                  "CUDA device (a CPU-only build?)")
            if not dist.is_available() or not dist.is_nccl_available():
                raise ConfigError("--baseline nccl needs torch.distributed with NCCL; this "
                                  "torch build has none")
            ordinal = device.index if isinstance(device, torch.device) else int(device)
            self.device = torch.device("cuda", ordinal)
            torch.cuda.set_device(self.device)
            # Same CUDA_VISIBLE_DEVICES, same ordinals: the driver's UUID names the GPU.
            from .. import cuda_driver

            uuid = cuda_driver.format_uuid(cuda_driver.device_uuid(ordinal))
        places = world.comm.allgather((world.hostname, uuid))
        with collective_step(world, "nccl baseline setup"):
            first = {}
            for rank, place in enumerate(places):
                if place in first:
                    raise ConfigError(
                        f"NCCL needs one GPU per rank, but {world.where(first[place])} and "
                        f"{world.where(rank)} share GPU {place[1]}; "
                        "use --baseline mpi, or one rank per GPU")
                first[place] = rank
        self._torch, self._dist = torch, dist
        raw_version = torch.cuda.nccl.version()
        nccl_version = (".".join(str(part) for part in raw_version)
                        if isinstance(raw_version, tuple) else str(raw_version))
        self.version = f"NCCL {nccl_version} (torch {torch.__version__.split('+')[0]})"
        address = None
        if world.rank == 0:
            host = "127.0.0.1" if world.node_count == 1 else socket.gethostname()
            address = (host, _free_port())
        host, port = world.comm.bcast(address, root=0)
        with collective_step(world, "nccl process group init"):
            dist.init_process_group(
                backend="nccl", init_method=f"tcp://{host}:{port}", rank=world.rank,
                world_size=world.size, device_id=self.device)
            self._group_ready = True
        # The first collective builds NCCL's communicators; keep it out of every timing.
        dist.barrier(device_ids=[ordinal])
        torch.cuda.synchronize(self.device)

    def for_op(self, op: str) -> NcclBaseline:
        """This baseline's process group timing ``op`` instead; the view does not own the
        group (its ``close()`` does nothing), so one group serves a whole suite.

        Raises:
            ConfigError: an op NCCL has no equivalent for here.
        """
        if op not in ("allgather", "ring"):
            raise ConfigError(f"the nccl baseline knows allgather and ring, not {op!r}")
        view = copy.copy(self)
        view.op = op
        view._group_ready = False
        return view

    def measure(self, plan: SizePlan, mode: str, *, iters: int, warmup: int, checks: int,
                buffers: int = 1, graph: bool = False) -> tuple[float, int]:
        """Collective, nccl-tests timing: (seconds per operation averaged over ranks,
        wrong elements summed over ranks). ``buffers`` > 1 cycles the operations over
        that many disjoint send/receive tensor pairs. With ``graph``, the checks replay
        a captured operation, and the ``iters`` timed operations are captured in one
        CUDA graph, launched once to warm it and once timed."""
        torch, dist = self._torch, self._dist
        comm, n = self.world.comm, self.world.size
        operations, eager, wrong = self._checked_operations(plan, mode, checks, buffers, graph)
        for iteration in range(warmup_iterations(warmup, buffers)):
            operations[iteration % buffers]()
        sequence = [eager[i % buffers] for i in range(iters)]
        if graph:
            whole = self._capture(sequence)
            whole.replay()  # the first launch uploads the graph
            sequence = [whole.replay]
        torch.cuda.synchronize(self.device)
        dist.barrier(device_ids=[self.device.index])
        torch.cuda.synchronize(self.device)
        start = time.perf_counter()
        for operation in sequence:
            operation()
        torch.cuda.synchronize(self.device)
        seconds = (time.perf_counter() - start) / iters
        return comm.allreduce(seconds, op=mpi().SUM) / n, wrong

    def measure_latency(self, plan: SizePlan, mode: str, *, iters: int, warmup: int,
                        checks: int, buffers: int = 1,
                        graph: bool = False) -> tuple[list[float], int]:
        """Collective, latency timing: (seconds of each of ``iters`` samples of one
        operation, timed by CUDA events on the current stream, which NCCL's work joins;
        each sample the slowest rank's; wrong elements summed over ranks). With
        ``graph``, each sample is one replay of a graph of one operation."""
        torch = self._torch
        comm = self.world.comm
        operations, _eager, wrong = self._checked_operations(plan, mode, checks, buffers, graph)
        for iteration in range(warmup_iterations(warmup, buffers)):
            operations[iteration % buffers]()
        stream = torch.cuda.current_stream(self.device)
        begin = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        samples = []
        for iteration in range(iters):
            operation = operations[iteration % buffers]
            torch.cuda.synchronize(self.device)
            comm.Barrier()
            begin.record(stream)
            operation()
            end.record(stream)
            end.synchronize()
            samples.append(begin.elapsed_time(end) / 1e3)  # milliseconds
        return slowest_rank_samples(comm, samples), wrong

    def _capture(self, operations: list[Callable[[], None]]) -> Any:
        """A ``torch.cuda.CUDAGraph`` of ``operations`` in order (replayed on the current
        stream). NCCL's communicator exists already: capture needs no set-up call."""
        torch = self._torch
        captured = torch.cuda.CUDAGraph()
        torch.cuda.synchronize(self.device)
        # Thread-local: NCCL's watchdog thread may query events while we capture.
        with torch.cuda.graph(captured, capture_error_mode="thread_local"):
            for operation in operations:
                operation()
        torch.cuda.synchronize(self.device)
        return captured

    def _checked_operations(self, plan: SizePlan, mode: str, checks: int, buffers: int,
                            graph: bool = False
                            ) -> tuple[list[Callable[[], None]], list[Callable[[], None]], int]:
        """(what to run: one operation per tensor pair, or with ``graph`` a replay of
        its one-operation graph; the eager operations; the wrong elements of ``checks``
        verified runs, iteration i on pair i mod ``buffers``, summed over ranks)."""
        torch, dist = self._torch, self._dist
        n, me = self.world.size, self.world.rank
        block = plan.block_bytes
        pairs = [(torch.empty(block, dtype=torch.uint8, device=self.device),
                  torch.empty(block * n, dtype=torch.uint8, device=self.device))
                 for _ in range(buffers)]
        eager = [self._operation(send, recv, block, mode) for send, recv in pairs]
        operations = eager
        if graph:
            for operation in eager:  # warm outside capture, as torch's graph docs ask
                operation()
            operations = [self._capture([operation]).replay for operation in eager]
        wrong = 0
        for iteration in range(checks):
            send, recv = pairs[iteration % buffers]
            recv.copy_(torch.from_numpy(poison(recv.numel())))
            data = torch.from_numpy(seeded_bytes(iteration, me, block).copy())
            if mode == "in-place" or self.op == "ring":
                recv[me * block:(me + 1) * block].copy_(data)
            else:
                send.copy_(data)
            torch.cuda.synchronize(self.device)
            dist.barrier(device_ids=[self.device.index])
            operations[iteration % buffers]()
            torch.cuda.synchronize(self.device)
            got = recv.cpu().numpy()
            for rank in range(n):
                wrong += count_wrong(got[rank * block:(rank + 1) * block],
                                     seeded_bytes(iteration, rank, block), plan.element_size)
        return operations, eager, self.world.comm.allreduce(wrong, op=mpi().SUM)

    def _operation(self, send: Any, recv: Any, block: int, mode: str) -> Callable[[], None]:
        operation = self._collective(send, recv, block, mode)
        if not self.after_kernel:
            return operation
        scratch = self._torch.zeros(1, device=self.device)

        def after_a_kernel() -> None:
            scratch.add_(1)
            operation()
        return after_a_kernel

    def _collective(self, send: Any, recv: Any, block: int, mode: str) -> Callable[[], None]:
        dist = self._dist
        n, me = self.world.size, self.world.rank
        if self.op == "allgather":
            source = recv[me * block:(me + 1) * block] if mode == "in-place" else send

            def allgather() -> None:
                dist.all_gather_into_tensor(recv, source)
            return allgather
        views = [recv[r * block:(r + 1) * block] for r in range(n)]
        if n == 1:
            return lambda: views[0].copy_(views[0])
        nxt, prev = (me + 1) % n, (me - 1) % n
        steps = []
        for step in range(n - 1):
            out, into = (me - step) % n, (me - step - 1) % n
            steps.append([dist.P2POp(dist.isend, views[out], nxt),
                          dist.P2POp(dist.irecv, views[into], prev)])

        def ring() -> None:
            for ops in steps:
                for request in dist.batch_isend_irecv(ops):
                    request.wait()
        return ring

    def close(self) -> None:
        """Destroy the process group (idempotent; collective like its creation)."""
        if self._group_ready:
            self._group_ready = False
            self._dist.destroy_process_group()

    def __enter__(self) -> NcclBaseline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
