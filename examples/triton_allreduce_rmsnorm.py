"""A one-shot all-reduce fused with a residual add and an RMSNorm, in one Triton kernel on
ipcshare's memory: h checked bit for bit, y within one bfloat16 step of torch's, and timed
against NCCL's all-reduce followed by torch's add and ``rms_norm``, both captured in CUDA
graphs.

    mpiexec -n 2 python examples/triton_allreduce_rmsnorm.py [--sizes 8K,64K,512K,4M]
            [--hidden 4096] [--iters N] [--checks K] [--backend auto|cuda-ipc|cuda-vmm]

What a transformer layer does after a tensor-parallel matmul: ``h = all_reduce(x) +
residual``, ``y = rms_norm(h) * weight``, both h and y kept. A library call cannot fuse
the reduction with what follows; a kernel on ipcshare's memory can. ``x`` lies in the
communicator's heap (``comm.empty``), so program p of every rank reads its rows of every
rank's ``x`` in place (``ipt.load`` through the peer table), sums them in rank order in
float32, adds the residual, writes h and normalises it, all in one pass; the programs
meet their peers' on entry and when done (triton_harness.py). NCCL's all-reduce works in
place, so its step first copies x into NCCL's buffer (a framework must, when x is still
needed); that copy is timed with it.

Exact on purpose: x and the residual are bfloat16 multiples of 1/4 in [-2, 2), so every
sum over up to 8 ranks is a bfloat16 exactly whatever the order: h is compared bit for
bit with the sum every rank computes alone, for ours and for NCCL's. y goes through a
square root, which torch and Triton may round differently in the last place: it must be
within one bfloat16 step (2^-7 relative) of torch's ``rms_norm`` of the exact h. Sizes
are bytes of x per rank, multiples of a row (2 * hidden). Exit status 0 when every check
passed on every rank.
"""

from __future__ import annotations

import sys

from triton_harness import main, measure_with, parse_args, parser_for, programs_for, sweep, triton

from ipcshare.runtime.config import format_size

EPS = 1e-6
MAX_HIDDEN = 16384

if triton is not None:
    import triton.language as tl
    from triton_harness import call_count, end_call, meet

    import ipcshare.triton as ipt

    @triton.jit
    def all_reduce_rmsnorm_kernel(y, h, x, residual, weight, flags, table, rows, hidden, eps,
                                  BLOCK: tl.constexpr, WORLD: tl.constexpr,
                                  ALIGN: tl.constexpr):
        world = ipt.world_size(table)   # == WORLD, the group's size the launch names
        epoch = call_count(flags, world)
        meet(flags, table, 2 * epoch - 1, "all")   # every rank's x of this call is written
        cols = tl.arange(0, BLOCK)
        mask = cols < hidden
        w = tl.load(weight + cols, mask=mask, other=0.0).to(tl.float32)
        for row in range(tl.program_id(0), rows, tl.num_programs(0)):
            offsets = row.to(tl.int64) * hidden + cols
            # Unrolled over the ranks (WORLD is a compile-time constant): the loads of
            # every rank's row are independent of the sums, so they are all in flight
            # before the first sum waits (one NVLink round trip a row where a loop over a
            # runtime count waited once per rank). The sums stay in rank order: the same
            # bits everywhere.
            total = tl.zeros([BLOCK], dtype=tl.float32)
            for peer in tl.static_range(WORLD):
                total += ipt.load(x + offsets, peer, table, mask=mask, other=0.0,
                                  align=ALIGN).to(tl.float32)
            total += tl.load(residual + offsets, mask=mask, other=0.0).to(tl.float32)
            rounded = total.to(h.dtype.element_ty)
            tl.store(h + offsets, rounded, mask=mask)
            value = rounded.to(tl.float32)
            scale = tl.rsqrt(tl.sum(value * value, axis=0) / hidden + eps)
            tl.store(y + offsets, (value * scale * w).to(y.dtype.element_ty), mask=mask)
        meet(flags, table, 2 * epoch, "all")       # no rank still reads our x
        end_call(flags, world, epoch)


