"""Run by test_triton_device.py under TRITON_INTERPRET=1: rank 0's kernel reaches "rank
1's" memory (CPU tensors) through a peer table with ipcshare.triton's data functions,
and prints what both sides hold as JSON."""

from __future__ import annotations

import json

import torch
import triton
import triton.language as tl

import ipcshare.triton as ipt
from ipcshare.triton.table import TableDescription, pack_table


@triton.jit
def data_functions(window, src, dst, counters, table, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    ipt.put(window + offsets, src + offsets, 1, table)                 # into block 0
    ipt.get(dst + offsets, window + BLOCK + offsets, 1, table)         # from block 1
    seen = ipt.load(window + offsets, 1, table)
    ipt.store(window + 2 * BLOCK + offsets, seen + 1, 1, table)        # into block 2
    ipt.atomic_add(counters, 3, 1, table, 2, sem="relaxed", scope="sys")
    ipt.atomic_cas(counters + 1, 0, 7, 1, table, 2)
    ipt.atomic_cas(counters + 1, 0, 9, 1, table, 2)                    # fails: it holds 7
    old = ipt.atomic_xchg(counters + 2, 5, 1, table, 2)
    tl.store(counters + 3, old)                                        # ours: the old 0


def main() -> None:
    block = 8
    windows = [torch.zeros(4 * block, dtype=torch.int32) for _ in range(2)]
    counters = [torch.zeros(4, dtype=torch.int64) for _ in range(2)]
    windows[1][block:2 * block] = torch.arange(100, 100 + block)
    # Row 0 (pads) is never touched by these functions; rows 1 and 2 are the tensors.
    description = TableDescription(0, (1 << 20, 2 << 20),
                                   (tuple(w.data_ptr() for w in windows),
                                    tuple(c.data_ptr() for c in counters)))
    table = torch.from_numpy(pack_table(description))
    src = torch.arange(block, dtype=torch.int32)
    dst = torch.zeros(block, dtype=torch.int32)
    data_functions[(1,)](windows[0], src, dst, counters[0], table, BLOCK=block)
    print(json.dumps({"block": block, "peer_window": windows[1].tolist(), "dst": dst.tolist(),
                      "peer_counters": counters[1].tolist(),
                      "own_counters": counters[0].tolist(),
                      "own_window_untouched": not bool(windows[0].any())}))


if __name__ == "__main__":
    main()
