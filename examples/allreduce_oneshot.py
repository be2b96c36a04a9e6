"""A custom collective from ipcshare's building blocks: your own one-shot all-reduce
(float32 sum) over a window, checked bit for bit and timed beside ``comm.all_reduce``.

    mpiexec -n 2 python examples/allreduce_oneshot.py [--count N] [--iters K]
            [--backend auto|host|cuda-ipc|cuda-vmm] [--result FILE]

``--result FILE`` writes the timing as a result document (docs/CLI.md): the example's
all-reduce as ours, ``comm.all_reduce`` (bound) as its baseline, with the commit and the
machine.

On GPUs the all-reduce is a kernel of yours, ``allreduce_oneshot.cu`` beside this file:
CUDA C++ that includes ``<ipcshare/signal.cuh>``, compiled by NVRTC to CUBIN for this
GPU's architecture. What makes it fast is what happens once, not per call: the window's
peer pointers and signal pads are resolved when the call is bound and written into an
argument block with the input and output addresses, so each call is one cuLaunchKernel
of that block, nothing else. Its call counter lives on the device (``begin_epoch`` /
``end_epoch``), so the launch can also be captured in a CUDA graph and replayed.

On host memory (``--backend host``, or ``auto`` without a GPU) the same algorithm runs
on numpy views of the peers' windows with the window's barrier.

Inputs are multiples of 1/4 between -8 and 8: every partial sum of up to 8 ranks is a
float32 exactly, so any summation order gives the same bits and the result is compared
for equality (with the expected sum and with ``comm.all_reduce``'s), not within a
tolerance. Exit status 0 when every check passed on every rank.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np

import ipcshare
from ipcshare import IpcShareError
from ipcshare.runtime.config import BACKENDS
from ipcshare.window import ERROR_SLOT, USER_SLOT_BASE

KERNEL_SOURCE = Path(__file__).resolve().with_name("allreduce_oneshot.cu")
KERNEL_NAME = "one_shot_all_reduce_f32"
THREADS = 512
# Slices of 8 KiB per thread block keep every SM busy at large sizes.
BYTES_PER_BLOCK = 8 << 10
# The kernel's pad words (allreduce_oneshot.cu): the call counter and its block count at
# USER_SLOT_BASE, then one barrier word per block and rank, below the error word.
_SLOT_BASE = USER_SLOT_BASE + 2
MAX_RANKS = 8  # ipcshare::kMaxRanks: the pointers an argument block holds


class Refused(Exception):
    """This job cannot run the example; the message says why, in one line, and every rank
    raises it alike."""


class OneShotArgs(ctypes.Structure):
    """``OneShotArgs`` of allreduce_oneshot.cu, field for field."""

    _fields_ = [
        ("buffers", ctypes.c_void_p * MAX_RANKS),
        ("pads", ctypes.c_void_p * MAX_RANKS),
        ("input", ctypes.c_void_p),
        ("output", ctypes.c_void_p),
        ("count", ctypes.c_ulonglong),
        ("parity_bytes", ctypes.c_ulonglong),
        ("timeout_ns", ctypes.c_ulonglong),
        ("rank", ctypes.c_int),
        ("nranks", ctypes.c_int),
    ]


def staging_bytes(count: int) -> int:
    """Bytes of one staging area: ``count`` floats, rounded up to 16 for vector loads."""
    return -(-count * 4 // 16) * 16


def window_bytes(count: int) -> int:
    """The window this all-reduce needs: two staging areas, used by call parity."""
    return 2 * staging_bytes(count)


def example_values(count: int, rank: int, step: int) -> np.ndarray:
    """Rank ``rank``'s input at ``step``: multiples of 1/4 in [-8, 8), exact in float32,
    as are their sums over up to 8 ranks."""
    index = np.arange(count, dtype=np.int64)
    return (((index * (2 * rank + 3) + 7 * step) % 64) - 32).astype(np.float32) / 4


def expected_sum(count: int, world_size: int, step: int) -> np.ndarray:
    """What every rank's output must hold at ``step``."""
    return sum(example_values(count, rank, step) for rank in range(world_size))


# -- on GPUs: the user's kernel ------------------------------------------------------------

