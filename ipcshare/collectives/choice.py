"""``algo="auto"``: which algorithm runs a call, by collective, size and world size,
from measured tables (like patterns/choice.py for the CLI's all-gather)."""

from __future__ import annotations

import bisect
import dataclasses

from .scratch import LL_MAX_BYTES

__all__ = ["Choice", "HOST_CHOICES", "CUDA_CHOICES", "SHARED_GPU_CHOICE", "choose"]


@dataclasses.dataclass(frozen=True)
class Choice:
    """``algos[i]`` runs calls of up to and including ``limits[i]`` bytes (the call's
    largest array); the last algorithm runs everything larger."""

    limits: tuple[int, ...]
    algos: tuple[str, ...]

    def pick(self, nbytes: int) -> str:
        return self.algos[bisect.bisect_left(self.limits, nbytes)]


_KiB = 1 << 10
_MiB = 1 << 20
# Host memory, by world size (the row of the nearest world size at or below is used).
# All-gather and reduce-scatter have one host algorithm each. All-reduce was measured on
# the 2-core development VM (Intel Xeon, 2026-11-23), float32 arrays outside the window:
#   mpiexec -n N ipcshare allreduce --algo one-shot|two-shot -b 16K -e 4M -f 2 -n 50
# (commit 7b6c65f), and timing loops over Communicator.all_reduce (commit a05e052):
#   2 ranks: one-shot 24 / 38 / 45 us at 1 / 64 / 96 KiB against two-shot's 32 / 41 / 46;
#   from 128 KiB two-shot leads: 51-54 vs 53-69 us, 70 vs 94 us at 256 KiB, 283 vs 437
#   at 1 MiB, 1017 vs 1234 at 4 MiB (one rank reduces half the bytes, and the copies
#   back are cheap).
#   3 ranks (more ranks than cores, so only indicative): even at 192-512 KiB, two-shot
#   ahead from 1 MiB (686 vs 775 us). 4 ranks, oversubscribed twice, use that row.
# A machine with a core per rank is likely to favour two-shot earlier at 3-4 ranks.
HOST_CHOICES: dict[str, dict[int, Choice]] = {
    "all_gather": {1: Choice((), ("copy-engine",))},
    "reduce_scatter": {1: Choice((), ("one-shot",))},
    # One algorithm each, so every rank picks it whatever its own sizes (all-to-all-v's
    # differ from rank to rank): a second one needs a rule the ranks agree on.
    "all_to_all": {1: Choice((), ("pull",))},
    "all_to_all_v": {1: Choice((), ("pull",))},
    "all_reduce": {1: Choice((), ("one-shot",)),
                   2: Choice((96 * _KiB,), ("one-shot", "two-shot")),
                   3: Choice((512 * _KiB,), ("one-shot", "two-shot"))},
}


