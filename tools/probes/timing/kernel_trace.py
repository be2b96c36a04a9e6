"""Where an all-to-all kernel's microseconds go: each phase of one algorithm (its meeting,
its first store, a fence, the peers' first tile, the end), stamped on the GPU by a build
of the kernels with phase stamps (kernels/include/ipcshare/trace.cuh) and read after
every call.

Run under mpiexec with a GPU per rank, e.g.
``mpiexec -n 2 python tools/probes/timing/kernel_trace.py --algo push --splits random --bytes 2M``.
It builds the stamped kernels itself (IPCSHARE_KERNEL_TRACE=1: a CUBIN of its own, up to
a minute the first time), makes each call eagerly on torch tensors (``--register``:
registered with the communicator), or with ``--graph K`` replays a CUDA graph of K calls
back to back (2 to 8: the steady state a graph gives, with no host between the calls),
checks every call's output bit for bit, and prints per rank a table: each mark's time from
the kernel's first mark on block 0 (median, 10th and 90th percentiles), the slowest of the
traced blocks, and the step from the mark before, beside the call's time by CUDA events;
then the whole kernel's span (its first block's start to the last mark of any block) and,
in graphs, the gap from one call's end to the next call's start. A graph's first call is
left out of the marks and spans (the replay's launch is in it). ``--json`` keeps every
rank's rows; ``--result FILE`` writes the call's time by CUDA events (the slowest rank's
median) as a result document, every rank's phase rows and spans in its details."""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np


def _expected(m: np.ndarray, inputs: list[np.ndarray], me: int, item: int) -> np.ndarray:
    """What rank ``me`` receives: from each rank q the ``m[q, me]`` elements after those q
    sends lower ranks, packed in rank order."""
    return np.concatenate([data[int(m[q, :me].sum()) * item:int(m[q, :me + 1].sum()) * item]
                           for q, data in enumerate(inputs)])


def table(rank: int, kernel: str, scale: float, rows, event_us: float, spans=None,
          graph: int = 0) -> str:
    # Eager, the events bracket one call, its wait for peers that arrive later included.
    timing = (f"in graphs of {graph} calls" if graph else
              "its wait for later peers included")
    lines = [f"rank {rank}: {kernel}, {len(rows) and rows[0].reached} calls, "
             f"{scale:.4f} ns a cycle, {event_us:.2f} us a call by CUDA events ({timing})",
             "| mark | block 0 median us | p10 | p90 | slowest traced block | step from the "
             "mark before | calls reaching it |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row.name} | {row.median_us:.2f} | {row.p10_us:.2f} | "
                     f"{row.p90_us:.2f} | {row.slowest_us:.2f} | {row.step_us:.2f} | "
                     f"{row.reached} |")
    if spans is not None and spans.spans:
        fewest, most = spans.blocks
        blocks = f"{most}" if fewest == most else f"{fewest}-{most}"
        lines.append(f"kernel span, first block's start to any block's last mark ({blocks} "
                     f"blocks): median {spans.span_us:.2f} us, p90 {spans.span_p90_us:.2f}")
        if spans.gaps:
            lines.append(f"gap from a call's last mark to the next call's first (in the "
                         f"graph): median {spans.gap_us:.2f} us, p90 {spans.gap_p90_us:.2f}")
    return "\n".join(lines)