class KernelAllReduce:
    """The user's all-reduce of ``inputs`` into ``output`` (float32 torch tensors on this
    rank's GPU, 16-byte aligned) on ``stream``, bound once: each call is one launch.

    Raises:
        ValueError: arrays this kernel cannot take (type, device, alignment, size).
        KernelCompileError: NVRTC is missing, or the kernel does not compile.
    """

    def __init__(self, window, inputs, output, stream) -> None:
        from cuda.bindings import driver

        from ipcshare.kernels.compiler import compile_kernel_source, device_arch
        from ipcshare.runtime.cuda_driver import check

        count = inputs.numel()
        for name, tensor in (("inputs", inputs), ("output", output)):
            if tensor.dtype != _torch().float32 or not tensor.is_contiguous():
                raise ValueError(f"{name} must be a contiguous float32 tensor, not "
                                 f"{tensor.dtype} of strides {tensor.stride()}")
            if tensor.numel() != count or tensor.data_ptr() % 16:
                raise ValueError(f"{name} must hold {count} floats at a 16-byte aligned "
                                 f"address, not {tensor.numel()} at {tensor.data_ptr():#x}")
        if window.local.nbytes < window_bytes(count):
            raise ValueError(f"the window has {window.local.nbytes} bytes; {count} floats "
                             f"need {window_bytes(count)}: make it window_bytes(count)")
        device = window.group.backend.device
        cubin = compile_kernel_source(KERNEL_SOURCE, arch=device_arch(device))
        self._check, self._driver = check, driver
        self._module = check("cuModuleLoadData", driver.cuModuleLoadData(cubin))
        self._function = check("cuModuleGetFunction",
                               driver.cuModuleGetFunction(self._module, KERNEL_NAME.encode()))
        # Resolved once: every peer's window and pad, this call's arrays, the grid.
        n = window.world_size
        args = self.args = OneShotArgs()
        args.buffers[:n] = window.buffer_ptrs
        args.pads[:n] = window.signal_pad_ptrs
        args.input, args.output = inputs.data_ptr(), output.data_ptr()
        args.count, args.parity_bytes = count, staging_bytes(count)
        # Half the group's timeout: the kernel reports a silent peer before the host
        # gives up on the whole job.
        args.timeout_ns = int(window.group.signal_timeout * 0.5e9)
        args.rank, args.nranks = window.rank, n
        pad_blocks = (ERROR_SLOT - _SLOT_BASE) // n
        self.blocks = max(1, min(pad_blocks, -(-count * 4 // BYTES_PER_BLOCK)))
        self._params = (ctypes.c_void_p * 1)(ctypes.addressof(args))
        self._params_address = ctypes.addressof(self._params)
        self._stream = driver.CUstream(stream.cuda_stream)
        self._inputs, self._output = inputs, output  # kept alive while bound

    def __call__(self) -> None:
        """Enqueue one all-reduce on the stream (one launch; the host does not wait)."""
        self._check("cuLaunchKernel", self._driver.cuLaunchKernel(
            self._function, self.blocks, 1, 1, THREADS, 1, 1, 0, self._stream,
            self._params_address, 0))

    def close(self) -> None:
        """Unload the kernel (idempotent)."""
        module, self._module = self._module, None
        if module is not None:
            self._check("cuModuleUnload", self._driver.cuModuleUnload(module))


def _torch():
    import torch

    return torch


def _check_gpu_job(group) -> None:
    """Raises Refused (on every rank alike) where the kernel cannot run."""
    world = group.world
    if world.node_count > 1:
        raise Refused(f"the ranks span {world.node_count} nodes; the kernel reads peers' "
                      "windows over NVLink / PCIe: run every rank on one node")
    if world.size > MAX_RANKS:
        raise Refused(f"the kernel's argument block names at most {MAX_RANKS} ranks, not "
                      f"{world.size}: run with -n {MAX_RANKS} or fewer")
    if group.shared_gpus:
        raise Refused("ranks share a GPU: the kernel's spinning barrier needs one GPU per "
                      "rank (run as many ranks as GPUs, each bound by launch/bind-gpu.sh)")
    try:
        _torch()
    except ImportError:
        raise Refused("the GPU example needs torch: pip install torch, or run "
                      "--backend host") from None


def run_on_gpus(group, count: int, iters: int) -> Timing:
    """The kernel and the library on one stream: checks, graph replay, then timing.

    Raises:
        Refused: this job cannot run the kernel.
    """
    _check_gpu_job(group)
    torch = _torch()
    comm_world = group.world.comm
    device = group.backend.device
    torch.cuda.set_device(device)
    stream = torch.cuda.Stream(device)
    with group.window(window_bytes(count)) as window, \
            group.communicator(max_bytes=count * 4, heap_bytes=0) as comm:
        unreachable = [r for r in range(group.size) if window.path(r) not in ("self", "direct")]
        if any(comm_world.allgather(bool(unreachable))):
            raise Refused("some GPUs of this node have no peer access to each other; the "
                          "kernel needs every pair mapped directly (see ipcshare info)")
        inputs = torch.empty(count, dtype=torch.float32, device="cuda")
        ours = torch.empty_like(inputs)
        theirs = torch.empty_like(inputs)
        user_all_reduce = KernelAllReduce(window, inputs, ours, stream)
        # Every rank's kernel is loaded before any launches: the first barrier then waits
        # for peers' launches, not for their compilers.
        comm_world.Barrier()
        try:
            library_all_reduce = comm.bind("all_reduce", inputs, output=theirs, stream=stream)
            ok = True
            for step in range(3):  # new data each call: nothing is left over from the last
                with torch.cuda.stream(stream):
                    inputs.copy_(torch.from_numpy(example_values(count, group.rank, step)))
                user_all_reduce()
                library_all_reduce()
                ok &= _agrees(torch, stream, window, comm, ours, theirs,
                              expected_sum(count, group.size, step))
            # The launch captured once in a CUDA graph, replayed on new data.
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                user_all_reduce()
            for step in range(3, 6):
                with torch.cuda.stream(stream):
                    inputs.copy_(torch.from_numpy(example_values(count, group.rank, step)))
                    ours.zero_()
                    graph.replay()
                    library_all_reduce()
                ok &= _agrees(torch, stream, window, comm, ours, theirs,
                              expected_sum(count, group.size, step))
            del graph   # before the module its kernel lives in is unloaded
            ok = all(comm_world.allgather(ok))
            mine_us = _time_gpu(torch, stream, user_all_reduce, iters, comm_world)
            library_us = _time_gpu(torch, stream, library_all_reduce, iters, comm_world)
        finally:
            user_all_reduce.close()
    return Timing(ok, "your kernel", mine_us, library_us)


def _agrees(torch, stream, window, comm, ours, theirs, expected: np.ndarray) -> bool:
    stream.synchronize()
    window.raise_kernel_error("the example's kernel")   # a peer that never came
    comm.synchronize(stream)
    want = torch.from_numpy(expected).to(ours.device)
    return bool(torch.equal(ours, want) and torch.equal(theirs, want))


def _time_gpu(torch, stream, call, iters: int, comm_world) -> float:
    """Microseconds per call of ``iters`` back-to-back calls, the slowest rank's."""
    for _ in range(max(3, iters // 10)):
        call()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    comm_world.Barrier()
    start.record(stream)
    for _ in range(iters):
        call()
    end.record(stream)
    end.synchronize()
    return max(comm_world.allgather(start.elapsed_time(end) * 1e3 / iters))


# -- on host memory: the same algorithm on numpy views --------------------------------------

class HostAllReduce:
    """One-shot all-reduce of ``inputs`` into ``output`` (float32 numpy arrays) through
    ``window``: copy in (staging by call parity), barrier, sum every rank's staging area
    in rank order."""

    def __init__(self, window, inputs: np.ndarray, output: np.ndarray) -> None:
        count = inputs.size
        self.window, self.inputs, self.output = window, inputs, output
        self.staging = [[np.asarray(window.peer(r))[p * staging_bytes(count):][:count * 4]
                         .view(np.float32) for r in range(window.world_size)]
                        for p in (0, 1)]
        self.calls = 0

    def __call__(self) -> None:
        staged = self.staging[self.calls & 1]
        self.calls += 1
        staged[self.window.rank][:] = self.inputs
        self.window.barrier()   # every rank's input is staged (and visible)
        np.copyto(self.output, staged[0])
        for peer_staging in staged[1:]:
            np.add(self.output, peer_staging, out=self.output)


def run_on_host(group, count: int, iters: int) -> Timing:
    comm_world = group.world.comm
    with group.window(window_bytes(count)) as window, \
            group.communicator(max_bytes=count * 4, heap_bytes=0) as comm:
        inputs = np.empty(count, np.float32)
        ours, theirs = np.empty_like(inputs), np.empty_like(inputs)
        user_all_reduce = HostAllReduce(window, inputs, ours)
        library_all_reduce = comm.bind("all_reduce", inputs, output=theirs)
        ok = True
        for step in range(4):
            inputs[:] = example_values(count, group.rank, step)
            user_all_reduce()
            library_all_reduce()
            want = expected_sum(count, group.size, step)
            ok &= bool(np.array_equal(ours, want) and np.array_equal(theirs, want))
        ok = all(comm_world.allgather(ok))
        mine_us = _time_host(user_all_reduce, iters, comm_world)
        library_us = _time_host(library_all_reduce, iters, comm_world)
    return Timing(ok, "your numpy one-shot", mine_us, library_us)


def _time_host(call, iters: int, comm_world) -> float:
    call()
    comm_world.Barrier()
    start = time.perf_counter()
    for _ in range(iters):
        call()
    seconds = time.perf_counter() - start
    return max(comm_world.allgather(seconds * 1e6 / iters))


class Timing(NamedTuple):
    """What a run found: every check passed on every rank (``ok``), and the slowest
    rank's microseconds per call of the example's all-reduce (``what``) and of the
    library's bound ``comm.all_reduce``."""

    ok: bool
    what: str
    mine_us: float
    library_us: float

    def report(self, count: int, size: int) -> str:
        verdict = "verified" if self.ok else "MISMATCH"
        return (f"one-shot all-reduce of {count} float32 on {size} rank(s): {verdict} "
                f"(bitwise, against the expected sums and comm.all_reduce); {self.what} "
                f"{self.mine_us:.2f} us per call, comm.all_reduce (bound) "
                f"{self.library_us:.2f} us; ratio {self.mine_us / self.library_us:.2f}")


def write_timing(path: str, timing: Timing, *, count: int, size: int, backend: str,
                 argv: list[str]) -> None:
    """``timing`` as a result document: the example's all-reduce as ours, the library's
    bound call as its baseline, both timed in this launch (exit status 3 on a mismatch:
    the checks compare whole arrays, so the count of wrong elements is not known)."""
    from ipcshare.cli.result_file import write_result
    from ipcshare.runtime.result_document import (
        baseline_figure,
        figure,
        make_row,
        new_launch_id,
    )

    seconds = {"mine": timing.mine_us * 1e-6, "library": timing.library_us * 1e-6}
    nbytes = count * 4
    busbw = {k: nbytes / s / 1e9 * 2 * (size - 1) / size for k, s in seconds.items()}
    row = make_row(
        op="allreduce", size=nbytes, count=count, dtype="float32", algorithm=timing.what,
        mode="eager", world_size=size, launch=new_launch_id(),
        ours=figure(timing.mine_us, nbytes / seconds["mine"] / 1e9, busbw["mine"]),
        baselines=[baseline_figure("comm.all_reduce", timing.library_us,
                                   nbytes / seconds["library"] / 1e9, busbw["library"],
                                   wrong=None)],
        wrong=None, details={"backend": backend, "checked": "bitwise, whole arrays",
                             "verified": timing.ok})
    write_result(path, tool="examples/allreduce_oneshot.py", world_size=size, rows=[row],
                 exit_status=0 if timing.ok else 3, argv=argv)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1 << 20, help="float32 elements per rank")
    parser.add_argument("--iters", type=int, default=50, help="timed calls")
    parser.add_argument("--backend", default="auto", choices=BACKENDS,
                        help="host runs the numpy version; auto picks a GPU where there is one")
    parser.add_argument("--result", metavar="FILE",
                        help="write the timing as a result document (rank 0; docs/CLI.md)")
    args = parser.parse_args(argv)
    for flag, value in (("--count", args.count), ("--iters", args.iters)):
        if value < 1:
            parser.error(f"{flag} must be at least 1, got {value}")
    try:
        if args.result:   # refused now, not after the run
            from ipcshare.runtime.output_files import check_writable

            check_writable(args.result)
        with ipcshare.Group(backend=args.backend) as group:
            run = run_on_host if group.backend_name == "host" else run_on_gpus
            timing = run(group, args.count, args.iters)
            ok = timing.ok
            if group.rank == 0:
                print(timing.report(args.count, group.size), flush=True)
                if args.result:
                    write_timing(args.result, timing, count=args.count, size=group.size,
                                 backend=group.backend_name,
                                 argv=["python", "examples/allreduce_oneshot.py",
                                       *(sys.argv[1:] if argv is None else argv)])
    except (Refused, IpcShareError) as exc:  # every rank alike: one line each, no hang
        # One write per line: ranks' lines must not interleave.
        sys.stderr.write(f"allreduce_oneshot.py: error: {exc}\n")
        return 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
