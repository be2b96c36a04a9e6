"""Where does a GPU all-gather's time go? Times the parts of the copy-engine all-gather
(barriers alone, copies alone, both) and variants of them, back to back on every rank,
reporting the slowest rank's busbw. A tuning tool for the GPU nodes, not a benchmark:
figures that go into docs/BENCHMARKS.md come from `ipcshare allgather` / `ipcshare bench`.

    mpiexec -n 4 python3 tools/probes/timing/allgather_probe.py [--sizes 1M,64M,256M] [--iters 20]
            [--result FILE]

``--result FILE``: every variant's figures as a result document (docs/CLI.md), the variant
as the algorithm, ``wrong`` where its bytes were checked; exit status 3 when any was wrong.

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
  push, push-ip the push kernel, out of place and in place
  leader, leader-ip  ranks sharing a GPU: only the lowest rank on each GPU issues copies,
                every block that lives on its GPU into every rank's output (one context
                per GPU drives the GPU), between the window's barriers; leader-cc and
                leader-ip-cc put the copies on concurrent side streams, leader-batch and
                leader-ip-batch issue them as one cuMemcpyBatchAsync
  auto, auto-ip `--algo auto`, out of place and in place
  k:NAME@GxT    kernel NAME of tools/probes/timing/allgather_probe_kernels.cu (probe_push4,
                probe_push8, probe_pull2, probe_pull4) on G blocks of T threads, e.g.
                k:probe_pull4@128x512; k:push@GxT is the package's push kernel on that grid
  hybrid-P      memop barrier; the first P% of every copy on the copy engine (each on its
                own side stream) while a barrier-free kernel (probe_scatter, 128x512) on
                the engine's stream writes the rest; memop barrier
  kernel+X      an empty kernel on the engine's stream, then variant X (does user work
                on the stream just before an all-gather slow it?), e.g. kernel+full
  pre-copy+X    a 16-byte local copy (within our own pad) on the engine's stream, then X
  pre-memset+X  a 4-byte cuMemsetD32Async on our own pad, then X
                (e.g. kernel+pre-copy+full: does a copy-engine op between a kernel and the
                all-gather's barrier keep the copies' rate?)
  hybrid-main   as hybrid-100, but the first copy on the engine's stream (3 fresh lanes)
  full-kbarm    device_barrier, a stream write to our own pad, copies, device_barrier
                (does a memop between the kernel and the fork keep the copies' rate?)
  barriers-X / full-X, X one of:
    1f          stream-memop barrier whose first write fences, the others do not
    bop         the same six operations as one cuStreamBatchMemOp
    atomic      one fence, an atomic add into each peer's counter word, one wait on ours
                (cuStreamBatchMemOp; drivers without the operation refuse it)
"""

from __future__ import annotations

import argparse
import ctypes
import sys
from collections.abc import Callable
from pathlib import Path

from cuda.bindings import driver

import ipcshare
from ipcshare.cli.result_file import RESULT_HELP, write_result
from ipcshare.patterns import make_pattern
from ipcshare.patterns.allgather import allgather_busbw_factor
from ipcshare.runtime.config import parse_size
from ipcshare.runtime.result_document import figure, make_row, new_launch_id

VARIANTS = ("full", "copies", "copies-1s", "batch", "full-batch", "barriers", "kbarriers",
            "full-kbar", "in-place", "pairwise", "pairwise-ip", "push",
            "barriers-1f", "full-1f", "barriers-bop", "full-bop", "barriers-atomic",
            "full-atomic", "full-kbar1s", "full-1s")
# Pad words of the pairwise variant (user slots, unused by the probe otherwise).
_FREE_BASE, _LANDED_BASE = 300, 400
_epochs = [0]
# Variants that are whole all-gathers (their bytes are checked; "!" marks wrong bytes).
_REAL = ("full", "in-place", "full-kbarm", "full-batch", "full-kbar", "pairwise",
         "pairwise-ip", "push", "push-ip", "auto", "auto-ip", "full-1f", "full-bop", "full-atomic",
         "full-kbar1s", "full-1s", "leader", "leader-ip", "leader-cc", "leader-ip-cc",
         "leader-batch", "leader-ip-batch")
# Pad words of the barrier variants: flags per rank, and one counter word for "atomic".
_FLAG_BASE, _COUNTER_SLOT = 320, 480
_LABEL = 26   # width of the variant column
_SCRATCH_SLOT = 490


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


