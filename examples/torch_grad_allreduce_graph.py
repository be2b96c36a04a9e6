"""A PyTorch training step captured whole in a CUDA graph, whose gradient bucket is
all-reduced by ipcshare, checked bit for bit against NCCL at every step.

    mpiexec -n 2 python examples/torch_grad_allreduce_graph.py [--steps K] [--hidden H]

Every rank holds the same small model and its own batch. One step: forward, backward,
the gradients flattened into one bucket, the bucket all-reduced (sum) by a bound
``comm.bind("all_reduce", bucket, stream=s)`` (one kernel launch), the parameters updated
with the mean. The step is captured once in a CUDA graph and replayed with new batches;
the bucket lives in the communicator's window (``comm.empty``), so the all-reduce reads it
in place.

Checked against NCCL (torch.distributed, initialised from the MPI world: rank and size
from mpi4py, a TCP store whose address rank 0 broadcasts over MPI): the graph keeps a
copy of each step's local bucket, NCCL all-reduces that copy, and the two results must
be equal bit for bit. That holds because the step rounds gradients to multiples of
2^-10 within (-2^10, 2^10): every partial sum of up to 8 ranks is then a float32 exactly,
so NCCL's summation order (ring or tree) and ipcshare's (rank order) give the same bits.
Raw float gradients would agree to rounding only (on 2 ranks a + b is still exact-equal,
addition being commutative). The parameters must also end bitwise equal on every rank.
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import sys

import ipcshare
from ipcshare import IpcShareError
from ipcshare.baselines.torch_rendezvous import start_nccl_process_group
from ipcshare.runtime.config import BACKENDS

# Gradients are rounded to multiples of 2^-QUANTUM_BITS below 2^RANGE_BITS in magnitude:
# 20 significant bits, so sums over up to 8 ranks (3 more bits) stay within float32's 24.
QUANTUM_BITS = 10
RANGE_BITS = 10
FEATURES, CLASSES, BATCH = 32, 8, 64
LEARNING_RATE = 0.05


class Refused(Exception):
    """This job cannot run the example; the message says why, in one line, and every rank
    raises it alike."""


def _check_job(group) -> None:
    """Raises Refused (on every rank alike) where the example cannot run."""
    if group.backend_name == "host":
        raise Refused("needs GPUs (CUDA graphs and NCCL), and this group runs on host memory "
                      "(backend host); examples/allreduce_oneshot.py runs there too")
    if group.shared_gpus:
        raise Refused("ranks share a GPU and NCCL needs one GPU per rank: run as many ranks "
                      "as GPUs (launch/bind-gpu.sh binds them)")
    try:
        import torch.distributed as dist
    except ImportError:
        raise Refused("needs torch with CUDA: pip install torch") from None
    if not dist.is_nccl_available():
        raise Refused("this torch has no NCCL backend: install a CUDA build of torch")


def init_nccl(torch, world, device: int) -> None:
    """torch.distributed over NCCL for the MPI world, met at a TCP store rank 0 opens on a
    port the kernel picks (the library's rendezvous: ipcshare.baselines.torch_rendezvous)."""
    import torch.distributed as dist

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")   # never NVLink multicast here
    host = "127.0.0.1" if world.node_count == 1 else socket.gethostname()
    start_nccl_process_group(dist, world.comm, rank=world.rank, size=world.size,
                             device=torch.device("cuda", device),
                             host=world.comm.bcast(host, root=0),
                             timeout=datetime.timedelta(seconds=120))


def start_nccl(group, torch):
    """``(torch.distributed, None)`` once NCCL runs over the MPI world (``init_nccl``),
    else ``(None, why not)``: on every rank alike, so that the other examples skip their
    NCCL comparison together instead of one rank waiting in it."""
    reason = dist = None
    if group.shared_gpus:
        reason = "ranks share a GPU, and NCCL needs a GPU of its own per rank"
    else:
        try:
            import torch.distributed as dist
        except ImportError:
            dist = None
        if dist is None or not dist.is_available() or not dist.is_nccl_available():
            reason = "this torch has no torch.distributed with NCCL"
    reasons = [r for r in group.world.comm.allgather(reason) if r]
    if reasons:
        return None, reasons[0]
    try:
        init_nccl(torch, group.world, group.backend.device)
        error = None
    except Exception as exc:   # whatever stops it, only the comparison is skipped
        error = ("torch.distributed did not start: "
                 f"{(str(exc).splitlines() or [type(exc).__name__])[0]}")
    errors = [e for e in group.world.comm.allgather(error) if e]
    if errors:
        if dist.is_initialized():
            dist.destroy_process_group()
        return None, errors[0]
    return dist, None


def make_batch(torch, rank: int, step: int, device) -> tuple:
    """Rank ``rank``'s batch of ``step`` (different on every rank and step)."""
    generator = torch.Generator().manual_seed(1000 * step + rank)
    inputs = torch.randn(BATCH, FEATURES, generator=generator)
    targets = torch.randn(BATCH, CLASSES, generator=generator)
    return inputs.to(device), targets.to(device)


def quantize_(torch, bucket) -> None:
    """Round to multiples of 2^-QUANTUM_BITS in (-2^RANGE_BITS, 2^RANGE_BITS): exact sums."""
    limit = 2.0 ** RANGE_BITS - 2.0 ** -QUANTUM_BITS
    bucket.mul_(2.0 ** QUANTUM_BITS).round_().div_(2.0 ** QUANTUM_BITS).clamp_(-limit, limit)


def train(group, steps: int, hidden: int) -> tuple[bool, str]:
    """Capture the step, replay it ``steps`` times with new batches, checking each.

    Raises:
        Refused: this job cannot run the example.
    """
    _check_job(group)
    import torch
    import torch.distributed as dist

    world, device = group.world, group.backend.device
    torch.cuda.set_device(device)
    init_nccl(torch, world, device)
    try:
        torch.manual_seed(0)   # the same initial model on every rank
        model = torch.nn.Sequential(torch.nn.Linear(FEATURES, hidden), torch.nn.ReLU(),
                                    torch.nn.Linear(hidden, CLASSES)).cuda()
        params = list(model.parameters())
        numel = sum(p.numel() for p in params)
        stream = torch.cuda.Stream(device)
        with group.communicator(max_bytes=numel * 4) as comm:
            # The bucket in the window: the all-reduce reads it in place, no copy-in.
            bucket = torch.from_dlpack(comm.empty((numel,), "float32"))
            local = torch.empty_like(bucket)   # this rank's bucket before the all-reduce
            all_reduce_bucket = comm.bind("all_reduce", bucket, op="sum", stream=stream)
            static_inputs, static_targets = make_batch(torch, world.rank, 0, "cuda")

            def step() -> None:
                loss = torch.nn.functional.mse_loss(model(static_inputs), static_targets)
                loss.backward()
                torch.cat([p.grad.reshape(-1) for p in params], out=bucket)
                quantize_(torch, bucket)
                local.copy_(bucket)
                all_reduce_bucket()   # one launch on `stream`, captured with the rest
                with torch.no_grad():
                    offset = 0
                    for p in params:
                        mean = bucket[offset:offset + p.numel()].view_as(p) / world.size
                        p.sub_(LEARNING_RATE * mean)
                        offset += p.numel()

            # Warm up on the capture stream (torch's rule for whole-step capture).
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    model.zero_grad(set_to_none=True)
                    step()
            torch.cuda.current_stream().wait_stream(stream)
            model.zero_grad(set_to_none=True)   # gradients then come from the graph's pool
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                step()

            ok = True
            for number in range(1, steps + 1):
                with torch.cuda.stream(stream):   # the batch, then the step, in order
                    inputs, targets = make_batch(torch, world.rank, number, "cuda")
                    static_inputs.copy_(inputs)
                    static_targets.copy_(targets)
                    graph.replay()
                comm.synchronize(stream)   # raises what a kernel recorded
                reference = local.clone()
                dist.all_reduce(reference)  # NCCL, on the same local bucket
                torch.cuda.synchronize()
                ok &= bool(torch.equal(reference, bucket)) and bool(local.abs().sum() > 0)
            flat = torch.cat([p.detach().reshape(-1) for p in params]).cpu().numpy().tobytes()
            same_model = len(set(world.comm.allgather(flat))) == 1
            ok = all(world.comm.allgather(ok)) and same_model
            del graph
    finally:
        dist.destroy_process_group()
    verdict = "equal to NCCL's bit for bit" if ok else "DIFFERENT from NCCL's"
    return ok, (f"{steps} replays of a CUDA graph of one training step on {world.size} ranks "
                f"(bucket of {numel} float32 gradients): all-reduced bucket {verdict} at every "
                f"step; parameters {'identical' if same_model else 'DIFFERENT'} on every rank")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="graph replays, each checked")
    parser.add_argument("--hidden", type=int, default=256, help="hidden units of the model")
    parser.add_argument("--backend", default="auto", choices=BACKENDS,
                        help="auto picks a GPU backend where there is a GPU")
    args = parser.parse_args(argv)
    for flag, value in (("--steps", args.steps), ("--hidden", args.hidden)):
        if value < 1:
            parser.error(f"{flag} must be at least 1, got {value}")
    try:
        with ipcshare.Group(backend=args.backend) as group:
            ok, line = train(group, args.steps, args.hidden)
            if group.rank == 0:
                print(line, flush=True)
    except (Refused, IpcShareError) as exc:  # every rank alike: one line each, no hang
        # One write per line: ranks' lines must not interleave.
        sys.stderr.write(f"torch_grad_allreduce_graph.py: error: {exc}\n")
        return 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
