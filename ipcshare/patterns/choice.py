"""``--algo auto`` for all-gather on GPUs: which algorithm wins at which size, from a table
measured on the H200 nodes (docs/BENCHMARKS.md, "Choosing the algorithm"), not guessed.

Kernels that move bytes with loads and stores and synchronise through flags win while an
operation is short (the copy engine's per-copy launch and the stream memory operations
of its barriers cost more than the bytes); the copy engine wins once the bytes dominate,
since it reaches the link's rate without taking SMs from the user's kernels.
"""

from __future__ import annotations

import bisect
import dataclasses

__all__ = ["AllGatherChoice", "ALLGATHER_CHOICES", "GRAPH_ALLGATHER_CHOICES",
           "IN_PLACE_ALLGATHER_CHOICES", "choose_allgather"]


@dataclasses.dataclass(frozen=True)
class AllGatherChoice:
    """For ``world_size`` ranks: ``algos[i]`` runs sizes (total gathered bytes) up to and
    including ``limits[i]``; the last algorithm runs everything larger."""

    world_size: int
    limits: tuple[int, ...]
    algos: tuple[str, ...]

    def pick(self, size: int) -> str:
        return self.algos[bisect.bisect_left(self.limits, size)]


_MiB = 1 << 20
# The fastest algorithm at each size of a 1 KiB - 1 GiB sweep of every algorithm, eager
# and graph timing (docs/BENCHMARKS.md, "Choosing the algorithm", has the runs):
# 2 ranks on 2 x H200 (commit 81afa9a): push wins up to 16 MiB (in graphs too; pull
# and the kernel ring are never ahead of it), the copy engine from 64 MiB (322 GB/s busbw
# against push's 264). 4 ranks on 4 x H200 (commit 227b153): push up to 64 MiB
# (308 GB/s against the copy engine's 292 there), the copy engine from 256 MiB.
# Those sweeps run all-gathers back to back. On 4 GPUs the copy engine is slower when the
# stream ran a kernel just before (as in real use): out of place 289 / 334 / 341 / 365 GB/s
# at 128 MiB / 256 MiB / 512 MiB / 1 GiB against 336 / 360 / 376 / 384 back to back, while
# push keeps 332-352 either way (tools/probes/timing/allgather_probe.py, variants kernel+X; docs/
# BENCHMARKS.md, "After a kernel"). So push runs up to 128 MiB, where the two tie back to
# back and push is 15% ahead after a kernel; from 256 MiB the copy engine is 5-9% ahead
# back to back and within 3% of push after a kernel. 2 GPUs lose at most 3% after a kernel.
# Up to 2 MiB gathered, 2 ranks: the low-latency protocol (ll, the collectives layer's
# all-gather) takes 3.1-5.2 us in graphs up to 512 KiB where push takes 7.5-10.3, and 10.4
# us at 2 MiB against push's 12.2 and NCCL's 11.1 (2 x H200, 2026-11-23;
# docs/BENCHMARKS.md, "Small messages"); bound eager calls cost a launch from Python either
# way. 4 ranks (4 x H200, 2026-11-27, commit 6d3eb65): ll 5.0-5.8 us in graphs up
# to 128 KiB gathered and 7.9 at 512 KiB against push's 7.5-9.6 and 10.5, eager 7.0-9.1
# against 9.5-12.7; at 2 MiB push is ahead (13.9 against 15.8: ll sends each byte twice
# to three peers), so ll runs up to 512 KiB there, in place and in graphs too.
_KiB = 1 << 10
ALLGATHER_CHOICES = {
    2: AllGatherChoice(2, (2 * _MiB, 16 * _MiB), ("ll", "push", "copy-engine")),
    4: AllGatherChoice(4, (512 * _KiB, 128 * _MiB), ("ll", "push", "copy-engine")),
}
# In place, after a kernel, the 4-GPU copy engine falls to 207-239 GB/s at 128 MiB-1 GiB
# (back to back 326-376) while push keeps its rate: 4 or more ranks push in place at
# every size above ll's 512 KiB. With 2 ranks (2 x H200, 43c800a) push in place
# wins up to 32 MiB both ways:
# 234.6 / 285.6 GB/s at 16 / 32 MiB against the copy engine's 223.5 / 279.2 back to back,
# and 221.8 / 275.6 against 174.9 / 230.2 after a kernel. From 64 MiB the copy engine is
# ahead back to back (335.5 vs 316.6) and within 5% after a kernel, and it keeps 361 / 384
# GB/s after a kernel at 256 MiB / 1 GiB.
IN_PLACE_ALLGATHER_CHOICES = {
    2: AllGatherChoice(2, (2 * _MiB, 32 * _MiB), ("ll", "push", "copy-engine")),
    4: AllGatherChoice(4, (512 * _KiB,), ("ll", "push")),
}
# Inside CUDA graphs the copy engine loses its concurrency on 4 GPUs: the copies to three
# peers, on three side streams when eager, ran at 203 / 215 / 229 GB/s busbw at 64 MiB /
# 256 MiB / 1 GiB against 289 / 346 / 383 eager (4 x H200, 2026-11-22), while push
# in a graph kept its eager rate (322 GB/s at 64 MiB). The cause is the graph-safe barrier:
# copies forked onto side streams after the device_barrier kernel run at ~210 GB/s eagerly
# too (tools/probes/timing/allgather_probe.py, variant full-kbar), while the stream-memop
# barrier, which a replayed graph cannot use (its epochs come from the host), keeps them at
# full rate. So graphs of 4 or more ranks push at every size above ll's 512 KiB; 2 ranks
# keep the eager row until a run says otherwise.
GRAPH_ALLGATHER_CHOICES = {
    2: ALLGATHER_CHOICES[2],
    4: AllGatherChoice(4, (512 * _KiB,), ("ll", "push")),
}


def choose_allgather(size: int, world_size: int, *, graph: bool = False,
                     in_place: bool = False) -> str:
    """The all-gather algorithm for ``size`` total bytes over ``world_size`` GPUs of one
    node, run eagerly or (``graph``) captured in a CUDA graph, out of place or
    (``in_place``) in place: the measured table's row for the nearest world size at or
    below (8 ranks use the 4-rank row; kernels name at most 8 ranks, so more use the copy
    engine). Graphs have their own rows, in place or not."""
    if world_size < 2 or world_size > 8:
        return "copy-engine"
    if graph:
        table = GRAPH_ALLGATHER_CHOICES
    else:
        table = IN_PLACE_ALLGATHER_CHOICES if in_place else ALLGATHER_CHOICES
    known = max(n for n in table if n <= world_size)
    return table[known].pick(size)