def _leader(window, pattern, plan, mode: str, how: str = "") -> Callable[[], None]:
    """The ``leader`` variants: per GPU, its lowest rank copies for every rank on it;
    ``how``: "" one copy after another, "cc" on concurrent side streams, "batch" in one
    cuMemcpyBatchAsync."""
    n, me = window.world_size, window.rank
    uuids = window.world.comm.allgather(window.group.backend.uuid)
    leader_of = [min(q for q in range(n) if uuids[q] == uuids[r]) for r in range(n)]
    pairs = []
    if leader_of[me] == me:
        for source_rank in (r for r in range(n) if leader_of[r] == me):
            source = pattern._send_of(window, source_rank, plan, mode)
            for target in range(n):
                if target == source_rank and mode == "in-place":
                    continue
                pairs.append((window.peer(target).slice(
                    pattern._recv_offset(plan) + source_rank * plan.block_bytes,
                    plan.block_bytes), source))
    jobs = [(dst.ptr, src.ptr, dst.nbytes) for dst, src in pairs]
    if not pairs:
        def copy() -> None:
            pass
    elif how == "cc" and len(jobs) > 1:
        copy = window.engine._concurrent_copier(jobs)
    elif how == "batch":
        copy = _batch_copier(window.engine, jobs)
    else:
        copy = window.engine.copier(pairs)
    barrier = window.barrier

    def leader() -> None:
        barrier()
        copy()
        barrier()
    return leader


def _operation(variant: str, window, plan) -> Callable[[], None]:
    pattern = make_pattern("allgather", "copy-engine")
    engine = window.engine
    if variant == "full":
        return pattern.bind(window, plan, "out-of-place")
    if variant == "in-place":
        return pattern.bind(window, plan, "in-place")
    if variant in ("push", "push-ip"):
        mode = "in-place" if variant == "push-ip" else "out-of-place"
        return make_pattern("allgather", "push").bind(window, plan, mode)
    if variant.startswith("leader"):
        how = variant.removeprefix("leader").removeprefix("-ip").removeprefix("-")
        return _leader(window, pattern, plan, "in-place" if variant.startswith("leader-ip")
                       else "out-of-place", how)
    if variant in ("auto", "auto-ip"):
        mode = "in-place" if variant == "auto-ip" else "out-of-place"
        return make_pattern("allgather", "auto").bind(window, plan, mode)
    if variant.startswith("k:"):
        return _probe_kernel(variant[2:], window, plan)
    if variant == "hybrid-main":
        return _hybrid(1.0, window, pattern, plan, first_on_stream=True)
    if variant.startswith("hybrid-"):
        return _hybrid(int(variant.split("-", 1)[1]) / 100, window, pattern, plan)
    if variant.startswith(("pre-copy+", "pre-memset+")):
        scratch = window.signal_pad(window.rank).ptr + 8 * _SCRATCH_SLOT
        rest = _operation(variant.split("+", 1)[1], window, plan)
        if variant.startswith("pre-copy+"):
            def prefix() -> None:
                driver.cuMemcpyDtoDAsync(scratch + 16, scratch, 16, engine.stream)
        else:
            def prefix() -> None:
                driver.cuMemsetD32Async(scratch, 0, 1, engine.stream)
        return _chain(prefix, rest)
    if variant.startswith("kernel+"):
        empty = ScatterArgs()   # no destinations: the kernel returns at once
        kernel = window.group.backend.kernels(str(_PROBE_SOURCE)).launcher(
            "probe_scatter", empty, grid=1, block=32, stream=engine.stream)
        return _chain(kernel, _operation(variant.split("+", 1)[1], window, plan))
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
    if variant == "full-kbarm":
        scratch = window.signal_pad(window.rank).ptr + 8 * _SCRATCH_SLOT
        release = int(driver.CUstreamWriteValue_flags.CU_STREAM_WRITE_VALUE_DEFAULT)

        def mark() -> None:
            engine._write(engine.stream, scratch, 1, release)
        return _chain(kbarrier, mark, pairs_copier, kbarrier)
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

    engine, me, n = window.engine, window.rank, window.world_size
    pairs = _copy_pairs(window, pattern, plan, mode)
    peers = [(me + step) % n for step in range(1, n)]
    own = window.signal_pad(me).ptr
    lanes = _owned_lanes(len(peers))
    write, wait, stream = engine._write, engine._wait, engine.stream
    release = int(driver.CUstreamWriteValue_flags.CU_STREAM_WRITE_VALUE_DEFAULT)
    geq = int(driver.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ)
    fork = _owned_event()
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


_PROBE_SOURCE = Path(__file__).resolve().with_name("allgather_probe_kernels.cu")