def _write_result(args, op: str, kernel: str, nbytes: int, ranks: int, everyone) -> None:
    """The traced call as a result document: the slowest rank's median time by CUDA
    events as ours, every rank's phase rows and spans in the row's details (each call's
    output was checked bit for bit, or the probe stopped before this)."""
    from ipcshare.cli.result_file import write_result
    from ipcshare.runtime.result_document import figure, make_row, new_launch_id

    row = make_row(
        op="alltoall", size=nbytes, dtype="float32", algorithm=args.algo,
        mode="graph" if args.graph else "eager", world_size=ranks, launch=new_launch_id(),
        ours=figure(max(median for *_, median in everyone)), wrong=0,
        details={"kernel": kernel, "splits": args.splits, "registered": args.register,
                 "calls_per_graph": args.graph or None,
                 "phases": [rows for _, rows, _, _ in everyone],
                 "spans": [spans for _, _, spans, _ in everyone]})
    write_result(args.result, tool="tools/probes/timing/kernel_trace.py", world_size=ranks,
                 rows=[row], exit_status=0, argv=["python", *sys.argv])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", required=True,
                        help="pull, balanced, ll, push or eager (the traced all-to-all "
                        "kernels)")
    parser.add_argument("--splits", default="even",
                        help="even (all_to_all), or random / skewed (all_to_all_v)")
    parser.add_argument("--bytes", default="1M", help="each rank's input (K/M/G suffixes)")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--graph", type=int, default=0, metavar="K",
                        help="replay a CUDA graph of K calls (2-8) per sample instead of "
                        "calling eagerly")
    parser.add_argument("--register", action="store_true",
                        help="register the arrays with the communicator (-R 1)")
    parser.add_argument("--backend", default="cuda-vmm")
    parser.add_argument("--json", help="every rank's rows, written by rank 0")
    parser.add_argument("--result", metavar="FILE",
                        help="the call's time as a result document (rank 0; docs/CLI.md)")
    args = parser.parse_args()
    if args.result:   # refused now, not after the run
        from ipcshare.runtime.output_files import check_writable

        check_writable(args.result)
    os.environ["IPCSHARE_KERNEL_TRACE"] = "1"   # read when the kernels are first built

    import ipcshare
    from ipcshare.collectives.algorithms import algorithm, algorithm_names
    from ipcshare.kernels.trace import (
        KERNEL_MARKS,
        TRACE_CALLS,
        KernelTrace,
        summarize,
        summarize_spans,
    )
    from ipcshare.patterns.alltoall import split_matrix
    from ipcshare.runtime.config import parse_size

    nbytes = parse_size(args.bytes, what="--bytes")
    if args.graph and not 2 <= args.graph <= TRACE_CALLS:
        sys.exit(f"kernel_trace.py: --graph {args.graph}: a graph of 2 to {TRACE_CALLS} calls "
                 f"(the stamps keep {TRACE_CALLS} calls apart)")
    if args.algo == "auto":
        sys.exit("kernel_trace.py: --algo auto: name the algorithm to trace (pull, balanced, "
                 "ll, push, eager)")
    # Even splits run all_to_all where the algorithm has one (eager: all_to_all_v only).
    even = args.splits == "even" and args.algo in algorithm_names("cuda", "all_to_all")
    op = "all_to_all" if even else "all_to_all_v"
    kernel = algorithm("cuda", op, args.algo).kernel
    names = KERNEL_MARKS.get(kernel)
    if names is None:
        sys.exit(f"kernel_trace.py: {kernel} carries no marks; trace one of: "
                 f"{', '.join(sorted(KERNEL_MARKS))}")
    try:
        import torch
    except ImportError:
        sys.exit("kernel_trace.py: needs torch (its tensors and CUDA events): pip install torch")
    with ipcshare.Group(backend=args.backend) as group:
        n, me, device = group.world.size, group.world.rank, group.backend.device
        torch.cuda.set_device(device)
        stream = torch.cuda.Stream(device=device)
        count = nbytes // 4 // n * n
        m = split_matrix(args.splits, count, n)
        inputs = [np.random.default_rng([q, 9]).integers(0, 256, count * 4, dtype=np.uint8)
                  for q in range(n)]
        want = _expected(m, inputs, me, 4)
        width = max(count, int(m.sum(axis=0).max()))
        with group.communicator(max_bytes=width * 4) as comm, \
                torch.cuda.stream(stream):
            trace = KernelTrace(group.backend.kernels("collectives.cu"))
            source = torch.from_numpy(inputs[me].copy()).to(f"cuda:{device}").view(torch.float32)
            out = torch.zeros(width, dtype=torch.float32, device=f"cuda:{device}")
            if args.register:
                comm.register(source)
                comm.register(out)

            def call() -> None:
                if op == "all_to_all":
                    comm.all_to_all(out[:count], source, algo=args.algo, stream=stream)
                else:
                    comm.all_to_all_v(out, source, m[:, me].tolist(), m[me].tolist(),
                                      algo=args.algo, stream=stream)

            calls, spans, times = [], [], []
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            run, per_run, first = call, 1, 0
            if args.graph:
                call()   # bound before the capture, which may not enqueue the binding's work
                comm.synchronize(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, stream=stream):
                    for _ in range(args.graph):
                        call()
                run, per_run, first = graph.replay, args.graph, 1
            for i in range(args.warmup + args.iters):
                out.zero_()
                trace.reset(stream.cuda_stream)
                group.barrier()
                start.record(stream)
                run()
                end.record(stream)
                comm.synchronize(stream)
                got = out.view(torch.uint8).cpu().numpy()[:want.nbytes]
                if not np.array_equal(got, want):
                    sys.exit(f"kernel_trace.py: rank {me}: sample {i} delivered wrong bytes")
                if i >= args.warmup:
                    read = trace.read()
                    calls += [read.stamps[slot] for slot in range(first, per_run)]
                    spans.append(read.spans)
                    times.append(start.elapsed_time(end) * 1e3 / per_run)
            scale, rows = summarize(calls, names)
            span_summary = summarize_spans(spans, skip=first)
            text = table(me, kernel, scale, rows, float(np.median(times)), span_summary,
                         args.graph)
            median_us = float(np.median(times))
            everyone = group.collective("kernel trace", (text, [row.__dict__ for row in rows],
                                                            span_summary.__dict__, median_us))
            if me == 0:
                how = f", graphs of {args.graph} calls" if args.graph else ", eager calls"
                print(f"{args.algo} ({kernel}), {args.splits} splits, {nbytes} bytes a rank, "
                      f"{n} ranks{', registered' if args.register else ''}{how}")
                for rank_text, *_ in everyone:
                    print(rank_text)
                    print()
                if args.json:
                    with open(args.json, "w") as f:
                        json.dump({"algo": args.algo, "kernel": kernel, "splits": args.splits,
                                   "bytes": nbytes, "ranks": n, "registered": args.register,
                                   "graph": args.graph,
                                   "rows": [rows for _, rows, _, _ in everyone],
                                   "spans": [spans for _, _, spans, _ in everyone]}, f, indent=1)
                if args.result:
                    _write_result(args, op, kernel, count * 4, n, everyone)
            if args.register:
                comm.unregister(source)
                comm.unregister(out)
    return 0


if __name__ == "__main__":
    from ipcshare.runtime.errors import IpcShareError

    try:
        raise SystemExit(main())
    except (IpcShareError, RuntimeError) as exc:  # one line, on every rank
        raise SystemExit(f"kernel_trace.py: {exc}") from None
