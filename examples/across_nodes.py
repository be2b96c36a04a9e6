"""Collectives on your own arrays over ranks on several nodes: ``Group.communicator()``
spans nodes by itself (IPC inside each node, NCCL or MPI between them on rails), so the
code is the same as on one node.

    mpiexec -n 4 python examples/across_nodes.py                       # one node
    IPCSHARE_VIRTUAL_NODES=2 mpiexec -n 4 python examples/across_nodes.py   # 2 x 2, simulated
    srun -N 2 --ntasks-per-node=4 python examples/across_nodes.py       # a real cluster
        [--count N] [--iters K] [--backend auto|host|cuda-ipc|cuda-vmm] [--inter auto|nccl|mpi]
        [--result FILE]

Each rank all-reduces, all-gathers and reduce-scatters arrays of its own (numpy on host
memory, torch tensors on GPUs), checks every result for equality (the inputs are small
integers, exact in float32 whatever the summation order) and times the all-reduce. Rank 0
prints one line: the layout, the engine between nodes, the checks and the time per call
(rank 0's clock); ``--result FILE`` writes that time as a result document (docs/CLI.md).
Exit status 0 when every check passed on every rank.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import ipcshare
from ipcshare import IpcShareError
from ipcshare.runtime.config import BACKENDS, INTER_ENGINES


def _arrays(group):
    """(make an array from a numpy array, read one back to numpy, wait for the device, the
    stream calls go on). On GPUs that stream is torch's current one: the calls are then
    ordered after the copies that fill the tensors and before those that read them (by
    default they would go on the communicator's own stream, unordered with torch's)."""
    if group.backend_name == "host":
        return (lambda values: values.copy()), np.asarray, (lambda: None), None
    try:
        import torch
    except ImportError as exc:
        raise IpcShareError(f"the GPU version of this example uses torch, which is not "
                            f"importable here ({exc}); run it with --backend host") from None
    device = f"cuda:{group.backend.device}"
    torch.cuda.set_device(group.backend.device)
    return ((lambda values: torch.from_numpy(values).to(device)),
            (lambda tensor: tensor.cpu().numpy()), torch.cuda.synchronize,
            torch.cuda.current_stream())


def run(group, count: int, iters: int, inter: str) -> tuple[bool, str, dict]:
    """Every collective once, checked, then ``iters`` timed all-reduces: whether every
    rank's checks passed, rank 0's line, and the timing's facts."""
    me, n = group.rank, group.size
    to_array, to_numpy, wait, stream = _arrays(group)
    base = (np.arange(count) % 13).astype(np.float32)
    with group.communicator(max_bytes=n * count * 4, inter=inter) as comm:
        tensor = to_array(base + me)
        comm.all_reduce(tensor, stream=stream)
        ok = bool(np.array_equal(to_numpy(tensor), base * n + n * (n - 1) // 2))
        gathered = to_array(np.zeros(n * count, np.float32))
        comm.all_gather(gathered, to_array(np.full(count, me, np.float32)), stream=stream)
        ok &= bool(np.array_equal(to_numpy(gathered),
                                  np.repeat(np.arange(n, dtype=np.float32), count)))
        block = to_array(np.zeros(count, np.float32))
        comm.reduce_scatter(block, to_array(np.tile(base, n) + me), op="max", stream=stream)
        ok &= bool(np.array_equal(to_numpy(block), base + (n - 1)))
        timed = to_array(base)
        wait()
        group.barrier()
        started = time.perf_counter()
        for _ in range(iters):
            comm.all_reduce(timed, stream=stream)
        wait()
        elapsed_us = (time.perf_counter() - started) / iters * 1e6
        comm.synchronize(stream)  # raises what a kernel recorded (a peer gone, a mismatch)
        engine = getattr(comm, "inter", None)
    world = group.world
    everywhere = all(group.collective("example checks", ok))
    layout = (f"{world.node_count} node(s) x {n // world.node_count} rank(s)"
              + (f", between nodes: {engine}" if engine else ""))
    line = (f"{count} float32 per rank on {n} rank(s), {layout}: all_reduce, all_gather, "
            f"reduce_scatter {'verified' if everywhere else 'WRONG'}; all_reduce "
            f"{elapsed_us:.1f} us per call ({group.backend_name})")
    return everywhere, line, {"time_us": elapsed_us, "nodes": world.node_count,
                              "inter": None if engine is None else str(engine),
                              "backend": group.backend_name}


def write_timing(path: str, facts: dict, *, count: int, size: int, iters: int,
                 exit_status: int) -> None:
    """The timed all-reduce as a result document: rank 0's time per call over ``iters``
    back-to-back calls (eager, from Python). The checks compare whole arrays, so the count
    of wrong elements is not known; the exit status says whether they passed."""
    from ipcshare.cli.result_file import write_result
    from ipcshare.runtime.result_document import figure, make_row, new_launch_id

    nbytes = count * 4
    seconds = facts["time_us"] * 1e-6
    busbw = nbytes / seconds / 1e9 * 2 * (size - 1) / size
    row = make_row(op="allreduce", size=nbytes, count=count, dtype="float32",
                   algorithm="auto", mode="eager", world_size=size, launch=new_launch_id(),
                   ours=figure(facts["time_us"], nbytes / seconds / 1e9, busbw), wrong=None,
                   details={"clock": "rank 0's host clock", "iters": iters,
                            "nodes": facts["nodes"], "between_nodes": facts["inter"],
                            "backend": facts["backend"], "checked": "whole arrays"})
    write_result(path, tool="examples/across_nodes.py", world_size=size, rows=[row],
                 exit_status=exit_status, argv=["python", *sys.argv])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1 << 16, help="float32 elements per rank")
    parser.add_argument("--iters", type=int, default=20, help="timed all-reduces")
    parser.add_argument("--backend", default="auto", choices=BACKENDS)
    parser.add_argument("--inter", default="auto", choices=INTER_ENGINES,
                        help="the engine between nodes (auto: NCCL where it can run)")
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
            ok, line, facts = run(group, args.count, args.iters, args.inter)
            if group.rank == 0:
                print(line, flush=True)
                if args.result:
                    write_timing(args.result, facts, count=args.count, size=group.size,
                                 iters=args.iters, exit_status=0 if ok else 1)
    except IpcShareError as exc:  # every rank alike: one line each, no hang
        sys.stderr.write(f"across_nodes.py: error: {exc}\n")
        return 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