# GPU memory (kernels of kernels/src/collectives/). Small calls run the low-latency
# protocols (ll, ll-two-shot, ll128), middle sizes the one-shot / two-shot / pull kernels,
# the largest reductions push. All-reduce: one-shot reads n times the bytes two-shot reads
# but meets its peers once instead of twice. Measured on 2 x H200 (2026-11-23, commit
# 3c30cab, `ipcshare allreduce --algo one-shot|two-shot -b 8 -e 32M -f 4 [--graph]`):
# on 2 GPUs one-shot beats two-shot at every size (graph: 7.8 / 11.0 / 16.2 / 39.1 / 137 us
# at 8 B / 512 KiB / 2 MiB / 8 MiB / 32 MiB against two-shot's 11.9 / 16.9 / 21.1 / 44.1 /
# 144), since each rank reads one peer either way. With 3 or more ranks two-shot runs
# what ll does not (above 512 KiB; measured below), up to push's rows at 4 and more.
# The low-latency protocol (ll), 2 ranks on 2 x H200 (2026-11-23, commit 9809801,
# `ipcshare allreduce|allgather --algo ll|one-shot|pull|push -b 8 -e 4M -f 4 --graph`):
# all-reduce 3.2-4.0 us up to 32 KiB, 4.6 at 128 KiB, 7.3 at 512 KiB against one-shot's
# 7.5-9.0, 9.9 and 10.9; all-gather 3.1-3.6 us up to 32 KiB gathered, 4.1 at 128 KiB and
# 5.2 at 512 KiB against pull's 7.9-9.4, 11.7 and 12.9; reduce-scatter (commit 5ae108a)
# 3.5-4.1 us up to 32 KiB, 4.5 at 128 KiB, 6.0 at 512 KiB against one-shot's 7.9-9.3,
# 10.0 and 10.7 (and NCCL's 3.7-4.6, 6.4, 7.8). Its buffers take inputs of up to
# 2 MiB (scratch.LL_MAX_BYTES). From 512 KiB to 2 MiB (same node kind and day, commit
# 78dd026): all-gather ll 5.3 / 10.4 us at 512 KiB / 2 MiB gathered against pull
# 12.9 / 14.5 and NCCL's 8.0 / 11.1, so ll ran 2-rank all-gathers up to 2 MiB (ll128
# since, below); all-reduce ll 7.4 / 18.4 us against one-shot's 10.9 / 16.2, so
# all-reduce switches at 512 KiB.
# 3 and 4 ranks (4 x H200, 2026-11-27, commit 6d3eb65, `tools/gpu_check.py latency`:
# `ipcshare allgather|allreduce|reducescatter --algo ll|auto|push|one-shot -b 8 -e 2M -f 4
# [--graph] --baseline nccl`; docs/bench/gpu-check-h200-x4-2026-11-27/5-auto-rows-6d3eb65.md
# is tools/analysis/auto_rows.py's reading): in graphs ll takes 5.0-5.8 us up to 32 KiB at 4 ranks
# (4.0-5.1 at 3) where the kernels auto ran took 7.5-12 (NCCL: 3.7-4.6). At 4 ranks ll
# stays ahead up to 512 KiB: all-gather 7.9 us against push's 10.5 (NCCL 8.6),
# all-reduce 15.1 against one-shot's 16.0 and two-shot's 22.0 (NCCL 13.2), reduce-scatter
# 8.2 against one-shot's 14.2 (NCCL 9.2), eager alike. At 2 MiB each rank's ll pushes
# twice its bytes to every peer: all-gather 15.8 against push's 13.9, all-reduce 47.7
# against two-shot's 26.8; reduce-scatter still wins there (15.6 against 17.8), as each
# rank pushes only a block to each peer. 3 ranks tell the same (all-reduce at 2 MiB: ll
# 32.6, two-shot 24.5). For these three collectives the 3-rank rows serve 3 ranks, the
# 4-rank rows 4 to 8 (5 or more have not run yet).
# The LL kernels waiting on every peer's line at once (2026-11-28, 4 x H200, 4 ranks,
# branch ll-all-peers 0f21db3, in graphs): all-reduce 3.95-4.55 us up to 2 KiB (NCCL
# 3.9-4.4), all-gather 4.4-4.8 (NCCL 3.9-4.5), reduce-scatter 4.5-5.1 (NCCL 4.0-4.7);
# 7.5 / 14.4 us all-reduce at 128 / 512 KiB. The LL two-shot all-reduce, the same day
# (445adee): 9.3 us at 128 KiB, 12.3 at 512 KiB (ll 14.4, NCCL 14.0), 27.1 at 2 MiB
# (two-shot 26.8 on 2026-11-27, NCCL 20.6): so at 4 ranks (and more, not yet run) ll up
# to 128 KiB, ll-two-shot to 512 KiB, then two-shot (to 2 MiB, push above: below).
# ll128 and push (4 x H200, 2026-11-28, commits b346a7f and 6f1249c; docs/BENCHMARKS.md,
# "4 GPUs: ll128, the Triton examples ...": `ipcshare allgather|reducescatter --algo
# ll128|ll|auto -b 32K -e 8M|4M -f 2 --graph --baseline nccl` at 4 | 2 ranks and `ipcshare
# allreduce|reducescatter --algo push|auto -b 512K -e 256M -f 4 --graph --baseline nccl`;
# float32, NCCL in the same launch; sizes are the larger array, the gathered output or the
# reduce-scatter's input):
# - ll128 is the fastest of ours from about 512 KiB to 2 MiB of all-gather: at 4 ranks
#   11.5 us at 2 MiB against ll's 14.6, auto's (pull) 13.7 and NCCL's 12.2; at 2 ranks 7.0
#   at 1 MiB against NCCL's 10.1, 10.5 at 2 MiB against 11.5. Below 512 KiB it is 1-2 us
#   slower than ll (4 ranks, 32-128 KiB: 6.9-7.0 against 5.0-5.4; 2 ranks level at 256 KiB,
#   ll 5.4-6.1 in two runs against 5.6), and at 4 MiB pull leads (18.3 against 19.4 at 4
#   ranks, 14.0 against 15.0 at 2).
# - 4-rank reduce-scatter: ll and ll128 level at 1 MiB (10.1), then ll128 ahead: 12.5 us
#   at 2 MiB against NCCL's 12.7 (ll 15.1), 20.1 at 4 MiB against NCCL's 20.9 and auto's
#   (one-shot) 24.2. At 8 MiB push and ll128 are level (33.3 / 33.4), auto 35.9.
# - 2-rank reduce-scatter: ll is as fast as ll128 up to 2 MiB (12.2 / 12.3 at 2 MiB) and
#   3.5 us faster than one-shot at 1 MiB (8.2 against 11.7): the old switch to one-shot at
#   512 KiB was stale, so ll runs it to 2 MiB; one-shot leads at 4 and 8 MiB (17.1 against
#   ll128's 18.1; 25.4 against push's 26.0).
# - push beats what auto ran by 6-16 % from 8 MiB at 4 ranks (all-reduce 56.6 / 178.0 /
#   651.2 us at 8 / 32 / 128 MiB against two-shot's 61.4 / 197.6 / 719.3; reduce-scatter
#   33.3 / 103.9 / 373.8 against one-shot's 36.1 / 116.8 / 411.7) and level at 2 MiB
#   (all-reduce 26.7 against 27.0); at 2 ranks from 32 MiB (all-reduce 120.5 / 434.2
#   against one-shot's 135.5 / 505.5, reduce-scatter 80.5 / 288.6 against 87.5 / 304.8),
#   a little behind at 8 MiB (40.1 against 38.0; 26.0 against 25.4).
# Every low-latency row fits the buffers of a communicator that takes the call
# (ScratchLayout.ll_max_bytes = min(max_bytes, LL_MAX_BYTES), max_bytes at least the
# call's largest array): an all-gather's input is nbytes / n (at most 1 MiB here), a
# reduce-scatter's block nbytes / n (at most 1 MiB: 2 MiB over 2 ranks, 4 MiB over 4),
# an all-reduce's input at most 512 KiB (tests/unit/test_collectives_parts.py checks it).
# The copy-engine all-reduce (gpu_copy_engine.py) and the push all-gather (gpu_push.py)
# are not in these rows: they have not been measured against them on GPUs of their own.
CUDA_CHOICES: dict[str, dict[int, Choice]] = {
    "all_gather": {1: Choice((), ("pull",)),
                   2: Choice((256 * _KiB, 2 * _MiB), ("ll", "ll128", "pull")),
                   3: Choice((512 * _KiB,), ("ll", "pull")),
                   4: Choice((512 * _KiB, 2 * _MiB), ("ll", "ll128", "pull"))},
    "reduce_scatter": {1: Choice((), ("one-shot",)),
                       2: Choice((2 * _MiB, 8 * _MiB), ("ll", "one-shot", "push")),
                       3: Choice((2048 * _KiB,), ("ll", "one-shot")),
                       4: Choice((1 * _MiB, 4 * _MiB), ("ll", "ll128", "push"))},
    "all_reduce": {1: Choice((), ("one-shot",)),
                   2: Choice((512 * _KiB, 8 * _MiB), ("ll", "one-shot", "push")),
                   3: Choice((512 * _KiB,), ("ll", "two-shot")),
                   4: Choice((128 * _KiB, 512 * _KiB, 2 * _MiB),
                             ("ll", "ll-two-shot", "two-shot", "push"))},
    # All-to-all (4 x H200, 2026-11-27, commit 6d3eb65, `tools/gpu_check.py alltoall`
    # with ALLTOALL_ALGOS="pull balanced", 2 and 4 ranks against NCCL; docs/BENCHMARKS.md,
    # "All-to-all, balanced"). Uneven splits: balanced is 4-5x faster than pull from 8 MiB
    # (4 ranks, random 32 MiB: 196 us against 1,038; NCCL 337) and ahead from 8 KiB, a
    # little behind below that; all_to_all_v has one algorithm so that every rank picks
    # the same whatever its own counts. Even splits: pull is ahead up to 8 MiB (4 ranks:
    # 34-36 us against 39-41 there; 13.6 against 16.8 at 16 B in graphs), balanced from
    # 32 MiB (110-112 against 121-123; 2 ranks 73 against 96).
    # Even splits up to 512 KiB run ll (4 x H200, 2026-11-28, gpu-next b2fef07 at 4
    # ranks and 445adee at 2 and 3, `ipcshare alltoall --algo ll --splits even -b 8 -e 512K
    # -f 4 --graph --baseline nccl`): in graphs 3.9-4.5 us up to 32 KiB at 2 ranks, 4.3-5.1
    # at 3, 5.0-6.4 at 4, and 6.5 / 7.2 / 7.4 at 512 KiB, against NCCL's 6.4-10.4 at every
    # row (1.06-1.75x) and pull's 13.6 at 16 B (4 ranks); eager at 4 ranks 7.2-8.5 us
    # against NCCL's 24-38. Above 512 KiB it has not run (lines double the bytes).
    # Push above 32 MiB at 2 ranks (2 x H200, 2026-11-28, `ipcshare alltoall --algo
    # push|balanced --splits even -b 1M -e 256M -f 4 [--graph] --baseline nccl`, plain
    # arrays, tiles of 64 KiB; docs/bench/gpu-check-h200-x2-2026-11-28/6-* to 8-*): in
    # graphs 396 us at 256 MiB against balanced's 484 and NCCL's 436-438, 114 against 131
    # and 134-135 at 64 MiB; level with balanced at 4-16 MiB (20.5 / 40.9 against 19.7 /
    # 40.6) and behind at 1 MiB (14.7 against 13.7). Balanced stages a plain input in a
    # pass of its own before any peer reads it; push stores straight from it.
    # 3 and more ranks keep balanced until push has run there.
    # ll up to 1 MiB at 2 ranks (2 x H200, 2026-11-28, main 07fd5ca, `ipcshare
    # alltoall --algo ll|pull --splits even -b 1M -e 4M -f 4 [--graph] --baseline nccl`;
    # docs/bench/gpu-check-h200-x2-2026-11-28/13-*): 1 MiB in graphs 7.5 us against pull's
    # 12.8 and NCCL's 13.3, eager 9.4 against 14.0 and 16.6; at 4 MiB pull is ahead (17.6
    # against 18.7 in graphs). Every call up to 1 MiB fits an LL slot (ll_max_bytes is
    # min(max_bytes, 2 MiB) and a call is at most max_bytes).
    "all_to_all": {1: Choice((8 << 20,), ("pull", "balanced")),
                   2: Choice((1 << 20, 8 << 20, 32 << 20), ("ll", "pull", "balanced", "push")),
                   3: Choice((512 * _KiB, 8 << 20), ("ll", "pull", "balanced"))},
    # all_to_all_v: every rank must pick the same algorithm whatever its own counts, so
    # its nbytes here is the communicator's max_bytes (Communicator._signature), which
    # every rank agreed on. Up to LL_MAX_BYTES every block of every call fits an LL slot
    # (ScratchLayout: a slot holds min(max_bytes, LL_MAX_BYTES)), so ll refuses nothing.
    # ll against balanced, in graphs, random / skewed splits: 2 ranks (2 x H200,
    # 2026-11-28, main 1dd430c, `ipcshare alltoall --algo ll|balanced --splits random|
    # skewed -b 128K|512K -e 2M|32M -f 4 [--graph] --baseline nccl`, two launches) 8.7 /
    # 8.6 us at 512 KiB against balanced's 15.5 / 16.2 (NCCL 11.1-11.4), 14.9 / 17.6 at
    # 2 MiB against 16.7 / 18.2 (NCCL 13.2-15.9); eager 16.7 / 20.2 against 19.1 / 20.2.
    # 4 ranks (4 x H200, 2026-11-28, x4-next e8f3647): 11-15 us up to 512 KiB
    # against balanced's 17-25; above that ll has not run at 3 or more ranks.
    "all_to_all_v": {1: Choice((), ("balanced",)),
                     2: Choice((LL_MAX_BYTES,), ("ll", "balanced")),
                     3: Choice((512 * _KiB,), ("ll", "balanced"))},
}
_TABLES = {"host": HOST_CHOICES, "cuda": CUDA_CHOICES}

# Where some ranks of the group share a GPU, every other kernel spins on a peer that may
# be waiting for its turn on that GPU; the stepped kernels never spin (gpu_stepped.py).
# Measured on 1 x H100 (2 ranks on its one GPU): see docs/GPU.md, "Several ranks on
# one GPU". Every rank runs it, those with a GPU of their own too, since the ranks of a
# call must run the same algorithm.
SHARED_GPU_CHOICE = "stepped"


def choose(memory: str, op: str, nbytes: int, world_size: int, *,
           shared_gpus: bool = False) -> str:
    """The algorithm ``auto`` runs for ``op`` over ``world_size`` ranks on ``memory``
    when the call's largest array has ``nbytes`` (all-to-all-v: the communicator's
    max_bytes, the one size every rank shares) (and ``shared_gpus``: some ranks of the
    group share a GPU whose contexts take turns, ``Group.time_sliced_gpus``). The same on
    every rank for the same arguments (it is part of the call's signature)."""
    if shared_gpus and memory == "cuda":
        return SHARED_GPU_CHOICE
    table = _TABLES[memory][op]
    known = max(n for n in table if n <= max(world_size, 1))
    return table[known].pick(nbytes)
