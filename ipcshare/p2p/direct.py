"""Ring and all-gather in one process over every GPU (P2P direct): each GPU's stream pushes
its blocks straight into its peers' memory, either with the ``p2p_push`` kernel (threads
storing through peer pointers) or with ``cuMemcpyPeerAsync`` (the copy engine).

Sizes, layouts, seeds and bandwidth formulas are those of ``ipcshare ring`` / ``allgather``
(``patterns.ring.Ring``, ``patterns.allgather.AllGather``), with GPU g in the place of rank
g, so the rows compare one to one with the IPC runs. Ordering between GPUs is by events:
a ring step waits for the previous GPU's step, and every iteration starts when every GPU
finished the previous one, as a collective would.
"""

from __future__ import annotations

import time
from typing import Any

from ..patterns.allgather import AllGather
from ..patterns.base import Pattern, SizePlan
from ..patterns.results import Measurement
from ..patterns.ring import Ring
from ..patterns.seeding import POISON_BYTE, count_wrong, seeded_bytes
from ..runtime.cuda_driver import check, driver
from .gpus import GpuSet, PushArgs

__all__ = ["OPS", "MODES", "DirectBuffers", "measure_direct", "events_needed", "pattern_of"]

OPS = ("ring", "allgather")
# kernel: p2p_push dereferences peer pointers; copy: cuMemcpyPeerAsync on the copy engine.
MODES = ("kernel", "copy")
ELEMENT_SIZE = 4  # float32, the IPC runs' default datatype


def pattern_of(op: str) -> Pattern:
    """The pattern whose sizes and bandwidth formula ``op`` follows."""
    return Ring() if op == "ring" else AllGather()


def events_needed(count: int) -> int:
    """Events per GPU: one per ring step (1 .. count-1) and one marking an iteration's end."""
    return count + 1


class DirectBuffers:
    """Per GPU: ``inputs`` (all-gather's send block) and ``outputs`` (``count`` blocks:
    the ring's slots, the all-gather's gathered output), sized for ``block_bytes``."""

    def __init__(self, gpus: GpuSet, block_bytes: int) -> None:
        self.block_bytes = block_bytes
        self.inputs = [gpus.allocate(g, block_bytes) for g in range(gpus.count)]
        self.outputs = [gpus.allocate(g, block_bytes * gpus.count) for g in range(gpus.count)]


def _wait(gpus: GpuSet, gpu: int, event: Any) -> None:
    check("cuStreamWaitEvent", driver.cuStreamWaitEvent(gpus.streams[gpu], event, 0))


def _record(gpus: GpuSet, gpu: int, event: Any) -> None:
    check("cuEventRecord", driver.cuEventRecord(event, gpus.streams[gpu]))


def _copy_peer(gpus: GpuSet, gpu: int, dst_gpu: int, dst: int, src: int, nbytes: int) -> None:
    check("cuMemcpyPeerAsync", driver.cuMemcpyPeerAsync(
        dst, gpus.contexts[dst_gpu].handle, src, gpus.contexts[gpu].handle, nbytes,
        gpus.streams[gpu]))


def _start_iteration(gpus: GpuSet, gpu: int) -> None:
    done = gpus.count
    for other in range(gpus.count):
        if other != gpu:
            _wait(gpus, gpu, gpus.events[other][done])


def enqueue_ring(gpus: GpuSet, buffers: DirectBuffers, block: int, mode: str,
                 args: PushArgs) -> None:
    """One ring pass: at step s GPU g forwards block (g - s + 1) mod n into GPU g+1's slot
    of that block, after GPU g-1 delivered it at step s-1."""
    n = gpus.count
    for gpu in range(n):
        gpus.activate(gpu)
        _start_iteration(gpus, gpu)
    for step in range(1, n):
        for gpu in range(n):
            gpus.activate(gpu)
            target, offset = (gpu + 1) % n, ((gpu - step + 1) % n) * block
            if step > 1:
                _wait(gpus, gpu, gpus.events[(gpu - 1) % n][step - 1])
            if mode == "kernel":
                args.targets[0] = buffers.outputs[target] + offset
                args.source = buffers.outputs[gpu] + offset
                args.bytes = block
                gpus.push(gpu, args, 1)
            else:
                _copy_peer(gpus, gpu, target, buffers.outputs[target] + offset,
                           buffers.outputs[gpu] + offset, block)
            _record(gpus, gpu, gpus.events[gpu][step])
    for gpu in range(n):
        gpus.activate(gpu)
        _record(gpus, gpu, gpus.events[gpu][n])


