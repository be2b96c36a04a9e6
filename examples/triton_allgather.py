"""An all-gather in a few dozen lines of Triton on ipcshare's memory, checked bit for bit
and timed against NCCL's all_gather_into_tensor, both captured in CUDA graphs.

    mpiexec -n 2 python examples/triton_allgather.py [--sizes 8K,64K,512K,4M]
            [--iters N] [--checks K] [--backend auto|cuda-ipc|cuda-vmm]

Every rank's output and two landing zones lie in the communicator's heap (``comm.empty``),
so every rank reaches every rank's through one peer table
(``ipcshare.triton.device_view(comm)``). Program p of each rank stores its tiles of the
input into block ``rank`` of every peer (``ipt.store`` through a translated pointer,
vectorised: ``align`` is the view's ``alignment()``, 16 bytes on mapped memory) and of its
own output, and meets its peers' program p when done (triton_harness.py says how, and
why a graph replays it with no reset). Up to ZONE_MAX_BYTES a rank, the tiles land in the
peer's zone of the call's parity and each rank copies them into its output after that
one meeting: nobody writes a peer's output, so no meeting on entry guards it, and a zone
a peer fills in call k was last read in call k - 2, which the meeting of call k - 1 shows
finished. Larger inputs go straight into the peers' outputs after a meeting on entry
(every rank's output may be written), where the copy would cost more than the meeting.
Calls of another size (or grid) come after every rank's stream finished the last one, as
between the sizes here. Sizes are each rank's input in bytes (int32 elements: all-gather
moves bits). Exit status 0 when every check passed on every rank.
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

BLOCK = 2048   # int32 per tile: 8 KiB
# Inputs up to this size go through the landing zones (one meeting, then a local copy);
# larger ones straight into the outputs (two meetings, no copy), where the copy of the
# peers' blocks would cost more than the meeting it saves.
ZONE_MAX_BYTES = 1 << 20

if triton is not None:
    import triton.language as tl
    from triton_harness import call_count, end_call, meet

    import ipcshare.triton as ipt

    @triton.jit
    def all_gather_kernel(out, zones, inp, flags, table, count, zone_elements,
                          BLOCK: tl.constexpr, ALIGN: tl.constexpr, ZONES: tl.constexpr):
        me = ipt.rank(table)
        world = ipt.world_size(table)
        epoch = call_count(flags, world)
        mine = me.to(tl.int64) * count   # our block's place, in a zone and in out
        if ZONES:   # into the peers' landing zone of this call's parity
            target = zones + (epoch % 2) * zone_elements
        else:       # straight into the peers' outputs, once every rank's may be written
            meet(flags, table, 2 * epoch - 1, "all")
            target = out
        first, step = tl.program_id(0) * BLOCK, tl.num_programs(0) * BLOCK
        for start in range(first, count, step):
            offsets = start + tl.arange(0, BLOCK)
            mask = offsets < count
            data = tl.load(inp + offsets, mask=mask)
            tl.store(out + mine + offsets, data, mask=mask)
            for peer in range(0, world):
                if peer != me:
                    ipt.store(target + mine + offsets, data, peer, table, mask=mask,
                              align=ALIGN)
        meet(flags, table, 2 * epoch, "all")   # every peer's tiles of this program are here
        if ZONES:   # the peers' blocks, from our zone into our output
            for start in range(first, count, step):
                offsets = start + tl.arange(0, BLOCK)
                mask = offsets < count
                for peer in range(0, world):
                    if peer != me:
                        block = peer.to(tl.int64) * count + offsets
                        tl.store(out + block, tl.load(target + block, mask=mask), mask=mask)
        end_call(flags, world, epoch)


def values(torch, rank: int, check: int, count: int, device: int):
    """Rank ``rank``'s input at ``check``: int32 bits that differ per rank and check."""
    index = torch.arange(count, dtype=torch.int64, device=device)
    return ((index * 2654435761 + rank * 97 + check * 1009) & 0x7FFFFFFF).to(torch.int32)


def measure(setting, count: int) -> tuple[int, int, float, float | None]:
    """All-gather of ``count`` int32 per rank: verified, then timed beside NCCL."""
    torch, dist = setting.torch, setting.dist
    size, rank, device = setting.group.size, setting.group.rank, setting.group.backend.device
    inp = torch.empty(count, dtype=torch.int32, device=device)
    # The heap's area: every rank's output (the peers store into it on large calls), then
    # two landing zones, each as large.
    third = setting.area.numel() // 3
    out = setting.area[:size * count]
    zones = setting.area[third:]
    zone_elements = third
    nccl_out = torch.empty_like(out)
    grid = (programs_for(count, BLOCK),)
    expected = [None]

    def fill(check: int) -> None:
        inp.copy_(values(torch, rank, check, count, device))
        expected[0] = torch.cat([values(torch, r, check, count, device) for r in range(size)])

    def ours() -> None:
        all_gather_kernel[grid](out, zones, inp, setting.flags, setting.view.table, count,
                                zone_elements, BLOCK=BLOCK, ALIGN=setting.view.alignment(),
                                ZONES=count * 4 <= ZONE_MAX_BYTES)

    def theirs() -> None:
        dist.all_gather_into_tensor(nccl_out, inp)

    def wrong() -> tuple[int, int]:
        return (int((out != expected[0]).sum()),
                int((nccl_out != expected[0]).sum()) if dist else 0)

    return measure_with(setting, ours=ours, theirs=theirs, fill=fill, wrong=wrong)


def cli(argv: list[str] | None = None) -> int:
    args, sizes = parse_args(parser_for(__doc__, "8K,64K,512K,4M"), argv, unit=4)
    counts = [size // 4 for size in sizes]

    def run(group, torch, args):
        return sweep(group, torch, args, area=(3 * group.size * max(counts), torch.int32),
                     sizes=counts, measure=measure,
                     recorded=Recorded("allgather", "int32", 4),
                     label=lambda count, us: f"all-gather of {format_size(count * 4)} per "
                                             f"rank on {group.size} ranks")

    return main("triton_allgather.py", args, run)


if __name__ == "__main__":
    sys.exit(cli())
