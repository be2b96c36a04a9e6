"""NCCL's reduce-scatter and all-gather on plain buffers and on symmetric windows, with no
ipcshare code in between: does NCCL itself return wrong elements for odd counts?

Our nccl baseline's GPU test saw 2026 of 4099 elements per rank come back wrong from a
float16 sum reduce-scatter, out of place, when timing NCCL on symmetric windows
(docs/BENCHMARKS.md); NCCL through torch.distributed (plain buffers) was exact.
nccl-tests cannot ask for that case: it rounds the count per rank down to a multiple of
16 bytes. This probe calls nccl4py directly, as its documentation shows, on torch
tensors: ``ncclMemAlloc`` buffers registered with ``NCCL_WIN_COLL_SYMMETRIC`` beside plain
``torch.empty`` ones, for several counts per rank, out of place and in place.

    mpiexec -n 2 python tools/probes/baselines/nccl_symmetric_probe.py [--counts 4096,4099]
                                                      [--dtype float16]
                                                      [--op reduce_scatter|all_gather]

Every rank's input holds small integers, so every sum is exact in float16 and the
expected output is known bit for bit. Prints one line per case (path, placement, count,
wrong elements summed over ranks, and the first wrong index with its value) and a JSON
line per case on ``--json FILE``. Exit status 0 when every case ran (wrong elements are a
finding, not a failure of the probe), 1 when NCCL could not be set up.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

DEFAULT_COUNTS = "1,7,4096,4099,4100,4104,65537,1048579"


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", default=DEFAULT_COUNTS,
                        help=f"elements per rank, comma-separated (default {DEFAULT_COUNTS})")
    parser.add_argument("--dtype", default="float16",
                        choices=("float16", "bfloat16", "float32", "uint8"))
    parser.add_argument("--op", default="reduce_scatter",
                        choices=("reduce_scatter", "all_gather"))
    parser.add_argument("--json", metavar="FILE", help="one JSON line per case (rank 0)")
    args = parser.parse_args()
    try:
        args.counts = [int(text) for text in args.counts.split(",")]
    except ValueError:
        parser.error(f"--counts takes whole numbers, comma-separated: {args.counts!r}")
    if any(count < 1 for count in args.counts):
        parser.error("--counts: every count is at least 1")
    return args


def _inputs(torch: Any, dtype: Any, rank: int, size: int, count: int, device: Any) -> Any:
    """This rank's input: ``size`` blocks of ``count`` small integers (at most 8 * size in
    any sum: exact in every 16-bit type)."""
    index = torch.arange(count * size, device=device, dtype=torch.int64)
    return ((index * 7 + rank * 3) % 9 - 4).to(dtype)


def _expected(torch: Any, dtype: Any, rank: int, size: int, count: int, device: Any) -> Any:
    total = sum(_inputs(torch, torch.float32, r, size, count, device) for r in range(size))
    return total[rank * count:(rank + 1) * count].to(dtype)


def _gathered_input(torch: Any, dtype: Any, rank: int, count: int, device: Any) -> Any:
    """This rank's all-gather block: ``count`` values that name the rank and the index
    (0-250, exact in every type, uint8 included)."""
    index = torch.arange(count, device=device, dtype=torch.int64)
    return ((index * 13 + rank * 101) % 251).to(dtype)


def _gathered(torch: Any, dtype: Any, size: int, count: int, device: Any) -> Any:
    return torch.cat([_gathered_input(torch, dtype, r, count, device) for r in range(size)])


def main() -> int:
    args = _parse()
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    try:
        import nccl.core as nccl
        import torch
    except ImportError as exc:
        print(f"nccl_symmetric_probe: needs nccl4py and torch: {exc}", file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        print("nccl_symmetric_probe: no CUDA device", file=sys.stderr)
        return 1
    device = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    dtype = getattr(torch, args.dtype)
    unique_id = nccl.get_unique_id() if rank == 0 else None
    comm = nccl.Communicator.init(size, rank, world.bcast(unique_id, root=0))
    library = nccl.get_version().libnccl
    if rank == 0:
        what = "reduce-scatter sum" if args.op == "reduce_scatter" else "all-gather"
        print(f"# NCCL {library.version if library else 'unknown'}, {size} ranks, "
              f"{what} {args.dtype}; count = elements per rank; wrong = elements summed "
              "over ranks")
        print(f"# {'path':<10} {'placement':<12} {'count':>9} {'wrong':>7}  first wrong")
    stream = torch.cuda.current_stream(device)
    records = []
    windows: list[Any] = []

    def allocate(path: str, elements: int) -> Any:
        nbytes = elements * torch.empty(0, dtype=dtype).element_size()
        if path == "plain":
            return torch.empty(nbytes, dtype=torch.uint8, device=device).view(dtype)
        tensor = nccl.torch.empty(nbytes, dtype=torch.uint8, device=device.index)
        windows.append(comm.register_window(tensor, nccl.WindowFlag.COLL_SYMMETRIC))
        return tensor.view(dtype)

    try:
        for path in ("plain", "symmetric"):
            for placement in ("out-of-place", "in-place"):
                for count in args.counts:
                    if args.op == "reduce_scatter":
                        send = allocate(path, count * size)
                        send.copy_(_inputs(torch, dtype, rank, size, count, device))
                        if placement == "in-place":
                            receive = send[rank * count:(rank + 1) * count]
                        else:
                            receive = allocate(path, count)
                            receive.fill_(255 if dtype == torch.uint8 else float("nan"))
                        comm.reduce_scatter(send, receive, nccl.NcclRedOp.SUM,
                                            stream=stream.cuda_stream)
                        want = _expected(torch, dtype, rank, size, count, device)
                    else:
                        receive = allocate(path, count * size)
                        receive.fill_(255 if dtype == torch.uint8 else float("nan"))
                        if placement == "in-place":
                            send = receive[rank * count:(rank + 1) * count]
                        else:
                            send = allocate(path, count)
                        send.copy_(_gathered_input(torch, dtype, rank, count, device))
                        comm.allgather(send, receive, stream=stream.cuda_stream)
                        want = _gathered(torch, dtype, size, count, device)
                    torch.cuda.synchronize(device)
                    wrong_mask = receive != want
                    wrong = int(wrong_mask.sum())
                    first = None
                    if wrong:
                        at = int(wrong_mask.nonzero()[0])
                        first = {"rank": rank, "index": at, "got": float(receive[at]),
                                 "expected": float(want[at])}
                    totals = world.gather((wrong, first), root=0)
                    world.Barrier()   # no peer still reads a window released below
                    while windows:
                        windows.pop().close()
                    del send, receive
                    if rank == 0:
                        total = sum(found for found, _ in totals)
                        example = next((seen for _, seen in totals if seen), None)
                        said = "" if example is None else (
                            f"rank {example['rank']} [{example['index']}] = {example['got']:g}, "
                            f"expected {example['expected']:g}")
                        print(f"  {path:<10} {placement:<12} {count:>9} {total:>7}  {said}",
                              flush=True)
                        records.append({"op": args.op, "path": path, "placement": placement,
                                        "count": count, "dtype": args.dtype, "ranks": size,
                                        "wrong": total,
                                        "first_wrong": example})
    finally:
        torch.cuda.synchronize(device)
        while windows:
            windows.pop().close()
        comm.destroy()
    if rank == 0 and args.json:
        with open(args.json, "w") as out:
            for record in records:
                out.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
