"""What it costs two processes sharing one GPU to hand work to each other, by the kind of
work the second one does. Answers the design question behind collectives on time-sliced
GPUs (no MPS): must every rank of a shared GPU run kernels in a call, or can one context
do the kernels while the others only copy and wait?

Two ranks on one GPU play ping-pong through two 32-bit flags in rank 0's memory (opened
by rank 1 through legacy CUDA IPC): a turn waits for its flag with ``cuStreamWaitValue32``,
does its work, and writes the other's flag with ``cuStreamWriteValue32``. Rank 0's work
is always a small kernel; rank 1's is, per variant:

  kernel    the same small kernel (what stepped collectives do: every context computes)
  copy      a device-to-device ``cuMemcpyDtoDAsync`` of ``--bytes`` (copy engine only)
  flags     nothing: only the wait and the write (stream memory operations)
  describe  seven more 64-bit writes into its own memory before the write (a stepped
            call's description, as a guest of a time-sliced GPU writes it)
  batched   the seven writes, the wait and the two flag writes in one cuStreamBatchMemOp
  alone     rank 1 takes no part; rank 0 writes its own flag (the floor of one context)

Prints µs per round trip (two hand-overs). Run as ``mpiexec -n 2 python
tools/probes/sharing/timeslice_probe.py [--rounds N] [--bytes B]`` with both ranks on GPU 0;
with and without an MPS daemon to compare. ``--result FILE``: the figures as a result
document (docs/CLI.md; op ``hand-over``, the guests' work as the algorithm).
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cuda.bindings import driver
from mpi4py import MPI

from ipcshare.backends.cuda_graph import CapturedGraph
from ipcshare.cli.result_file import RESULT_HELP, write_result
from ipcshare.kernels.compiler import compile_kernel_source, device_arch
from ipcshare.kernels.launcher import LoadedKernels
from ipcshare.runtime.cuda_driver import check, init
from ipcshare.runtime.result_document import figure, make_row, new_launch_id

KERNEL = r"""
extern "C" __global__ void touch(unsigned int *word) {
  if (threadIdx.x == 0 && blockIdx.x == 0) atomicAdd(word, 1u);
}
"""
VARIANTS = ("kernel", "copy", "flags", "describe", "batched", "alone")


class TouchArgs(ctypes.Structure):
    _fields_ = [("word", ctypes.c_uint64)]


GEQ = driver.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ
# Rank 0 plays every other rank (a guest) at once. Its turn on flag set s: wait until
# each guest's word s for it is 1 and clear it, run the kernel, set each guest's own word
# s. A guest's turn on set s: wait until its own word s is 1, clear it, work, set its word
# s ^ 1 for rank 0. Fixed values only, so a graph of a turn replays correctly; the sets
# alternate as the window's graph-safe barriers do.
MAX_GUESTS = 7
WORDS_PER_VARIANT = 2 * 2 * MAX_GUESTS  # (rank 0's words, the guests' own) x guests x sets


_Types = driver.CUstreamBatchMemOpType
WAIT32, WRITE32 = _Types.CU_STREAM_MEM_OP_WAIT_VALUE_32, _Types.CU_STREAM_MEM_OP_WRITE_VALUE_32
WRITE64 = _Types.CU_STREAM_MEM_OP_WRITE_VALUE_64


def _op(kind: Any, address: Any, value: int, flags: Any) -> Any:
    """One operation of a cuStreamBatchMemOp."""
    op = driver.CUstreamBatchMemOpParams()
    part = op.waitValue if kind == WAIT32 else op.writeValue
    part.operation = kind
    part.address = address
    if kind == WRITE64:
        part.value64 = value
    else:
        part.value = value
    part.flags = int(flags)
    return op


@dataclass
class Player:
    """One rank's side of the game."""

    me: int
    ranks: int
    stream: Any
    touch: Callable[[], None]
    scratch: Any
    copy_bytes: int
    flags_at: int
    leader_kernels: int = 1

    def word(self, variant_index: int, guests_own: bool, guest: int, flag_set: int) -> Any:
        number = ((variant_index * 2 + guests_own) * MAX_GUESTS + guest - 1) * 2 + flag_set
        return driver.CUdeviceptr(self.flags_at + 4 * number)

    def turn(self, variant: str, index: int, flag_set: int) -> None:
        """Enqueue one turn of ``variant`` (the ``index``-th) on flag set ``flag_set``."""
        if variant == "alone":
            if self.me == 0:  # rank 0 plays against itself, through guest 1's words
                self._wait_and_clear(self.word(index, False, 1, flag_set))
                self.touch()
                self._set(self.word(index, False, 1, flag_set ^ 1))
            return
        if self.me == 0:
            for guest in range(1, self.ranks):
                self._wait_and_clear(self.word(index, False, guest, flag_set))
            for _ in range(self.leader_kernels):
                self.touch()
            for guest in range(1, self.ranks):
                self._set(self.word(index, True, guest, flag_set))
            return
        if variant == "batched":
            self._batched(self.word(index, True, self.me, flag_set),
                          self.word(index, False, self.me, flag_set ^ 1))
            return
        self._wait_and_clear(self.word(index, True, self.me, flag_set))
        if variant == "kernel":
            self.touch()
        elif variant == "copy":
            check("cuMemcpyDtoDAsync", driver.cuMemcpyDtoDAsync(
                driver.CUdeviceptr(int(self.scratch) + self.copy_bytes), self.scratch,
                self.copy_bytes, self.stream))
        elif variant == "describe":
            for word in range(7):
                check("cuStreamWriteValue64", driver.cuStreamWriteValue64(
                    self.stream, driver.CUdeviceptr(int(self.scratch) + 8 * word),
                    word << 40, 0))
        self._set(self.word(index, False, self.me, flag_set ^ 1))

    def _batched(self, mine: Any, theirs: Any) -> None:
        ops = [_op(WAIT32, mine, 1, GEQ), _op(WRITE32, mine, 0, 0)]
        ops += [_op(WRITE64, driver.CUdeviceptr(int(self.scratch) + 8 * word), word << 40, 0)
                for word in range(7)]
        ops.append(_op(WRITE32, theirs, 1, 0))
        check("cuStreamBatchMemOp", driver.cuStreamBatchMemOp(self.stream, len(ops), ops, 0))

    def _wait_and_clear(self, word: Any) -> None:
        check("cuStreamWaitValue32", driver.cuStreamWaitValue32(self.stream, word, 1, GEQ))
        check("cuStreamWriteValue32", driver.cuStreamWriteValue32(self.stream, word, 0, 0))

    def _set(self, word: Any) -> None:
        check("cuStreamWriteValue32", driver.cuStreamWriteValue32(self.stream, word, 1, 0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--bytes", type=int, default=4096)
    parser.add_argument("--leader-kernels", type=int, default=1,
                        help="kernels rank 0 runs in each of its turns")
    parser.add_argument("--flags-owner", type=int, default=0,
                        help="the rank whose memory holds the flags (the others open it)")
    parser.add_argument("--result", metavar="FILE", help=RESULT_HELP)
    options = parser.parse_args()
    comm = MPI.COMM_WORLD
    if not 2 <= comm.size <= MAX_GUESTS + 1:
        raise SystemExit(f"run with 2 to {MAX_GUESTS + 1} ranks, all on GPU 0")
    me = comm.rank

    init()
    device = check("cuDeviceGet", driver.cuDeviceGet(0))
    context = check("cuDevicePrimaryCtxRetain", driver.cuDevicePrimaryCtxRetain(device))
    check("cuCtxSetCurrent", driver.cuCtxSetCurrent(context))
    stream = check("cuStreamCreate", driver.cuStreamCreate(
        driver.CUstream_flags.CU_STREAM_NON_BLOCKING))
    kernels = LoadedKernels(compile_kernel_source("timeslice_probe.cu", code=KERNEL,
                                                  arch=device_arch(0)))
    scratch = check("cuMemAlloc", driver.cuMemAlloc(2 * options.bytes + 64))
    touch_args = TouchArgs(int(scratch) + 2 * options.bytes)
    touch = kernels.launcher("touch", touch_args, grid=1, block=32, stream=stream)

    owner = options.flags_owner
    if me == owner:
        words = WORDS_PER_VARIANT * len(VARIANTS) * 2  # eager, then graphs
        flags = check("cuMemAlloc", driver.cuMemAlloc(4 * words))
        # Rank 0 starts: its words of set 0 are 1, every other word 0.
        rank0_words = ([1, 0] * MAX_GUESTS + [0, 0] * MAX_GUESTS)
        initial = (ctypes.c_uint32 * words)(*(rank0_words * (words // WORDS_PER_VARIANT)))
        check("cuMemcpyHtoD", driver.cuMemcpyHtoD(flags, initial, 4 * words))
        handle = check("cuIpcGetMemHandle", driver.cuIpcGetMemHandle(flags))
        comm.bcast(bytes(handle.reserved), root=owner)
        flags_at = int(flags)
    else:
        raw = comm.bcast(None, root=owner)
        handle = driver.CUipcMemHandle()
        handle.reserved = raw
        flags = check("cuIpcOpenMemHandle", driver.cuIpcOpenMemHandle(
            handle, driver.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS))
        flags_at = int(flags)

    player = Player(me, comm.size, stream, touch, scratch, options.bytes, flags_at,
                    options.leader_kernels)
    results = {}
    for mode in ("eager", "graph"):
        for index, variant in enumerate(VARIANTS):
            slot = index + (len(VARIANTS) if mode == "graph" else 0)
            if mode == "graph":
                graphs = [CapturedGraph(stream, functools.partial(
                    player.turn, variant, slot, flag_set)) for flag_set in (0, 1)]
                turns = [graph.launch for graph in graphs]
            else:
                graphs = []
                turns = [functools.partial(player.turn, variant, slot, flag_set)
                         for flag_set in (0, 1)]
            for round_ in range(50):  # warm-up (an even count: set 0 comes next)
                turns[round_ % 2]()
            check("cuStreamSynchronize", driver.cuStreamSynchronize(stream))
            comm.Barrier()
            start = time.perf_counter()
            for round_ in range(options.rounds):
                turns[round_ % 2]()
            check("cuStreamSynchronize", driver.cuStreamSynchronize(stream))
            results[mode, variant] = (time.perf_counter() - start) / options.rounds * 1e6
            comm.Barrier()
            for graph in graphs:
                graph.close()

    if me == 0:
        mps = check("cuDeviceGetAttribute", driver.cuDeviceGetAttribute(
            driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MPS_ENABLED, device))
        print(f"timeslice probe: {comm.size} ranks on GPU 0, MPS {'on' if mps else 'off'}, "
              f"{options.rounds} rounds, copy of {options.bytes} bytes, "
              f"{options.leader_kernels} kernel(s) a turn on rank 0, flags in rank "
              f"{options.flags_owner}'s memory")
        for variant in VARIANTS:
            print(f"  guests do {variant:<6} " + "  ".join(
                f"{mode} {results[mode, variant]:7.1f}" for mode in ("eager", "graph"))
                + "  us per round")
        if options.result:
            launch = new_launch_id()
            rows = [make_row(op="hand-over", size=options.bytes, algorithm=variant, mode=mode,
                             world_size=comm.size, launch=launch,
                             ours=figure(results[mode, variant]), wrong=None,
                             details={"mps": bool(mps), "figure": "us per round trip (two "
                                      "hand-overs of GPU 0)",
                                      "leader_kernels": options.leader_kernels})
                    for mode in ("eager", "graph") for variant in VARIANTS]
            write_result(options.result, tool="tools/probes/sharing/timeslice_probe.py",
                         world_size=comm.size, rows=rows, exit_status=0,
                         argv=["python3", "tools/probes/sharing/timeslice_probe.py",
                               *sys.argv[1:]])
    comm.Barrier()
    if me != owner:
        check("cuIpcCloseMemHandle", driver.cuIpcCloseMemHandle(flags))
    comm.Barrier()
    if me == owner:
        check("cuMemFree", driver.cuMemFree(flags))
    kernels.close()
    check("cuMemFree", driver.cuMemFree(scratch))
    check("cuStreamDestroy", driver.cuStreamDestroy(stream))
    check("cuDevicePrimaryCtxRelease", driver.cuDevicePrimaryCtxRelease(device))


if __name__ == "__main__":
    main()