def quarters(torch, seed: int, shape: tuple[int, ...], device: int):
    """bfloat16 multiples of 1/4 in [-2, 2), seeded."""
    generator = torch.Generator().manual_seed(seed)
    return (torch.randint(-8, 8, shape, generator=generator).float() / 4).to(
        torch.bfloat16).to(device)


def measure(setting, rows: int) -> tuple[int, int, float, float | None]:
    """``rows`` x ``hidden``: verified, then timed beside NCCL + torch."""
    torch, dist, hidden = setting.torch, setting.dist, setting.args.hidden
    size, rank, device = setting.group.size, setting.group.rank, setting.group.backend.device
    shape = (rows, hidden)
    x = setting.area[:rows * hidden].view(shape)
    residual = torch.empty(shape, dtype=torch.bfloat16, device=device)
    weight = (torch.arange(hidden, device=device) % 5 + 3).to(torch.bfloat16) / 4
    h, y = torch.empty_like(residual), torch.empty_like(residual)
    nccl_buffer, nccl_h, nccl_y = (torch.empty_like(residual) for _ in range(3))
    grid = (programs_for(rows, 1),)
    block = triton.next_power_of_2(hidden)
    expected = [None]

    def fill(check: int) -> None:
        x.copy_(quarters(torch, 1000 * check + rank, shape, device))
        residual.copy_(quarters(torch, 1000 * check + 999, shape, device))
        total = sum(quarters(torch, 1000 * check + r, shape, device).float()
                    for r in range(size))
        expected[0] = (total + residual.float()).to(torch.bfloat16)

    def ours() -> None:
        all_reduce_rmsnorm_kernel[grid](y, h, x, residual, weight, setting.flags,
                                        setting.view.table, rows, hidden, EPS, BLOCK=block,
                                        WORLD=size, ALIGN=setting.view.alignment())

    def theirs() -> None:
        nccl_buffer.copy_(x)
        dist.all_reduce(nccl_buffer)
        torch.add(nccl_buffer, residual, out=nccl_h)
        nccl_y.copy_(torch.nn.functional.rms_norm(nccl_h, (hidden,), weight, EPS))

    def wrong() -> tuple[int, int]:
        reference = torch.nn.functional.rms_norm(expected[0], (hidden,), weight, EPS).float()
        far = (y.float() - reference).abs() > reference.abs() * 2.0 ** -7 + 1e-6
        bits = expected[0].view(torch.int16)
        mine = int((h.view(torch.int16) != bits).sum()) + int(far.sum())
        nccl = int((nccl_h.view(torch.int16) != bits).sum()) if dist else 0
        return mine, nccl

    return measure_with(setting, ours=ours, theirs=theirs, fill=fill, wrong=wrong)


def cli(argv: list[str] | None = None) -> int:
    parser = parser_for(__doc__, "8K,64K,512K,4M")
    parser.add_argument("--hidden", type=int, default=4096, help="bfloat16 per row")
    known, _ = parser.parse_known_args(argv)
    if not 1 <= known.hidden <= MAX_HIDDEN:
        parser.error(f"--hidden must be between 1 and {MAX_HIDDEN}, got {known.hidden}")
    args, sizes = parse_args(parser, argv, unit=2 * known.hidden)
    row_counts = [size // (2 * args.hidden) for size in sizes]

    def run(group, torch, args):
        return sweep(group, torch, args, area=(max(row_counts) * args.hidden, torch.bfloat16),
                     sizes=row_counts, measure=measure,
                     exactness="(h bit for bit, y within one bfloat16 step of rms_norm)",
                     label=lambda rows, us: f"all-reduce + residual + RMSNorm of "
                                            f"{format_size(rows * args.hidden * 2)} ({rows} x "
                                            f"{args.hidden} bfloat16) on {group.size} ranks")

    return main("triton_allreduce_rmsnorm.py", args, run)


if __name__ == "__main__":
    sys.exit(cli())
