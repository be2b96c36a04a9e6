"""A custom collective from ipcshare's public building blocks: a float32 all-reduce by
one-shot pull plus a local sum, checked against NCCL's all_reduce.

    mpiexec -n 4 python examples/allreduce_oneshot.py [--count N] [--iters K]

Every rank copies its input into its window, a stream-ordered barrier says every input is in
place, each rank sums every peer's buffer (read straight from peer memory through zero-copy
torch views) into its output, and a second barrier says every peer is done reading, so the
inputs may be reused. All of it is ordered on one CUDA stream; the host never waits until
the final check.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

import ipcshare


def one_shot_allreduce(window, torch, stream, inputs, output) -> None:
    """Sum every rank's ``inputs`` into ``output`` (float32 tensors on this rank's GPU)."""
    count = inputs.numel()
    with torch.cuda.stream(stream):
        mine = torch.from_dlpack(window.local).view(torch.float32)[:count]
        mine.copy_(inputs)
    window.barrier()          # stream-ordered: every rank's input is in place
    with torch.cuda.stream(stream):
        output.zero_()
        for rank in range(window.world_size):
            peer = torch.from_dlpack(window.peer(rank)).view(torch.float32)[:count]
            output.add_(peer)  # reads peer memory over NVLink, no copy first
    window.barrier()          # every rank has read our input: it may be overwritten


def _init_nccl(torch, comm, device: int) -> None:
    import torch.distributed as dist

    port = None
    if comm.rank == 0:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
    port = comm.bcast(port, root=0)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=comm.rank,
                            world_size=comm.size, device_id=torch.device("cuda", device))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1 << 20, help="float32 elements per rank")
    parser.add_argument("--iters", type=int, default=20, help="timed iterations")
    args = parser.parse_args(argv)
    import torch
    import torch.distributed as dist

    with ipcshare.Group(backend="cuda-vmm") as group:
        comm = group.world.comm
        device = group.backend.device
        torch.cuda.set_device(device)
        _init_nccl(torch, comm, device)
        try:
            window = group.window(args.count * 4)
            stream = torch.cuda.ExternalStream(int(window.engine.stream), device=device)
            generator = torch.Generator(device="cuda").manual_seed(1234 + group.rank)
            inputs = torch.rand(args.count, device="cuda", generator=generator) - 0.5
            output = torch.empty_like(inputs)
            torch.cuda.synchronize()
            one_shot_allreduce(window, torch, stream, inputs, output)
            stream.synchronize()
            reference = inputs.clone()
            dist.all_reduce(reference)
            torch.cuda.synchronize()
            # Same sums, different order of additions: compare with a float32 tolerance.
            error = (output - reference).abs().max().item()
            ok = error <= 1e-5 * group.size
            ok = all(comm.allgather(ok))
            start = time.perf_counter()
            for _ in range(args.iters):
                one_shot_allreduce(window, torch, stream, inputs, output)
            stream.synchronize()
            ours = (time.perf_counter() - start) / args.iters
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(args.iters):
                dist.all_reduce(reference)
            torch.cuda.synchronize()
            nccl = (time.perf_counter() - start) / args.iters
            if group.rank == 0:
                print(f"one-shot all-reduce of {args.count} float32 on {group.size} ranks: "
                      f"{'verified' if ok else 'MISMATCH'} against NCCL (max error {error:.2e}); "
                      f"{ours * 1e6:.1f} us per call, NCCL {nccl * 1e6:.1f} us")
            window.close()
        finally:
            dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
