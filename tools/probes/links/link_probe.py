"""What do thread blocks reach over NVLink, loading from a peer (pull) or storing into it
(push), against the copy engine? Two GPUs of one process with peer access, both copying at
once in opposite directions (a 2-rank all-to-all's traffic), by grid and by 16-byte loads
in flight per thread. A tuning tool for the GPU nodes (our all-to-all pulls),
not a benchmark: figures in docs/BENCHMARKS.md come from `ipcshare alltoall`.

    python3 tools/probes/links/link_probe.py [--sizes 32M,128M] [--grids 32,64,128,132]
                                [--unrolls 4,8,16] [--iters 10] [--result FILE]

Variants, each run on GPUs 0 and 1 at once (GPU g's peer is 1 - g), SIZE bytes each way:
  pull          every block loads the peer's source, stores into its own output
  push          every block loads its own source, stores into the peer's output
  pull+own      half the grid pulls SIZE, the other half copies SIZE locally (a 2-rank
                all-to-all's own segment beside the peer's, as the balanced kernel cuts it)
  push+own      the same with a push
  ce            cuMemcpyAsync of SIZE into the peer's output (the copy engine)
  ce+own        the same, and a kernel of the whole grid copying SIZE locally on a second
                stream at the same time

The figure is the rate of the remote bytes, per direction (GB/s), of the slower GPU;
every variant's output is checked once against its source, byte for byte (exit status 3
when a byte differs). ``--result FILE`` writes every figure as a result document
(docs/CLI.md): op ``peer-copy``, the variant, grid and unroll as its algorithm.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from ipcshare.cli.result_file import RESULT_HELP, write_result  # noqa: E402
from ipcshare.p2p.gpus import GpuHandles, GpuSet  # noqa: E402
from ipcshare.p2p.peer_access import disable_peer_access, enable_peer_access  # noqa: E402
from ipcshare.runtime.config import parse_size  # noqa: E402
from ipcshare.runtime.cuda_driver import check, driver  # noqa: E402
from ipcshare.runtime.result_document import figure, make_row, new_launch_id  # noqa: E402

KERNELS = Path(__file__).resolve().with_name("link_probe_kernels.cu")
THREADS = 512
UNROLLS = (2, 4, 8, 16)  # the probe_u* entry points of the kernels file


class ProbeArgs(ctypes.Structure):
    """``ProbeArgs`` of tools/probes/links/link_probe_kernels.cu."""

    _fields_ = [("dst", ctypes.c_void_p * 2), ("src", ctypes.c_void_p * 2),
                ("vectors", ctypes.c_ulonglong * 2), ("split", ctypes.c_int)]


class Probe(GpuHandles):
    """Buffers, kernels, a second stream and timing events on GPUs 0 and 1 (one owner:
    ``close`` releases all of it, idempotently)."""

    def __init__(self, gpus: GpuSet, nbytes: int) -> None:
        super().__init__(gpus)
        self.nbytes = nbytes
        try:
            self.kernels, self.side, self.events = [], [], []
            self.source, self.output, self.local = [], [], []
            for gpu in range(2):
                self.kernels.append(self.load_kernels(gpu, KERNELS))
                self.side.append(self.new_stream(gpu))
                pair = []
                for _ in range(2):
                    event = check("cuEventCreate", driver.cuEventCreate(0))
                    self.own(gpu, driver.cuEventDestroy, event)
                    pair.append(event)
                self.events.append(pair)
                # source: what goes to the peer (and the local copy's source);
                # output: where the peer's bytes land; local: the local copy's output.
                self.source.append(gpus.allocate(gpu, nbytes))
                self.output.append(gpus.allocate(gpu, nbytes))
                self.local.append(gpus.allocate(gpu, nbytes))
                pattern = np.random.default_rng(gpu).integers(0, 256, nbytes, np.uint8)
                gpus.upload(gpu, self.source[gpu], pattern)
        except BaseException:
            self.close()
            raise

    def _launch(self, gpu: int, unroll: int, grid: int, pairs: list[tuple[int, int]],
                split: int, stream) -> None:
        args = ProbeArgs()
        vectors = self.nbytes // 16
        for k, (dst, src) in enumerate(pairs):
            args.dst[k], args.src[k], args.vectors[k] = dst, src, vectors
        args.split = split
        params = (ctypes.c_void_p * 1)(ctypes.addressof(args))
        check("cuLaunchKernel", driver.cuLaunchKernel(
            self.kernels[gpu].function(f"probe_u{unroll}"), grid, 1, 1, THREADS, 1, 1, 0,
            stream, ctypes.addressof(params), 0))

    def _enqueue(self, variant: str, gpu: int, grid: int, unroll: int) -> None:
        peer = 1 - gpu
        stream = self.gpus.streams[gpu]
        own = (self.local[gpu], self.source[gpu])
        if variant in ("pull", "pull+own"):
            remote = (self.output[gpu], self.source[peer])
        else:
            remote = (self.output[peer], self.source[gpu])
        if variant in ("pull", "push"):
            self._launch(gpu, unroll, grid, [remote], grid, stream)
        elif variant in ("pull+own", "push+own"):
            self._launch(gpu, unroll, grid, [remote, own], grid // 2, stream)
        else:  # ce, ce+own
            check("cuMemcpyAsync", driver.cuMemcpyAsync(remote[0], remote[1], self.nbytes,
                                                       stream))
            if variant == "ce+own":
                self._launch(gpu, unroll, grid, [own], grid, self.side[gpu])

    def time(self, variant: str, grid: int, unroll: int, iters: int, warmup: int) -> float:
        """Microseconds per operation of the slower GPU."""
        for _ in range(warmup):
            for gpu in range(2):
                self.gpus.activate(gpu)
                self._enqueue(variant, gpu, grid, unroll)
        self._settle()
        for gpu in range(2):
            self.gpus.activate(gpu)
            check("cuEventRecord", driver.cuEventRecord(self.events[gpu][0],
                                                        self.gpus.streams[gpu]))
        for _ in range(iters):
            for gpu in range(2):
                self.gpus.activate(gpu)
                self._enqueue(variant, gpu, grid, unroll)
        for gpu in range(2):
            self.gpus.activate(gpu)
            if variant == "ce+own":  # the timed stream waits for the side stream's copies
                event = check("cuEventCreate", driver.cuEventCreate(
                    int(driver.CUevent_flags.CU_EVENT_DISABLE_TIMING)))
                check("cuEventRecord", driver.cuEventRecord(event, self.side[gpu]))
                check("cuStreamWaitEvent", driver.cuStreamWaitEvent(
                    self.gpus.streams[gpu], event, 0))
                check("cuEventDestroy", driver.cuEventDestroy(event))
            check("cuEventRecord", driver.cuEventRecord(self.events[gpu][1],
                                                        self.gpus.streams[gpu]))
        self._settle()
        slowest = 0.0
        for gpu in range(2):
            self.gpus.activate(gpu)
            ms = check("cuEventElapsedTime", driver.cuEventElapsedTime(*self.events[gpu]))
            slowest = max(slowest, float(ms))
        return slowest * 1e3 / iters

    def _settle(self) -> None:
        for gpu in range(2):
            self.gpus.activate(gpu)
            check("cuStreamSynchronize", driver.cuStreamSynchronize(self.gpus.streams[gpu]))
            check("cuStreamSynchronize", driver.cuStreamSynchronize(self.side[gpu]))

    def wrong(self, variant: str) -> int:
        """Bytes that differ from their source after ``variant`` ran, over both GPUs."""
        bad = 0
        for gpu in range(2):
            expect = self.gpus.download(gpu, self.source[gpu], self.nbytes)
            got = self.gpus.download(1 - gpu, self.output[1 - gpu], self.nbytes)
            bad += int((got != expect).sum())
            if "+own" in variant:
                bad += int((self.gpus.download(gpu, self.local[gpu], self.nbytes)
                            != expect).sum())
        return bad

    def clear(self) -> None:
        for gpu in range(2):
            self.gpus.fill(gpu, self.output[gpu], 0xA5, self.nbytes)
            self.gpus.fill(gpu, self.local[gpu], 0xA5, self.nbytes)


def _list(text: str, kind=int) -> list:
    return [kind(item) for item in text.split(",") if item]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="32M,128M", help="bytes each way, comma-separated")
    parser.add_argument("--grids", default="32,64,128,132")
    parser.add_argument("--unrolls", default="4,8,16")
    parser.add_argument("--variants", default="pull,push,pull+own,push+own,ce,ce+own")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--result", metavar="FILE", help=RESULT_HELP)
    args = parser.parse_args(argv)
    launch, rows = new_launch_id(), []
    sizes = _list(args.sizes, parse_size)
    grids, unrolls = _list(args.grids), _list(args.unrolls)
    variants = [v for v in args.variants.split(",") if v]
    if any(u not in UNROLLS for u in unrolls):
        parser.error(f"--unrolls: each of {', '.join(map(str, UNROLLS))}")
    if any(s % 16 for s in sizes):
        parser.error("--sizes: multiples of 16 bytes")
    with GpuSet(2) as gpus:
        pairs = enable_peer_access(gpus)
        try:
            if not all(pair.enabled for pair in pairs):
                print("link_probe: GPUs 0 and 1 have no peer access: "
                      + "; ".join(p.reason for p in pairs if not p.enabled), file=sys.stderr)
                return 2
            for size in sizes:
                probe = Probe(gpus, size)
                try:
                    print(f"# {size >> 20} MiB each way, GPUs 0 and 1 at once, {THREADS} "
                          "threads a block; remote GB/s per direction (us per operation)")
                    print(f"{'variant':<10} {'grid':>5} " + " ".join(
                        f"{f'U={u}':>16}" for u in unrolls) + "   wrong")
                    for variant in variants:
                        kernel_free = variant == "ce"
                        for grid in grids[:1] if kernel_free else grids:
                            cells, wrong = [], 0
                            for k, unroll in enumerate(unrolls[:1] if kernel_free else unrolls):
                                if k == 0:
                                    probe.clear()
                                us = probe.time(variant, grid, unroll, args.iters, args.warmup)
                                if k == 0:
                                    wrong = probe.wrong(variant)
                                cells.append(f"{size / us / 1e3:7.1f} ({us:6.1f})")
                                rows.append(make_row(
                                    op="peer-copy", size=size, dtype="uint8", mode="eager",
                                    algorithm=variant if kernel_free else
                                    f"{variant} grid={grid} unroll={unroll}",
                                    world_size=1, launch=launch,
                                    ours=figure(us, size / us / 1e3),
                                    wrong=wrong if k == 0 else None,
                                    details={"figure": "remote bytes per direction of the "
                                             "slower GPU; wrong counts bytes, checked on the "
                                             "first unroll"}))
                            label = "-" if kernel_free else str(grid)
                            print(f"{variant:<10} {label:>5} "
                                  + " ".join(f"{c:>16}" for c in cells) + f"   {wrong}",
                                  flush=True)
                finally:
                    probe.close()
        finally:
            disable_peer_access(gpus, pairs)
    wrong_bytes = sum(row["wrong"] or 0 for row in rows)
    status = 3 if wrong_bytes else 0
    if args.result:
        write_result(args.result, tool="tools/probes/links/link_probe.py", world_size=1,
                     rows=rows, exit_status=status,
                     argv=["python3", "tools/probes/links/link_probe.py",
                           *(sys.argv[1:] if argv is None else argv)])
    return status


if __name__ == "__main__":
    sys.exit(main())
