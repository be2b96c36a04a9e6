"""A one-shot all-reduce fused with a residual add and an RMSNorm, in one Triton kernel on
ipcshare's memory: h checked bit for bit, y within one bfloat16 step of torch's, and timed
against NCCL's all-reduce followed by torch's add and ``rms_norm``, both captured in CUDA
graphs.

    mpiexec -n 2 python examples/triton_allreduce_rmsnorm.py [--sizes 8K,64K,512K,4M]
            [--hidden 4096] [--iters N] [--checks K] [--backend auto|cuda-ipc|cuda-vmm]

What a transformer layer does after a tensor-parallel matmul: ``h = all_reduce(x) +
residual``, ``y = rms_norm(h) * weight``, both h and y kept. A library call cannot fuse
the reduction with what follows; a kernel on ipcshare's memory can. Two landing zones
lie in the communicator's heap (``comm.empty``). Program p of every rank stores its rows
of ``x`` into block ``rank`` of every rank's zone of the call's parity (``ipt.store``
through the peer table, vectorised by the view's ``alignment()``), meets its peers'
program p once (triton_harness.py), then sums its rows of every rank's block in rank
order in float32, adds the residual, writes h and normalises it. Nobody reads a peer's
``x``, so no meeting guards it on exit; a zone of parity p that a peer fills in call k
was last read in call k - 2, which the meeting of call k - 1 shows finished. Calls of
another size (or grid) come after every rank's stream finished the last one, as between
the sizes here. NCCL's all-reduce works in place, so its step first copies x into
NCCL's buffer (a framework must, when x is still needed); that copy is timed with it.

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

from triton_harness import (
    Recorded,
    main,
    measure_with,
    parse_args,
    parser_for,
    programs_for,
    sweep,
    triton,
)

from ipcshare.runtime.config import format_size

EPS = 1e-6
MAX_HIDDEN = 16384

if triton is not None:
    import triton.language as tl
    from triton_harness import call_count, end_call, meet

    import ipcshare.triton as ipt

    @triton.jit
    def all_reduce_rmsnorm_kernel(y, h, x, zones, residual, weight, flags, table, rows,
                                  hidden, zone_elements, eps, BLOCK: tl.constexpr,
                                  WORLD: tl.constexpr, ALIGN: tl.constexpr):
        me = ipt.rank(table)
        world = ipt.world_size(table)   # == WORLD, the group's size the launch names
        epoch = call_count(flags, world)
        zone = zones + (epoch % 2) * zone_elements   # this call's landing zone
        # tl.cast: the launcher passes rows == 1 as a plain int (no .to)
        block = tl.cast(rows, tl.int64) * hidden     # one rank's x in a zone
        cols = tl.arange(0, BLOCK)
        mask = cols < hidden
        # Our rows into block `me` of every rank's zone, ours included (stores: NVLink
        # carries them faster than loads come back).
        for row in range(tl.program_id(0), rows, tl.num_programs(0)):
            offsets = row.to(tl.int64) * hidden + cols
            mine = tl.load(x + offsets, mask=mask)
            for peer in tl.static_range(WORLD):
                ipt.store(zone + me * block + offsets, mine, peer, table, mask=mask,
                          align=ALIGN)
        meet(flags, table, epoch, "all")   # every rank's rows of this program are here
        w = tl.load(weight + cols, mask=mask, other=0.0).to(tl.float32)
        for row in range(tl.program_id(0), rows, tl.num_programs(0)):
            offsets = row.to(tl.int64) * hidden + cols
            # Summed in rank order (unrolled: every rank's row is loaded before the first
            # sum waits): the same bits on every rank.
            total = tl.zeros([BLOCK], dtype=tl.float32)
            for peer in tl.static_range(WORLD):
                total += tl.load(zone + peer * block + offsets, mask=mask, other=0.0).to(
                    tl.float32)
            total += tl.load(residual + offsets, mask=mask, other=0.0).to(tl.float32)
            rounded = total.to(h.dtype.element_ty)
            tl.store(h + offsets, rounded, mask=mask)
            value = rounded.to(tl.float32)
            scale = tl.rsqrt(tl.sum(value * value, axis=0) / hidden + eps)
            tl.store(y + offsets, (value * scale * w).to(y.dtype.element_ty), mask=mask)
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
    x = torch.empty(shape, dtype=torch.bfloat16, device=device)
    zones = setting.area   # two zones of every rank's x at the largest size, in the heap
    zone_elements = zones.numel() // 2
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
        all_reduce_rmsnorm_kernel[grid](y, h, x, zones, residual, weight, setting.flags,
                                        setting.view.table, rows, hidden, zone_elements, EPS,
                                        BLOCK=block, WORLD=size,
                                        ALIGN=setting.view.alignment())

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
        return sweep(group, torch, args,
                     area=(2 * group.size * max(row_counts) * args.hidden, torch.bfloat16),
                     sizes=row_counts, measure=measure,
                     recorded=Recorded("allreduce-rmsnorm", "bfloat16", 2 * args.hidden),
                     exactness="(h bit for bit, y within one bfloat16 step of rms_norm)",
                     label=lambda rows, us: f"all-reduce + residual + RMSNorm of "
                                            f"{format_size(rows * args.hidden * 2)} ({rows} x "
                                            f"{args.hidden} bfloat16) on {group.size} ranks")

    return main("triton_allreduce_rmsnorm.py", args, run)


if __name__ == "__main__":
    sys.exit(cli())
