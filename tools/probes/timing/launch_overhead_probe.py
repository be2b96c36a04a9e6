"""Host time per call from Python, eager, on GPUs: ``Communicator.all_reduce`` called
each time, the same call bound once (``Communicator.bind``), and a bare
``cuLaunchKernel`` of an empty kernel (the floor any Python launch pays), each next to
the wall time per call of the same back-to-back loop. Run under mpiexec with a GPU per
rank, e.g. ``mpiexec -n 2 python tools/probes/timing/launch_overhead_probe.py [--calls N]
[--result FILE]`` (``--result``: rank 0's figures as a result document, docs/CLI.md).

``--profile`` adds rank 0's cProfile of the unbound calls (where the host time goes).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time

import torch
from cuda.bindings import driver

import ipcshare
from ipcshare.cli.result_file import RESULT_HELP, write_result
from ipcshare.runtime.result_document import figure, make_row, new_launch_id


def timed(group, stream, call, calls: int) -> tuple[float, float]:
    """(host, wall) microseconds per call of ``calls`` back-to-back ``call()``."""
    for _ in range(100):
        call()
    stream.synchronize()
    group.barrier()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    enqueued = time.perf_counter()
    stream.synchronize()
    done = time.perf_counter()
    group.barrier()
    return (enqueued - start) / calls * 1e6, (done - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--elements", type=int, default=1024)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--result", metavar="FILE", help=RESULT_HELP)
    args = parser.parse_args()
    launch = new_launch_id()
    rows = []
    with ipcshare.Group(backend="cuda-vmm") as group:
        device = group.backend.device
        torch.cuda.set_device(device)
        stream = torch.cuda.Stream(device=device)
        tensor = torch.ones(args.elements, device=f"cuda:{device}")
        out = torch.empty_like(tensor)
        lines = []
        with group.communicator(max_bytes=tensor.nbytes) as cm, torch.cuda.stream(stream):
            for algo in ("ll", "one-shot"):
                def call(algo=algo):
                    cm.all_reduce(tensor, output=out, algo=algo, stream=stream)
                bound = cm.bind("all_reduce", tensor, output=out, algo=algo, stream=stream)
                for label, run in ((f"all_reduce algo={algo}", call),
                                   (f"bound all_reduce algo={algo}", bound)):
                    host, wall = timed(group, stream, run, args.calls)
                    lines.append(f"{label:<32} host {host:6.2f} us/call  wall {wall:6.2f}")
                    rows.append(make_row(
                        op="allreduce", size=tensor.nbytes, count=args.elements,
                        dtype="float32", algorithm=algo, mode="eager",
                        world_size=group.world.size, launch=launch,
                        ours=figure(wall, host_us=host), wrong=None,
                        details={"call": "bound" if run is bound else "unbound",
                                 "figures": "rank 0's wall and host time per call"}))
            if args.profile:
                profile = cProfile.Profile()
                if group.rank == 0:
                    profile.enable()
                for _ in range(args.calls):
                    cm.all_reduce(tensor, output=out, algo="ll", stream=stream)
                profile.disable()
                stream.synchronize()
                if group.rank == 0:
                    text = io.StringIO()
                    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(25)
                    lines.append(text.getvalue())
            kernels = group.backend.kernels("empty.cu")
            empty = kernels.function("empty_kernel")
            handle = stream.cuda_stream

            def launch():
                driver.cuLaunchKernel(empty, 1, 1, 1, 32, 1, 1, 0, handle, 0, 0)
            host, wall = timed(group, stream, launch, args.calls)
            lines.append(f"{'bare cuLaunchKernel (empty)':<32} host {host:6.2f} us/call  "
                         f"wall {wall:6.2f}")
            rows.append(make_row(op="launch", size=0, algorithm="cuLaunchKernel (empty)",
                                 mode="eager", world_size=group.world.size, launch=launch,
                                 ours=figure(wall, host_us=host), wrong=None))
        for line in lines:
            print(f"rank {group.rank}: {line}", flush=True)
        if args.result and group.rank == 0:
            write_result(args.result, tool="tools/probes/timing/launch_overhead_probe.py",
                         world_size=group.world.size, rows=rows, exit_status=0,
                         argv=["python3", "tools/probes/timing/launch_overhead_probe.py",
                               *sys.argv[1:]])


if __name__ == "__main__":
    main()
