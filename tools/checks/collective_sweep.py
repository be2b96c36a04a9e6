"""Correctness sweep of the collectives through the public API (``Group.communicator``):
every algorithm of every collective, every dtype and reduction, array sizes from one
element to ``--max-bytes`` (odd element counts included, the largest exactly), each case
out of place on the caller's arrays, in place, out of place on arrays from ``empty()``
(read in place) and, on GPU backends, replayed in a CUDA graph with new data on every
replay. Inputs are small integers, exact in every dtype and every order of summation, so
each rank knows the exact bytes every call must leave and every rank's result is checked
in full (on the GPU, without copying to the host). Outputs are poisoned before each call.

Run under mpiexec, e.g. (one line per algorithm; exit status 1 on any wrong element or
failed call)::

    mpiexec -n 4 python tools/checks/collective_sweep.py [--backend auto] [--max-bytes 1G]
        [--factor 9] [--ops all_reduce,reduce_scatter,all_gather] [--algos one-shot,...]
        [--dtypes float32,...] [--reductions sum,max,min] [--replays 3] [--json FILE]

An algorithm that refuses a size (the low-latency one above its buffers) is listed with
its reason and skipped at larger sizes. Refusing the smallest size, or a call that fails
when waited for (a disagreement or a timeout its kernel recorded), fails the sweep.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np

import ipcshare
from ipcshare.collectives.algorithms import algorithm_names
from ipcshare.runtime.config import format_size, parse_size
from ipcshare.runtime.errors import CollectiveError, IpcShareError

OPS = ("all_reduce", "reduce_scatter", "all_gather")
# Out of place on the caller's arrays (copied in), in place, out of place on arrays from
# empty() (read in place), and replays of a CUDA graph with new data (GPU backends).
MODES = ("out of place", "in place", "heap", "graph")
DTYPES = ("float32", "float16", "bfloat16", "int32")
REDUCTIONS = ("sum", "max", "min")
_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "int32": 4, "uint8": 1}
# Values repeat every PERIOD elements (a prime, so no block or chunk boundary of a power of
# two lines up with it). Reductions: -8..8 (sums over up to 32 ranks stay exact in
# bfloat16); bytes moved by all-gather: 0..250, so the poison 255 is never expected.
PERIOD = 251
_SPAN, _BYTES = 17, 251
_POISON = {"reduce": 1000, "uint8": 255}


def element_counts(largest: int, factor: int, multiple: int = 1) -> list[int]:
    """Counts from ``multiple`` up to ``largest`` (rounded down to a multiple), growing by
    ``factor``, with the largest and the one before it (odd blocks at any factor)."""
    top = largest // multiple
    if top < 1:
        return []
    blocks, block = set(), 1
    while block < top:
        blocks.add(block)
        block *= factor
    blocks.update({top, max(1, top - 1)})
    return [b * multiple for b in sorted(blocks)]


def value_table(rank: int, seed: int, moved: bool) -> np.ndarray:
    """Rank ``rank``'s values for one period of ``PERIOD`` elements: element i of a call's
    array is ``table[i % PERIOD]``. Reductions: -8..8; all-gather bytes: 0..250, a
    permutation that differs between ranks and seeds."""
    span = _BYTES if moved else _SPAN
    values = (np.arange(PERIOD, dtype=np.int64) * 7 + rank * 13 + seed * 5) % span
    return values if moved else values - 8


class _Numpy:
    """Arrays of the host backend."""

    graphs = False
    stream = None

    def __init__(self) -> None:
        from ipcshare.collectives.arrays import to_numpy_dtype

        self._dtype = to_numpy_dtype

    def tile(self, table: np.ndarray, count: int, start: int, dtype: str) -> Any:
        """``count`` elements of ``dtype``, element j = ``table[(start + j) % PERIOD]``."""
        return np.resize(np.roll(table, -(start % PERIOD)).astype(self._dtype(dtype)), count)

    def empty(self, count: int, dtype: str) -> Any:
        return np.empty(count, self._dtype(dtype))

    def from_heap(self, array: Any) -> Any:
        return array  # the host backend's empty() gives numpy arrays

    def wrong(self, got: Any, want: Any) -> int:
        # Compare bits, so -0.0 against 0.0 or any NaN counts as wrong.
        bits = np.dtype(f"u{got.itemsize}")
        return int(np.count_nonzero(got.view(bits) != want.view(bits)))

    def synchronize(self) -> None:
        pass

    def release(self) -> None:
        pass


class _Torch:
    """torch tensors on the group's GPU, on one stream that is also torch's current one."""

    graphs = True

    def __init__(self, device: int) -> None:
        import torch

        self.torch = torch
        torch.cuda.set_device(device)
        self.device = f"cuda:{device}"
        self.stream = torch.cuda.Stream(device=device)
        torch.cuda.set_stream(self.stream)
        self._dtypes = {"float32": torch.float32, "float16": torch.float16,
                        "bfloat16": torch.bfloat16, "int32": torch.int32,
                        "uint8": torch.uint8}

    def tile(self, table: np.ndarray, count: int, start: int, dtype: str) -> Any:
        period = self.torch.from_numpy(np.roll(table, -(start % PERIOD)))
        period = period.to(self.device).to(self._dtypes[dtype])  # small integers: exact
        return period.repeat(-(-count // PERIOD))[:count]

    def empty(self, count: int, dtype: str) -> Any:
        return self.torch.empty(count, dtype=self._dtypes[dtype], device=self.device)

    def from_heap(self, array: Any) -> Any:
        return self.torch.from_dlpack(array)  # a view: the memory stays the window's

    def wrong(self, got: Any, want: Any) -> int:
        # Compare bits, so -0.0 against 0.0 or any NaN counts as wrong.
        bits = {1: self.torch.uint8, 2: self.torch.int16, 4: self.torch.int32}
        view = bits[got.element_size()]
        # count_nonzero, not sum: a sum of booleans would first widen them to int64.
        return int(self.torch.count_nonzero(got.view(view) != want.view(view)))

    def synchronize(self) -> None:
        self.stream.synchronize()

    def release(self) -> None:
        # Sizes change from case to case: give cached blocks back, so ranks sharing a GPU
        # do not each keep the largest case's worth.
        self.torch.cuda.empty_cache()


class _CallFailed(Exception):
    """A call that was made and failed (found when waiting for it)."""


class Sweep:
    """The cases of one world size, run in the same order on every rank."""

    def __init__(self, group: Any, comm: Any, arrays: Any, replays: int) -> None:
        self.group, self.comm, self.arrays, self.replays = group, comm, arrays, replays
        self.rank, self.size = group.rank, group.size
        self.cases: list[dict] = []

    def run(self, op: str, algo: str, dtype: str, reduction: str | None, count: int) -> dict:
        """One case (``count``: elements of the call's largest array) in every mode.
        Returns its record (``wrong`` elements on this rank over every call)."""
        record = {"op": op, "algo": algo, "dtype": dtype, "reduction": reduction,
                  "count": count, "wrong": 0, "calls": 0}
        try:
            for mode in MODES:
                if mode == "graph" and not self.arrays.graphs:
                    continue
                record["wrong"] += self._mode(op, algo, dtype, reduction, count, mode)
                record["calls"] += self.replays if mode == "graph" else 1
        except _CallFailed as exc:  # a call that ran and failed: never a pass
            record["failed"] = str(exc)
        except CollectiveError as exc:  # refused before it ran, alike on every rank
            record["refused"] = str(exc)
        if count * _ITEMSIZE[dtype] >= 64 << 20:
            self.arrays.release()
        self.cases.append(record)
        return record

    def _finish(self) -> None:
        """Wait for this rank's calls and raise what their kernels recorded."""
        self.arrays.synchronize()
        try:
            self.comm.synchronize(self.arrays.stream)
        except IpcShareError as exc:
            raise _CallFailed(str(exc)) from exc

    def _case_data(self, op: str, dtype: str, reduction: str | None, count: int,
                   seed: int) -> tuple[Any, Any]:
        """(this rank's input, the exact bytes its output must hold)."""
        a, block = self.arrays, count // self.size
        if op == "all_gather":
            want = a.empty(count, "uint8")
            for r in range(self.size):
                want[r * block:(r + 1) * block] = a.tile(value_table(r, seed, True), block, 0,
                                                         "uint8")
            return a.tile(value_table(self.rank, seed, True), block, 0, "uint8"), want
        tables = [value_table(r, seed, False) for r in range(self.size)]
        total = {"sum": np.sum, "max": np.max, "min": np.min}[reduction](tables, axis=0)
        if op == "reduce_scatter":
            want = a.tile(total, block, self.rank * block, dtype)
        else:
            want = a.tile(total, count, 0, dtype)
        return a.tile(tables[self.rank], count, 0, dtype), want

    def _mode(self, op: str, algo: str, dtype: str, reduction: str | None, count: int,
              mode: str) -> int:
        a, comm = self.arrays, self.comm
        moved = "uint8" if op == "all_gather" else dtype
        block = count // self.size
        seed = MODES.index(mode) * (1 + self.replays)
        mine, want = self._case_data(op, dtype, reduction, count, seed)
        poison = _POISON["uint8" if op == "all_gather" else "reduce"]

        def allocate(elements: int) -> Any:
            if mode == "heap":  # inside the window: read in place, no copy-in
                return a.from_heap(comm.empty(elements, moved))
            return a.empty(elements, moved)

        big = allocate(count)
        small = None if mode == "in place" else allocate(count if op == "all_reduce" else block)
        mine_block = slice(self.rank * block, (self.rank + 1) * block)
        if op == "all_reduce":
            source, result = big, small if small is not None else big
        elif op == "reduce_scatter":
            source, result = big, small if small is not None else big[mine_block]
        else:
            result, source = big, small if small is not None else big[mine_block]

        def fill(values: Any) -> None:
            result[:] = poison  # in place, the input (inside it) is written next
            source[:] = values

        def call() -> None:
            if op == "all_reduce":
                comm.all_reduce(source, op=reduction, algo=algo, stream=a.stream,
                                output=None if mode == "in place" else result)
            elif op == "reduce_scatter":
                comm.reduce_scatter(result, source, op=reduction, algo=algo, stream=a.stream)
            else:
                comm.all_gather(result, source, algo=algo, stream=a.stream)

        if mode != "graph":
            fill(mine)
            call()
            self._finish()
            return a.wrong(result, want)
        torch = a.torch
        fill(mine)
        call()  # the first call of this shape is collective and checks agreement: not captured
        self._finish()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=a.stream):
            call()
        wrong = 0
        for replay in range(self.replays):
            mine, want = self._case_data(op, dtype, reduction, count, seed + 1 + replay)
            fill(mine)
            graph.replay()
            self._finish()
            wrong += a.wrong(result, want)
        del graph
        return wrong


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--max-bytes", default=None,
                        help="largest array of a call (default 1G on GPUs, 1M on host)")
    parser.add_argument("--factor", type=int, default=9)
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--algos", default=None, help="default: every algorithm and auto")
    parser.add_argument("--dtypes", default=",".join(DTYPES))
    parser.add_argument("--reductions", default=",".join(REDUCTIONS))
    parser.add_argument("--replays", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.algos:  # a misspelt name would otherwise sweep nothing and pass
        known = {"auto"}.union(*(algorithm_names(memory, op) for memory in ("host", "cuda")
                                 for op in args.ops.split(",")))
        unknown = sorted(set(args.algos.split(",")) - known)
        if unknown:
            parser.error(f"--algos: unknown {', '.join(unknown)}; the ops asked for have "
                         f"{', '.join(sorted(known))}")
    with ipcshare.Group(backend=args.backend) as group:
        gpu = group.backend_name != "host"
        largest = parse_size(args.max_bytes or ("1G" if gpu else "1M"))
        arrays = _Torch(group.backend.device) if gpu else _Numpy()
        memory = "cuda" if gpu else "host"
        started = time.perf_counter()
        # The heap holds a call's two largest arrays from empty(), with room for alignment.
        with group.communicator(max_bytes=largest, heap_bytes=2 * largest + (1 << 20)) as comm:
            sweep = Sweep(group, comm, arrays, args.replays)
            for op in args.ops.split(","):
                names = algorithm_names(memory, op) + ("auto",)
                for algo in (args.algos.split(",") if args.algos else names):
                    if algo not in names:
                        continue
                    _sweep_algorithm(sweep, op, algo, args, largest, started)
        wrong = group.world.comm.allreduce(sum(c["wrong"] for c in sweep.cases))
        failed = group.world.comm.allreduce(sum(1 for c in sweep.cases if "failed" in c))
        if group.rank == 0:
            calls = sum(c["calls"] for c in sweep.cases)
            print(f"# collective_sweep: {group.size} ranks, {group.backend_name}, "
                  f"{len(sweep.cases)} cases, {calls} calls per rank, {wrong} wrong, "
                  f"{failed} failed, "
                  f"{time.perf_counter() - started:.0f} s", flush=True)
            if args.json:
                with open(args.json, "w") as out:
                    json.dump({"world_size": group.size, "backend": group.backend_name,
                               "max_bytes": largest, "wrong_total": wrong, "failed": failed,
                               "cases": sweep.cases}, out, indent=1)
    return 1 if wrong or failed else 0


def _sweep_algorithm(sweep: Sweep, op: str, algo: str, args: Any, largest: int,
                     started: float) -> None:
    """Every dtype, reduction and size of ``op`` with ``algo``; one line on rank 0."""
    dtypes = ("uint8",) if op == "all_gather" else tuple(args.dtypes.split(","))
    reductions = (None,) if op == "all_gather" else tuple(args.reductions.split(","))
    cases = wrong = 0
    refused: list[str] = []
    failed: list[str] = []
    top = 0
    for dtype in dtypes:
        multiple = sweep.size if op != "all_reduce" else 1
        for reduction in reductions:
            counts = element_counts(largest // _ITEMSIZE[dtype], args.factor, multiple)
            for count in counts:
                record = sweep.run(op, algo, dtype, reduction, count)
                where = f"{dtype} {reduction or ''} {count} elements"
                if "refused" in record and count == counts[0]:
                    # Refusing the smallest call is no size limit: the algorithm fails.
                    record["failed"] = record.pop("refused")
                if "failed" in record:
                    failed.append(f"{where}: {record['failed']}")
                    break
                if "refused" in record:  # a size limit (ll's buffers): larger ones too
                    refused.append(f"{where}: {record['refused']}")
                    break
                cases += 1
                wrong += record["wrong"]
                top = max(top, count * _ITEMSIZE[dtype])
    wrong = sweep.group.world.comm.allreduce(wrong)
    if sweep.rank == 0:
        line = (f"{op:<15} {algo:<12} {cases:>4} cases up to {format_size(top):>6}, "
                f"{wrong} wrong  [{time.perf_counter() - started:.0f} s]")
        if refused:
            line += f"; refused {len(refused)}x, first: {refused[0]}"
        if failed:
            line += f"; FAILED {len(failed)}x, first: {failed[0]}"
        print(line, flush=True)


if __name__ == "__main__":
    sys.exit(main())
