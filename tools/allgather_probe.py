"""Where does a GPU all-gather's time go? Times the parts of the copy-engine all-gather
(barriers alone, copies alone, both) and variants of them, back to back on every rank,
reporting the slowest rank's busbw. A tuning tool for the GPU nodes, not a benchmark:
figures that go into docs/BENCHMARKS.md come from `ipcshare allgather` / `ipcshare bench`.

    mpiexec -n 4 python3 tools/allgather_probe.py [--sizes 1M,64M,256M] [--iters 20]

Variants (each is one operation, repeated ``--iters`` times after ``--warmup``):
  full          the production copy-engine all-gather (barrier, copies, barrier)
  copies        its copies alone (no barrier; timing only, the bytes race)
  copies-1s     every copy on the engine's own stream, one after another
  batch         the copies as one cuMemcpyBatchAsync call on the engine's stream
  full-batch    barrier, batch copy, barrier
  barriers      the two stream-memop barriers alone
  kbarriers     two device_barrier kernels alone
  full-kbar     device_barrier, copies, device_barrier
  full-kbar1s   device_barrier, every copy on the engine's stream, device_barrier
  full-1s       barrier, every copy on the engine's stream, barrier
  in-place      the production all-gather, in place (no local copy)
  pairwise      no barriers: each peer's copy waits for that peer's "free" flag on its own
                lane and then raises a "landed" flag in the peer's pad; the stream waits
                for every peer's "landed" flag
  push          the push kernel
  barriers-X / full-X, X one of:
    1f          stream-memop barrier whose first write fences, the others do not
    bop         the same six operations as one cuStreamBatchMemOp
    atomic      one fence, an atomic add into each peer's counter word, one wait on ours
                (cuStreamBatchMemOp; drivers without the operation refuse it)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from cuda.bindings import driver

import ipcshare
from ipcshare.config import parse_size
from ipcshare.patterns import make_pattern
from ipcshare.patterns.allgather import allgather_busbw_factor

VARIANTS = ("full", "copies", "copies-1s", "batch", "full-batch", "barriers", "kbarriers",
            "full-kbar", "in-place", "pairwise", "pairwise-ip", "push",
            "barriers-1f", "full-1f", "barriers-bop", "full-bop", "barriers-atomic",
            "full-atomic", "full-kbar1s", "full-1s")
# Pad words of the pairwise variant (user slots, unused by the probe otherwise).
_FREE_BASE, _LANDED_BASE = 300, 400
_epochs = [0]
# Variants that are whole all-gathers (their bytes are checked; "!" marks wrong bytes).
_REAL = ("full", "in-place", "full-batch", "full-kbar", "pairwise", "pairwise-ip", "push",
         "full-1f", "full-bop", "full-atomic", "full-kbar1s", "full-1s")
# Pad words of the barrier variants: flags per rank, and one counter word for "atomic".
_FLAG_BASE, _COUNTER_SLOT = 320, 480


def _copy_pairs(window, pattern, plan, mode: str) -> list[tuple]:
    """(dst, src) buffers of the copy-engine all-gather's direct copies, in its order."""
    pairs, _sends, _receives = pattern.copies(window, plan, mode)
    return pairs


def _batch_copier(engine, jobs) -> Callable[[], None]:
    attrs = driver.CUmemcpyAttributes()
    attrs.srcAccessOrder = driver.CUmemcpySrcAccessOrder.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
    dsts = [driver.CUdeviceptr(d) for d, _, _ in jobs]
    srcs = [driver.CUdeviceptr(s) for _, s, _ in jobs]
    sizes = [b for _, _, b in jobs]
    stream = engine.stream

    def copy() -> None:
        result = driver.cuMemcpyBatchAsync(dsts, srcs, sizes, len(jobs), [attrs], [0], 1, stream)
        if result[0] != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuMemcpyBatchAsync: {result[0]}")
    return copy


