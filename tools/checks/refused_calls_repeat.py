"""Repeat the all-to-all-v call that one rank refuses: no hang, no wrong element.

Run under mpiexec (``make refused-repeat`` runs it at 2 and 3 ranks on the host backend)::

    mpiexec -n 3 python tools/checks/refused_calls_repeat.py [--backend host|cuda-ipc|cuda-vmm]
        [--repetitions 50] [--algo auto] [--nodes K] [--json F]

Each repetition makes, on every rank, an all-to-all-v whose output_splits add up to one
element more than the output holds on one rank (the ranks take turns), then a good
all-to-all-v (each rank sends rank + 1 + repetition). Every rank must raise the same error,
naming the refusing rank, in the bad call (on GPUs in the call or at synchronize()), leave
its output of that call untouched (but for algo copy-engine, which has none for
all-to-all-v anyway) and receive exactly what each rank sent in the good one; a hang ends
at the signal timeout (set IPCSHARE_SIGNAL_TIMEOUT short). Closing the communicator and
the group must take under a second on every rank. Prints one summary line (rank 0) and
exits 1 on any wrong element, mismatched error or slow close.

``--nodes K`` splits the ranks into K virtual nodes (``IPCSHARE_VIRTUAL_NODES``), so the
communicator spans nodes; all-to-all-v is not built there, so the calls are all-to-alls
(the refusing rank's output one element long, blamed as ``output``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

import ipcshare
from ipcshare.runtime.errors import CollectiveError

BLOCK = 257   # elements each rank sends each rank: odd, so no size lines up by chance


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="host")
    parser.add_argument("--repetitions", type=int, default=50)
    parser.add_argument("--algo", default="auto")
    parser.add_argument("--nodes", type=int, default=0,
                        help="virtual nodes to split the ranks into (0: the machine's)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.nodes:
        import os

        from ipcshare.topology.world import VIRTUAL_NODES_ENV

        os.environ[VIRTUAL_NODES_ENV] = str(args.nodes)
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    me, n = world.rank, world.size
    group = ipcshare.Group(backend=args.backend)
    comm = group.communicator(max_bytes=4 * n * BLOCK * 8)
    arrays = Arrays(comm, n, me)
    # Across nodes: all-to-all, the refusing rank's output one element long.
    collective, blamed = (("all_to_all", "output") if group.world.node_count > 1 else
                          ("all_to_all_v", "output_splits"))
    wrong = mismatched = 0
    start = time.monotonic()
    for repetition in range(args.repetitions):
        refuser = repetition % n
        arrays.fill(-7, me + 1 + repetition)
        receives = [BLOCK] * n
        receives[0] += int(me == refuser)
        try:
            if collective == "all_to_all":
                comm.all_to_all(arrays.longer if me == refuser else arrays.output,
                                arrays.input, algo=args.algo)
            else:
                comm.all_to_all_v(arrays.output, arrays.input, receives, [BLOCK] * n,
                                  algo=args.algo)
            comm.synchronize()
            message = "no error"
        except CollectiveError as exc:
            message = str(exc)
        messages = world.allgather(message)
        if (len(set(messages)) != 1
                or f"rank {refuser}'s {blamed} failed its check there" not in message):
            mismatched += 1
            print(f"rank {me} repetition {repetition}: {messages}", file=sys.stderr)
        if args.algo != "copy-engine":
            wrong += int(np.count_nonzero(arrays.received() != -7))
        if collective == "all_to_all":
            comm.all_to_all(arrays.output, arrays.input, algo=args.algo)
        else:
            comm.all_to_all_v(arrays.output, arrays.input, [BLOCK] * n, [BLOCK] * n,
                              algo=args.algo)
        comm.synchronize()
        expected = np.repeat(np.arange(1, n + 1, dtype=np.int64) + repetition, BLOCK)
        wrong += int(np.count_nonzero(arrays.received() != expected))
    took = time.monotonic() - start
    world.Barrier()
    closing = time.monotonic()
    comm.close()
    group.close()
    close_s = time.monotonic() - closing
    wrong = world.allreduce(wrong)
    mismatched = world.allreduce(mismatched)
    slowest_close = world.allreduce(close_s, op=MPI.MAX)
    ok = wrong == 0 and mismatched == 0 and slowest_close < 1.0
    if me == 0:
        result = {"ranks": n, "nodes": group.world.node_count, "collective": collective,
                  "backend": args.backend, "algo": args.algo,
                  "repetitions": args.repetitions, "wrong": wrong,
                  "mismatched_errors": mismatched, "seconds": round(took, 2),
                  "slowest_close_s": round(slowest_close, 4), "ok": ok}
        print(json.dumps(result))
        if args.json:
            with open(args.json, "w") as out:
                json.dump(result, out)
    return 0 if ok else 1


class Arrays:
    """The call's int64 arrays: numpy on host memory, torch tensors on GPUs (``longer``:
    an output one element too long)."""

    def __init__(self, comm, n: int, me: int) -> None:
        self.count = n * BLOCK
        if comm.memory == "host":
            self.output = np.empty(self.count, np.int64)
            self.input = np.empty(self.count, np.int64)
            self.longer = np.empty(self.count + 1, np.int64)
        else:
            import torch

            device = f"cuda:{comm.group.backend.device}"
            self.output = torch.empty(self.count, dtype=torch.int64, device=device)
            self.input = torch.empty(self.count, dtype=torch.int64, device=device)
            self.longer = torch.empty(self.count + 1, dtype=torch.int64, device=device)

    def fill(self, output: int, input: int) -> None:
        self.output[:] = output
        self.input[:] = input
        if not isinstance(self.output, np.ndarray):
            import torch

            torch.cuda.synchronize()   # torch's stream is not the communicator's

    def received(self) -> np.ndarray:
        if isinstance(self.output, np.ndarray):
            return self.output
        return self.output.cpu().numpy()


if __name__ == "__main__":
    sys.exit(main())