def _probe_kernel(spec: str, window, plan) -> Callable[[], None]:
    """``NAME@GxT``: a kernel on G blocks of T threads, with the push kernel's arguments,
    pad words and epoch word (so it alternates with push on one window)."""
    from ipcshare.kernels.launcher import AllGatherArgs
    from ipcshare.patterns.allgather_kernels import _EPOCH_WORD, _SLOT_BASE

    name, _, shape = spec.partition("@")
    grid, _, threads = (shape or "128x512").partition("x")
    push = make_pattern("allgather", "push")
    args = AllGatherArgs()
    for rank in range(window.world_size):
        args.outputs[rank] = window.peer(rank).ptr + push._recv_offset(plan)
        args.inputs[rank] = push._send_of(window, rank, plan, "out-of-place").ptr
        args.pads[rank] = window.signal_pad(rank).ptr
    args.block_bytes = plan.block_bytes
    args.timeout_ns = int(window.group.signal_timeout * 0.5e9)
    args.rank, args.nranks = window.rank, window.world_size
    args.slot_base, args.epoch_word = _SLOT_BASE["push"], _EPOCH_WORD["push"]
    backend = window.group.backend
    if name == "push":
        kernels, entry = backend.kernels("allgather.cu"), "allgather_push"
    else:
        kernels, entry = backend.kernels(str(_PROBE_SOURCE)), name
    grid, threads = int(grid), int(threads)
    # Blocks wait for their peers' blocks: all of them must be resident at once, or the
    # kernel waits for a block that cannot start. Refuse such a shape (every rank alike).
    function = kernels.function(entry)
    _, per_sm = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(function, threads, 0)
    _, sms = driver.cuDeviceGetAttribute(
        driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, backend.device)
    if per_sm * sms < grid:
        raise _NotResident(f"{per_sm} blocks of {threads} threads per SM x {sms} SMs < {grid}")
    return kernels.launcher(entry, args, grid=grid, block=threads,
                            stream=window.engine.stream)


class ScatterArgs(ctypes.Structure):
    """``ScatterArgs`` of tools/probes/timing/allgather_probe_kernels.cu."""

    _fields_ = [("dsts", ctypes.c_void_p * 8), ("src", ctypes.c_void_p),
                ("bytes", ctypes.c_ulonglong), ("ndst", ctypes.c_int)]


def _hybrid(share: float, window, pattern, plan, *,
            first_on_stream: bool = False) -> Callable[[], None]:
    """The copy engine moves the first ``share`` of every copy, a kernel the rest, at once."""

    stream = window.engine.stream
    pairs = _copy_pairs(window, pattern, plan, "out-of-place")
    src = pairs[0][1].ptr
    assert all(s.ptr == src for _d, s in pairs)   # push: one source, every output
    ce_bytes = int(plan.block_bytes * share) // 16 * 16
    lanes = _owned_lanes(len(pairs))
    fork = _owned_event()
    args = ScatterArgs()
    for i, (dst, _src) in enumerate(pairs):
        args.dsts[i] = dst.ptr + ce_bytes
    args.src, args.bytes, args.ndst = src + ce_bytes, plan.block_bytes - ce_bytes, len(pairs)
    kernel = window.group.backend.kernels(str(_PROBE_SOURCE)).launcher(
        "probe_scatter", args, grid=128, block=512, stream=stream)
    barrier = window.barrier

    def run() -> None:
        barrier()
        driver.cuEventRecord(fork, stream)
        for i, ((dst, _src), (lane, done)) in enumerate(zip(pairs, lanes, strict=True)):
            if first_on_stream and i == 0:
                driver.cuMemcpyDtoDAsync(dst.ptr, src, ce_bytes, stream)
                continue
            driver.cuStreamWaitEvent(lane, fork, 0)
            if ce_bytes:
                driver.cuMemcpyDtoDAsync(dst.ptr, src, ce_bytes, lane)
            driver.cuEventRecord(done, lane)
        if args.bytes:
            kernel()
        for i, (_lane, done) in enumerate(lanes):
            if not (first_on_stream and i == 0):
                driver.cuStreamWaitEvent(stream, done, 0)
        barrier()
    return run


class _NotResident(Exception):
    """A kernel shape whose blocks cannot all be resident at once."""


# Streams and events the variants create, destroyed when the probe ends (main()).
_owned: list[tuple[str, object]] = []


def _owned_lanes(count: int) -> list[tuple]:
    from ipcshare.backends.cuda_streams import new_side_lane

    lanes = [new_side_lane() for _ in range(count)]
    for stream, done in lanes:
        _owned.extend((("stream", stream), ("event", done)))
    return lanes


def _owned_event():
    event = driver.cuEventCreate(int(driver.CUevent_flags.CU_EVENT_DISABLE_TIMING))[1]
    _owned.append(("event", event))
    return event


