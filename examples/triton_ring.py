"""``ipcshare ring`` written in Triton: every rank pushes its buffer into the next rank's
window, checked bit for bit and timed against NCCL's send/recv, both in CUDA graphs.

    mpiexec -n 2 python examples/triton_ring.py [--sizes 8K,1M,16M,64M]
            [--iters N] [--checks K] [--backend auto|cuda-ipc|cuda-vmm]

Program p of each rank copies its tiles of the source into the next rank's receive
buffer (``ipt.put``: a block copy through the peer table), which lies in the
communicator's heap. The programs meet only their neighbours' (triton_harness.py): on
entry a rank tells the previous one that its receive buffer is free and waits for the
next one's word; when done it tells the next one that the data has landed and waits for
the previous one's. Times are per step, as the CLI's ring reports them (algbw = bytes per
rank / time). Sizes are bytes per rank (int32 elements). Exit status 0 when every check
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

BLOCK = 4096   # int32 per tile: 16 KiB

if triton is not None:
    import triton.language as tl
    from triton_harness import call_count, end_call, meet

    import ipcshare.triton as ipt

    @triton.jit
    def ring_kernel(received, source, flags, table, count, BLOCK: tl.constexpr,
                    ALIGN: tl.constexpr):
        me = ipt.rank(table)
        world = ipt.world_size(table)
        epoch = call_count(flags, world)
        meet(flags, table, 2 * epoch - 1, "previous")   # the next rank's buffer is free
        ahead = (me + 1) % world
        for start in range(tl.program_id(0) * BLOCK, count, tl.num_programs(0) * BLOCK):
            offsets = start + tl.arange(0, BLOCK)
            mask = offsets < count
            ipt.put(received + offsets, source + offsets, ahead, table, mask=mask,
                    align=ALIGN)
        meet(flags, table, 2 * epoch, "next")           # the previous rank's data is here
        end_call(flags, world, epoch)


def values(torch, rank: int, check: int, count: int, device: int):
    """Rank ``rank``'s block at ``check``: int32 bits that differ per rank and check."""
    index = torch.arange(count, dtype=torch.int64, device=device)
    return ((index * 40503 + rank * 7919 + check * 104729) & 0x7FFFFFFF).to(torch.int32)


def measure(setting, count: int) -> tuple[int, int, float, float | None]:
    """A ring step of ``count`` int32 per rank: verified, then timed beside NCCL."""
    torch, dist = setting.torch, setting.dist
    size, rank, device = setting.group.size, setting.group.rank, setting.group.backend.device
    ahead, behind = (rank + 1) % size, (rank - 1) % size
    source = torch.empty(count, dtype=torch.int32, device=device)
    received = setting.area[:count]
    nccl_received = torch.empty_like(received)
    grid = (programs_for(count, BLOCK),)
    expected = [None]

    def fill(check: int) -> None:
        source.copy_(values(torch, rank, check, count, device))
        expected[0] = values(torch, behind, check, count, device)

    def ours() -> None:
        ring_kernel[grid](received, source, setting.flags, setting.view.table, count,
                          BLOCK=BLOCK, ALIGN=setting.view.alignment())

    def theirs() -> None:
        for request in dist.batch_isend_irecv([
                dist.P2POp(dist.isend, source, ahead),
                dist.P2POp(dist.irecv, nccl_received, behind)]):
            request.wait()

    def wrong() -> tuple[int, int]:
        return (int((received != expected[0]).sum()),
                int((nccl_received != expected[0]).sum()) if dist else 0)

    return measure_with(setting, ours=ours, theirs=theirs, fill=fill, wrong=wrong)


def cli(argv: list[str] | None = None) -> int:
    args, sizes = parse_args(parser_for(__doc__, "8K,1M,16M,64M"), argv, unit=4)
    counts = [size // 4 for size in sizes]

    def run(group, torch, args):
        return sweep(group, torch, args, area=(max(counts), torch.int32), sizes=counts,
                     measure=measure, recorded=Recorded("ring", "int32", 4),
                     skip_nccl="a ring of one rank" if group.size == 1 else None,
                     label=lambda count, us: f"ring step of {format_size(count * 4)} per "
                                             f"rank on {group.size} ranks "
                                             f"({count * 4 / us / 1e3:.1f} GB/s)")

    return main("triton_ring.py", args, run)


if __name__ == "__main__":
    sys.exit(cli())