def _operation(variant: str, window, plan) -> Callable[[], None]:
    pattern = make_pattern("allgather", "copy-engine")
    engine = window.engine
    if variant == "full":
        return pattern.bind(window, plan, "out-of-place")
    if variant == "in-place":
        return pattern.bind(window, plan, "in-place")
    if variant == "push":
        return make_pattern("allgather", "push").bind(window, plan, "out-of-place")
    if variant in ("pairwise", "pairwise-ip"):
        return _pairwise(window, pattern, plan,
                         "in-place" if variant == "pairwise-ip" else "out-of-place")
    if variant.startswith(("barriers-", "full-")) and variant.split("-", 1)[1] in (
            "1f", "bop", "atomic"):
        style = variant.split("-", 1)[1]
        fast = _barrier(window, style)
        if variant.startswith("barriers-"):
            return _chain(fast, fast)
        return _chain(fast, pattern_copier(window, pattern, plan), fast)
    pairs = _copy_pairs(window, pattern, plan, "out-of-place")
    jobs = [(dst.ptr, src.ptr, dst.nbytes) for dst, src in pairs]
    pairs_copier = engine.copier(pairs)
    barrier = window.barrier

    def kbarrier() -> None:
        window.device_barrier(engine.stream)

    if variant == "copies":
        return pairs_copier
    if variant == "copies-1s":
        def serial() -> None:
            for d, s, b in jobs:
                driver.cuMemcpyDtoDAsync(d, s, b, engine.stream)
        return serial
    if variant == "batch":
        return _batch_copier(engine, jobs)
    if variant == "full-batch":
        batch = _batch_copier(engine, jobs)
        return _chain(barrier, batch, barrier)
    if variant == "barriers":
        return _chain(barrier, barrier)
    if variant == "kbarriers":
        return _chain(kbarrier, kbarrier)
    if variant == "full-kbar":
        return _chain(kbarrier, pairs_copier, kbarrier)
    def serial_copies() -> None:
        for d, s, b in jobs:
            driver.cuMemcpyDtoDAsync(d, s, b, engine.stream)

    if variant == "full-kbar1s":
        return _chain(kbarrier, serial_copies, kbarrier)
    if variant == "full-1s":
        return _chain(barrier, serial_copies, barrier)
    raise SystemExit(f"unknown variant {variant!r}")


def pattern_copier(window, pattern, plan) -> Callable[[], None]:
    return window.engine.copier(_copy_pairs(window, pattern, plan, "out-of-place"))


_barrier_cache: dict = {}


def _barrier(window, style: str) -> Callable[[], None]:
    """A stream-memop barrier over the window's ranks, built as ``style`` says."""
    if style in _barrier_cache:
        return _barrier_cache[style]
    engine, me, n = window.engine, window.rank, window.world_size
    peers = [(me + step) % n for step in range(1, n)]
    own = window.signal_pad(me).ptr
    pads = [window.signal_pad(p).ptr for p in peers]
    stream, epoch = engine.stream, [0]
    # Each style counts its own epochs, so each has its own flag words.
    base = _FLAG_BASE + 16 * ("1f", "bop").index(style) if style != "atomic" else 0
    fenced = int(driver.CUstreamWriteValue_flags.CU_STREAM_WRITE_VALUE_DEFAULT)
    unfenced = int(driver.CUstreamWriteValue_flags.CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER)
    geq = int(driver.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ)
    Op = driver.CUstreamBatchMemOpType

    def write_op(address: int, value: int, flags: int):
        op = driver.CUstreamBatchMemOpParams()
        op.writeValue.operation = Op.CU_STREAM_MEM_OP_WRITE_VALUE_64
        op.writeValue.address = driver.CUdeviceptr(address)
        op.writeValue.value64 = value
        op.writeValue.flags = flags
        return op

    def wait_op(address: int, value: int, *, wide: bool = True):
        op = driver.CUstreamBatchMemOpParams()
        op.waitValue.operation = (Op.CU_STREAM_MEM_OP_WAIT_VALUE_64 if wide
                                  else Op.CU_STREAM_MEM_OP_WAIT_VALUE_32)
        op.waitValue.address = driver.CUdeviceptr(address)
        if wide:
            op.waitValue.value64 = value
        else:
            op.waitValue.value = value
        op.waitValue.flags = geq
        return op

    def checked(result) -> None:
        err = result[0] if isinstance(result, tuple) else result
        if err != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"{style} barrier: {err}")

    if style == "1f":
        def barrier() -> None:
            epoch[0] += 1
            for i, pad in enumerate(pads):
                checked(engine._write(stream, pad + 8 * (base + me), epoch[0],
                                      fenced if i == 0 else unfenced))
            for p in peers:
                checked(engine._wait(stream, own + 8 * (base + p), epoch[0], geq))
    elif style == "bop":
        def barrier() -> None:
            epoch[0] += 1
            e = epoch[0]
            ops = [write_op(pad + 8 * (base + me), e, fenced if i == 0 else unfenced)
                   for i, pad in enumerate(pads)]
            ops += [wait_op(own + 8 * (base + p), e) for p in peers]
            checked(driver.cuStreamBatchMemOp(stream, len(ops), ops, 0))
    elif style == "atomic":
        def barrier() -> None:
            epoch[0] += 1
            fence = driver.CUstreamBatchMemOpParams()
            fence.memoryBarrier.operation = Op.CU_STREAM_MEM_OP_BARRIER
            fence.memoryBarrier.flags = (
                driver.CUstreamMemoryBarrier_flags.CU_STREAM_MEMORY_BARRIER_TYPE_SYS)
            ops = [fence]
            for pad in pads:
                add = driver.CUstreamBatchMemOpParams()
                add.atomicReduction.operation = Op.CU_STREAM_MEM_OP_ATOMIC_REDUCTION
                add.atomicReduction.address = driver.CUdeviceptr(pad + 8 * _COUNTER_SLOT)
                add.atomicReduction.value = 1
                add.atomicReduction.dataType = (
                    driver.CUstreamAtomicReductionDataType.CU_STREAM_ATOMIC_REDUCTION_UNSIGNED_32)
                add.atomicReduction.reductionOp = (
                    driver.CUstreamAtomicReductionOpType.CU_STREAM_ATOMIC_REDUCTION_OP_ADD)
                ops.append(add)
            ops.append(wait_op(own + 8 * _COUNTER_SLOT, len(peers) * epoch[0], wide=False))
            checked(driver.cuStreamBatchMemOp(stream, len(ops), ops, 0))
    else:
        raise SystemExit(f"unknown barrier style {style!r}")
    _barrier_cache[style] = barrier
    return barrier