def _release_owned() -> None:
    while _owned:
        kind, handle = _owned.pop()
        (driver.cuStreamDestroy if kind == "stream" else driver.cuEventDestroy)(handle)


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
    parser.add_argument("--nccl", action="store_true",
                        help="also time NCCL's all-gather (torch.distributed), alone and "
                             "after an empty kernel: rows nccl and kernel+nccl")
    parser.add_argument("--result", metavar="FILE", help=RESULT_HELP)
    args = parser.parse_args(argv)
    launch, rows = new_launch_id(), []
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
            print("variant".ljust(_LABEL) + "".join(f"{s:>24d}" for s in sizes), flush=True)
        for variant in variants:
            cells = []
            for plan in plans:
                try:
                    op = _operation(variant, window, plan)
                except _NotResident as exc:
                    cells.append("not resident")
                    if group.rank == 0 and plan is plans[0]:
                        print(f"# {variant}: {exc}", flush=True)
                    continue
                wrong = None
                # A whole all-gather: check its bytes once.
                base = variant.rsplit("+", 1)[-1]   # prefixes (kernel+, pre-copy+) move nothing
                if base in _REAL or base.startswith(("k:", "hybrid-")):
                    mode = ("in-place" if base in ("in-place", "pairwise-ip", "auto-ip", "push-ip")
                            or base.startswith("leader-ip")
                            else "out-of-place")
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
                rows.append(make_row(
                    op="allgather", size=plan.size, dtype="uint8", algorithm=variant,
                    mode="eager", world_size=n, launch=launch,
                    ours=figure(seconds * 1e6, plan.size / seconds / 1e9, busbw), wrong=wrong,
                    details={"backend": args.backend, "figure": "the slowest rank's",
                             "checked": wrong is not None}))
                window.synchronize()
                comm.Barrier()
            if group.rank == 0:
                print(variant.ljust(_LABEL) + "".join(f"{c:>24s}" for c in cells), flush=True)
        if args.nccl:
            _time_nccl(group, plans, args)
        window.synchronize()
        _release_owned()
        window.close()
        status = 3 if any(row["wrong"] for row in rows) else 0
        if args.result and group.rank == 0:
            write_result(args.result, tool="tools/probes/timing/allgather_probe.py",
                         world_size=n, rows=rows, exit_status=status,
                         argv=["python3", "tools/probes/timing/allgather_probe.py",
                               *(sys.argv[1:] if argv is None else argv)])
    return status


def _time_nccl(group, plans, args) -> None:
    """Rows ``nccl`` and ``kernel+nccl``: all_gather_into_tensor timed like the variants
    (slowest rank, events on torch's stream), alone and after a one-element add."""
    import torch
    import torch.distributed as dist

    from ipcshare.baselines.torch_distributed import TorchBaseline
    from ipcshare.patterns import make_pattern

    comm, n = group.world.comm, group.size
    with TorchBaseline(group.world, make_pattern("allgather", "copy-engine"),
                       group.backend.device) as nccl:
        tiny = torch.zeros(1, device=nccl.device)
        for row in ("nccl", "kernel+nccl"):
            cells, kernel_first = [], row.startswith("kernel+")
            for plan in plans:
                send = torch.full((plan.block_bytes,), group.rank + 1, dtype=torch.uint8,
                                  device=nccl.device)
                recv = torch.empty(plan.block_bytes * n, dtype=torch.uint8, device=nccl.device)

                def op(send=send, recv=recv, before=kernel_first) -> None:
                    if before:
                        tiny.add_(1)
                    dist.all_gather_into_tensor(recv, send)
                op()
                torch.cuda.synchronize()
                expected = torch.arange(1, n + 1, dtype=torch.uint8, device=nccl.device)
                wrong = int((recv.view(n, -1) != expected[:, None]).sum())
                wrong = comm.allreduce(wrong)
                for _ in range(args.warmup):
                    op()
                torch.cuda.synchronize()
                comm.Barrier()
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                    enable_timing=True)
                start.record()
                for _ in range(args.iters):
                    op()
                stop.record()
                stop.synchronize()
                seconds = comm.allreduce(start.elapsed_time(stop) / 1e3 / args.iters,
                                         op=_max())
                busbw = plan.size / seconds / 1e9 * allgather_busbw_factor(n)
                flag = "  " if wrong == 0 else " !"
                cells.append(f"{busbw:9.1f} ({seconds * 1e6:8.1f}){flag}")
                del send, recv
            if group.rank == 0:
                print(row.ljust(_LABEL) + "".join(f"{c:>24s}" for c in cells), flush=True)


def _max():
    from mpi4py import MPI

    return MPI.MAX


if __name__ == "__main__":
    sys.exit(main())
