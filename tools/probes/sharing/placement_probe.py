"""What the placement of a call's arrays costs: a bound ``all_reduce`` (out of place) on
arrays from ``Communicator.empty`` (the heap), on registered arrays
(``Communicator.register``) and on plain torch tensors (bound at their first call, bound
after four calls, and unbound calls), eager back-to-back and replayed in a CUDA graph, µs
per call (rank 0's wall clock).

Made for ranks that share a GPU without MPS, where the lowest rank on the GPU runs the
others' stepped calls, and a guest's own tensors cost it a copy (so a hand-over of the GPU)
until its leader has mapped them (collectives/guest_imports.py); it runs on GPUs of their
own too. Run under mpiexec, e.g.
``mpiexec -n 2 python tools/probes/sharing/placement_probe.py [--algo stepped] [--elements N]
[--result FILE]`` (``--result``: rank 0's figures as a result document, docs/CLI.md).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

import ipcshare
from ipcshare.cli.result_file import RESULT_HELP, write_result
from ipcshare.runtime.result_document import figure, make_row, new_launch_id


def per_call(group, stream, run, calls: int) -> float:
    """Microseconds per call of ``calls`` back-to-back ``run()``, after a warm-up."""
    for _ in range(20):
        run()
    stream.synchronize()
    group.barrier()
    start = time.perf_counter()
    for _ in range(calls):
        run()
    stream.synchronize()
    elapsed = time.perf_counter() - start
    group.barrier()
    return elapsed / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", default="stepped")
    parser.add_argument("--elements", type=int, nargs="+", default=[2048, 262144])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--backend", default="cuda-vmm")
    parser.add_argument("--result", metavar="FILE", help=RESULT_HELP)
    args = parser.parse_args()
    launch = new_launch_id()
    rows = []
    with ipcshare.Group(backend=args.backend) as group:
        device = group.backend.device
        torch.cuda.set_device(device)
        stream = torch.cuda.Stream(device=device)
        largest = max(args.elements) * 4
        lines = [f"ranks {group.world.size}, time-sliced GPUs {group.time_sliced_gpus or 'none'}, "
                 f"algo {args.algo}, float32 all_reduce out of place, us per call"]
        with group.communicator(max_bytes=largest, heap_bytes=2 * largest) as cm, \
                torch.cuda.stream(stream):
            for count in args.elements:
                heap_in = torch.from_dlpack(cm.empty((count,), "float32")).fill_(1)
                heap_out = torch.from_dlpack(cm.empty((count,), "float32"))
                kept = torch.ones(count, device=f"cuda:{device}")
                kept_out = torch.empty_like(kept)
                cm.register(kept)
                cm.register(kept_out)
                user = torch.ones(count, device=f"cuda:{device}")
                user_out = torch.empty_like(user)
                fresh = torch.ones(count, device=f"cuda:{device}")
                fresh_out = torch.empty_like(fresh)

                def bind(source, output, warm_up=0):
                    # A guest's own tensors are handed to its leader over its first calls
                    # (collectives/guest_imports.py); a call bound before that copies.
                    for _ in range(warm_up):
                        cm.all_reduce(source, output=output, algo=args.algo, stream=stream)
                        cm.synchronize(stream)
                        group.barrier()
                    return cm.bind("all_reduce", source, output=output, algo=args.algo,
                                   stream=stream)

                def unbound(source=user, output=user_out):
                    cm.all_reduce(source, output=output, algo=args.algo, stream=stream)

                cases = (("heap", heap_out, bind(heap_in, heap_out)),
                         ("registered", kept_out, bind(kept, kept_out)),
                         ("tensors, bound first", fresh_out, bind(fresh, fresh_out)),
                         ("tensors, bound after 4", user_out, bind(user, user_out, 4)),
                         ("tensors, unbound", user_out, unbound))
                for name, output, bound in cases:
                    eager = per_call(group, stream, bound, args.calls)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, stream=stream):
                        for _ in range(10):
                            bound()
                    graphed = per_call(group, stream, graph.replay, args.calls // 10) / 10
                    cm.synchronize(stream)
                    assert torch.equal(output, torch.full_like(output, group.world.size))
                    lines.append(f"  {count * 4:>9} B  {name:<22} eager {eager:8.1f}  "
                                 f"graph {graphed:8.1f}")
                    rows += [make_row(op="allreduce", size=count * 4, count=count,
                                      dtype="float32", algorithm=args.algo, mode=mode,
                                      world_size=group.world.size, launch=launch,
                                      ours=figure(us), details={"arrays": name})
                             for mode, us in (("eager", eager), ("graph", graphed))]
                    del graph
                del cases, bound, output  # they hold arrays of the heap
                cm.unregister(kept_out)
                cm.unregister(kept)
                del heap_in, heap_out
        if group.rank == 0:
            print("\n".join(lines), flush=True)
        if args.result and group.rank == 0:
            write_result(args.result, tool="tools/probes/sharing/placement_probe.py",
                         world_size=group.world.size, rows=rows, exit_status=0,
                         argv=["python3", "tools/probes/sharing/placement_probe.py",
                               *sys.argv[1:]])


if __name__ == "__main__":
    main()