def enqueue_allgather(gpus: GpuSet, buffers: DirectBuffers, block: int, mode: str,
                      args: PushArgs) -> None:
    """One all-gather: GPU g pushes its input into slot g of every GPU's output (its own
    included), the copies staggered so that GPUs start on different peers."""
    n = gpus.count
    for gpu in range(n):
        gpus.activate(gpu)
        _start_iteration(gpus, gpu)
        if mode == "kernel":
            for target in range(n):
                args.targets[target] = buffers.outputs[target] + gpu * block
            args.source = buffers.inputs[gpu]
            args.bytes = block
            gpus.push(gpu, args, n)
        else:
            for step in range(n):
                target = (gpu + step) % n
                _copy_peer(gpus, gpu, target, buffers.outputs[target] + gpu * block,
                           buffers.inputs[gpu], block)
        _record(gpus, gpu, gpus.events[gpu][n])


def _prepare(gpus: GpuSet, buffers: DirectBuffers, op: str, block: int, iteration: int) -> None:
    for gpu in range(gpus.count):
        gpus.fill(gpu, buffers.outputs[gpu], POISON_BYTE, block * gpus.count)
        seed = seeded_bytes(iteration, gpu, block)
        if op == "ring":
            gpus.upload(gpu, buffers.outputs[gpu] + gpu * block, seed)
        else:
            gpus.upload(gpu, buffers.inputs[gpu], seed)


def _wrong(gpus: GpuSet, buffers: DirectBuffers, block: int, iteration: int) -> int:
    """Mismatched elements over every GPU: each must hold every GPU's seeded block."""
    wrong = 0
    for gpu in range(gpus.count):
        got = gpus.download(gpu, buffers.outputs[gpu], block * gpus.count)
        for source in range(gpus.count):
            wrong += count_wrong(got[source * block:(source + 1) * block],
                                 seeded_bytes(iteration, source, block), ELEMENT_SIZE)
    return wrong


def measure_direct(gpus: GpuSet, buffers: DirectBuffers, op: str, mode: str, plan: SizePlan,
                   *, iters: int, warmup: int, checks: int) -> Measurement:
    """Verify ``checks`` iterations bit-exact, then time ``iters`` back-to-back ones
    (host wall clock from idle GPUs to idle GPUs, so the host's enqueueing counts, as
    it does for any one process driving several GPUs).

    Raises:
        CudaError: a launch or copy failed.
    """
    enqueue = enqueue_ring if op == "ring" else enqueue_allgather
    block, args = plan.block_bytes, PushArgs()
    wrong = 0
    for iteration in range(checks):
        _prepare(gpus, buffers, op, block, iteration)
        enqueue(gpus, buffers, block, mode, args)
        gpus.synchronize()
        wrong += _wrong(gpus, buffers, block, iteration)
    for _ in range(warmup):
        enqueue(gpus, buffers, block, mode, args)
    gpus.synchronize()
    started = time.perf_counter()
    for _ in range(iters):
        enqueue(gpus, buffers, block, mode, args)
    gpus.synchronize()
    seconds = (time.perf_counter() - started) / max(iters, 1)
    algbw, busbw = pattern_of(op).bandwidth(plan, seconds, gpus.count)
    return Measurement(time_us=seconds * 1e6, algbw=algbw, busbw=busbw, wrong=wrong)