def _pairwise(window, pattern, plan, mode: str) -> Callable[[], None]:
    from ipcshare.backends.cuda_streams import new_side_lane

    engine, me, n = window.engine, window.rank, window.world_size
    pairs = _copy_pairs(window, pattern, plan, mode)
    peers = [(me + step) % n for step in range(1, n)]
    own = window.signal_pad(me).ptr
    lanes = [new_side_lane() for _ in peers]
    write, wait, stream = engine._write, engine._wait, engine.stream
    release = int(driver.CUstreamWriteValue_flags.CU_STREAM_WRITE_VALUE_DEFAULT)
    geq = int(driver.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ)
    fork = driver.cuEventCreate(int(driver.CUevent_flags.CU_EVENT_DISABLE_TIMING))[1]
    pads = {p: window.signal_pad(p).ptr for p in peers}

    def run() -> None:
        _epochs[0] += 1
        e = _epochs[0]
        for p in peers:   # our output is free: peers may write into it
            write(stream, pads[p] + 8 * (_FREE_BASE + me), e, release)
        driver.cuEventRecord(fork, stream)
        for (dst, src), p, (lane, done) in zip(pairs[:len(peers)], peers, lanes, strict=True):
            driver.cuStreamWaitEvent(lane, fork, 0)
            wait(lane, own + 8 * (_FREE_BASE + p), e, geq)
            driver.cuMemcpyDtoDAsync(dst.ptr, src.ptr, dst.nbytes, lane)
            write(lane, pads[p] + 8 * (_LANDED_BASE + me), e, release)
            driver.cuEventRecord(done, lane)
        if len(pairs) > len(peers):   # out of place: our own block, on the main stream
            dst, src = pairs[-1]
            driver.cuMemcpyDtoDAsync(dst.ptr, src.ptr, dst.nbytes, stream)
        for p in peers:
            wait(stream, own + 8 * (_LANDED_BASE + p), e, geq)
        for _lane, done in lanes:
            driver.cuStreamWaitEvent(stream, done, 0)
    return run


def _chain(*steps: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        for step in steps:
            step()
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1M,16M,64M,256M")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--backend", default="cuda-vmm")
    args = parser.parse_args(argv)
    sizes = [parse_size(text, what="--sizes") for text in args.sizes.split(",")]
    variants = args.variants.split(",")
    with ipcshare.Group(backend=args.backend) as group:
        comm, n = group.world.comm, group.size
        pattern = make_pattern("allgather", "copy-engine")
        plans = [pattern.plan(size, n, 1) for size in sizes]
        window = group.window(max(pattern.window_bytes(p, n) for p in plans))
        if group.rank == 0:
            print(f"# {n} ranks, {args.backend}, busbw GB/s of the slowest rank "
                  f"(time in us), {args.iters} iterations back to back", flush=True)
            print("variant".ljust(12) + "".join(f"{s:>24d}" for s in sizes), flush=True)
        for variant in variants:
            cells = []
            for plan in plans:
                op = _operation(variant, window, plan)
                wrong = None
                if variant in _REAL:   # a whole all-gather: check its bytes once
                    mode = "in-place" if variant in ("in-place", "pairwise-ip") else "out-of-place"
                    pattern.prepare(window, plan, mode, 7)
                    window.synchronize()
                    comm.Barrier()
                    op()
                    window.synchronize()
                    comm.Barrier()
                    wrong = comm.allreduce(pattern.check(window, plan, mode, 7))
                for _ in range(args.warmup):
                    op()
                window.synchronize()
                comm.Barrier()
                timer = window.engine.timer()
                timer.start()
                for _ in range(args.iters):
                    op()
                seconds = timer.stop() / args.iters
                seconds = comm.allreduce(seconds, op=_max())
                busbw = plan.size / seconds / 1e9 * allgather_busbw_factor(n)
                flag = "" if wrong is None else ("  " if wrong == 0 else " !")
                cells.append(f"{busbw:9.1f} ({seconds * 1e6:8.1f}){flag}")
                window.synchronize()
                comm.Barrier()
            if group.rank == 0:
                print(variant.ljust(12) + "".join(f"{c:>24s}" for c in cells), flush=True)
        window.close()
    return 0


def _max():
    from mpi4py import MPI

    return MPI.MAX


if __name__ == "__main__":
    sys.exit(main())
