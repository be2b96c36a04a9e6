"""The mixture-of-experts step of ``moe_dispatch.py`` timed against NCCL and PyTorch
symmetric memory in one launch, every version checked bit for bit before it is timed.

    mpiexec -n 2 python examples/moe_step_bench.py --dtype bfloat16 --topk 8 --experts 32 \\
        --tokens 4096 --hidden 7168 [--checks 2] [--warmup 3] [--iters 20] [--seed S] \\
        [--markdown FILE.md] [--json FILE.json] [--result FILE.json]

One rank per GPU, on one node. The step is ``moe_dispatch.GpuStep`` (route top-K, count,
exchange the counts, dispatch, experts, combine, sum each token's K outputs); only its
three exchanges differ between the versions:

- ipcshare: ``comm.all_to_all`` and ``comm.all_to_all_v`` bound once, the splits on the
  device (the dispatch's kernel fills the counts received): the whole step is one CUDA
  graph, timed as replays of it;
- NCCL: torch.distributed's ``all_to_all_single`` as users call it today, its split
  sizes Python lists, so the counts are copied to the host first (``.tolist()``, which
  waits for the GPU): the step cannot be captured, and is timed eager, the copy inside;
- PyTorch symmetric memory: ``torch.ops.symm_mem.all_to_all_vdev`` (NVSHMEM), splits on
  the device; one CUDA graph where torch can capture it, else eager. Left out, with the
  reason, where this torch lacks the op or NVSHMEM, or where its kernel would trap on
  this layer's rows.

Every version's step runs the same routing, the same experts over the same worst-case
inbox and the same merge: the columns differ by the exchanges and where the splits live.

Each version first runs ``--checks`` steps eager (the warm-up a capture asks for) and, if
captured, ``--checks`` replays, each with new tokens, every one compared bit for bit with
the reference every rank computes alone (``moe_dispatch.reference``); a version with a
wrong element is not timed and has no ratio. Then ``--warmup`` untimed steps and
``--iters`` timed ones, each a sample of its own between CUDA events on the step's stream
(the ranks meet before each); a sample is the slowest rank's, the figure their median.
Each rank's host clock over the same samples must agree with its events
(ipcshare.patterns.clock_check), and the bytes a rank sends to its peers per step over
that time may not pass its links' rate: a figure failing either is an error, not a
result. The table (Markdown on stdout, ``--markdown``, ``--json``) gives per version µs
per step, the host clock's median, tokens per second (all ranks' tokens), the bytes the
busiest rank sends its peers per step, and the time over ipcshare's. Exit status as the
``ipcshare`` commands' (docs/CLI.md): 0 when every version that ran was right and its
figure passed both checks, 3 for a wrong element, 1 for a version that failed to run, 5
for a figure that failed a check (a baseline's included: its time is then no ratio's
denominator, and the table says why). ``--result`` writes the step's figures as a result
document (docs/CLI.md): op ``moe-step``, ours beside each baseline that ran, each
baseline's ``path`` saying how it was timed.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from typing import Any

import moe_dispatch as moe  # this folder is on sys.path when the script runs

import ipcshare
from ipcshare import IpcShareError
from ipcshare.bench.progress import ProgressLine
from ipcshare.liveness.consensus import collective_step
from ipcshare.patterns.clock_check import (
    agreed_errors,
    ceiling_error,
    latency_clock_disagreement,
)
from ipcshare.patterns.timing import percentile, slowest_rank_samples
from ipcshare.runtime.errors import ConfigError
from ipcshare.runtime.output_files import check_writable

SCRIPT = "moe_step_bench.py"
OURS, NCCL, SYMM = "ipcshare", "NCCL", "torch symm"
VERSIONS = {
    OURS: "ipcshare all_to_all_v, splits on the device",
    NCCL: "NCCL all_to_all_single, splits copied to the host",
    SYMM: "PyTorch symmetric memory all_to_all_vdev, splits on the device",
}
# NVSHMEM's heap, where the torch symm version's tensors live, is set this much larger
# than they are (unless NVSHMEM_SYMMETRIC_SIZE is set already): its own needs.
NVSHMEM_HEAP_SLACK = 1 << 30


class HostSplitsNcclExchange:
    """The step's exchanges by NCCL through torch.distributed as users call it today: the
    counts per expert by ``all_to_all_single`` on the device, then both splits copied to
    the host in one ``.tolist()`` (the host waits for the GPU there) for the dispatch's and
    the combine's ``all_to_all_single``, whose split sizes are Python lists. NCCL's
    combine reports no counts: the step's sends stand for what came back."""

    name = NCCL
    graphs = False   # the host waits for the counts inside the step

    def __init__(self, torch, dist) -> None:
        self.torch, self.dist = torch, dist
        self.rank = dist.get_rank()
        self.device = torch.device("cuda", torch.cuda.current_device())

    def buffer(self, shape: tuple[int, ...], dtype):
        return self.torch.empty(shape, dtype=dtype, device=self.device)

    def bind(self, step) -> tuple:
        torch, dist, layer = self.torch, self.dist, step.layer
        n, per_rank, hidden = layer.ranks, layer.local_experts, layer.hidden
        rows: dict[str, list[int]] = {}

        def exchange_counts() -> None:
            dist.all_to_all_single(step.counts_in, step.counts)

        def dispatch() -> None:
            received = step.counts_in.view(n, per_rank).sum(dim=1)
            torch.mul(received, hidden, out=step.received)
            # One device-to-host copy of both splits: what users do, what breaks graphs.
            both = torch.cat([step.sends // hidden, received]).tolist()
            rows["send"], rows["receive"] = both[:n], both[n:]
            dist.all_to_all_single(step.inbox[:sum(rows["receive"])], step.permuted,
                                   rows["receive"], rows["send"])

        def combine() -> None:
            dist.all_to_all_single(step.back, step.expert_out[:sum(rows["receive"])],
                                   rows["send"], rows["receive"])
            step.returned.copy_(step.sends)

        return exchange_counts, dispatch, combine

    def synchronize(self) -> None:
        self.torch.cuda.synchronize()


class SymmExchange:
    """The step's exchanges by PyTorch symmetric memory's ``all_to_all_vdev`` (its
    NVSHMEM backend): every tensor it moves in symmetric memory, the rows each rank sends
    read by its kernel from the device and the rows received written there (splits count
    rows of the first dimension); the combine sends back what the dispatch received."""

    name = SYMM
    graphs = True

    def __init__(self, torch, symm_mem, group_name: str, rank: int) -> None:
        self.torch, self.symm_mem, self.group_name = torch, symm_mem, group_name
        self.rank = rank
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.op = torch.ops.symm_mem.all_to_all_vdev

    def buffer(self, shape: tuple[int, ...], dtype):
        """A tensor of symmetric memory, mapped by every peer now (collective)."""
        tensor = self.symm_mem.empty(*shape, dtype=dtype, device=self.device)
        self.symm_mem.rendezvous(tensor, self.group_name)
        return tensor

    def bind(self, step) -> tuple:
        torch, op, group, layer = self.torch, self.op, self.group_name, step.layer
        n, hidden = layer.ranks, layer.hidden
        # Each call its own splits and counts-received tensor: the op signals through the
        # latter's pad, which no two calls in flight may share.
        count_rows, count_out = self.buffer((n,), torch.int64), self.buffer((2, n), torch.int64)
        count_rows.fill_(layer.local_experts)
        send_rows, dispatch_out = self.buffer((n,), torch.int64), self.buffer((2, n), torch.int64)
        back_rows, combine_out = self.buffer((n,), torch.int64), self.buffer((2, n), torch.int64)

        def exchange_counts() -> None:
            op(step.counts, step.counts_in, count_rows, count_out, group)

        def dispatch() -> None:
            torch.div(step.sends, hidden, rounding_mode="floor", out=send_rows)
            op(step.permuted, step.inbox, send_rows, dispatch_out, group)
            torch.mul(dispatch_out[0], hidden, out=step.received)

        def combine() -> None:
            back_rows.copy_(dispatch_out[0])
            op(step.expert_out, step.back, back_rows, combine_out, group)
            torch.mul(combine_out[0], hidden, out=step.returned)

        return exchange_counts, dispatch, combine

    def synchronize(self) -> None:
        self.torch.cuda.synchronize()


def vdev_trap(layer: moe.Layer, setting: str | None) -> str | None:
    """Why ``all_to_all_vdev`` would trap on this layer, or None: its kernel cuts what
    each peer sends into equal parts per block and asserts on a remainder (ending the
    process), so a row's bytes must divide by its blocks per peer, for the count exchange
    (a row: one int64), the dispatch and the combine (a row: a token)."""
    from ipcshare.baselines.torch_symm_alltoall import NBLOCKS_SETTING, vdev_blocks_per_peer

    row = layer.hidden * layer.itemsize
    for what, input_bytes, row_bytes in (
            ("count exchange", layer.experts * 8, 8),
            ("dispatch", layer.pairs * row, row),
            ("combine", layer.capacity * row, row)):
        parts = vdev_blocks_per_peer(input_bytes, layer.ranks, setting)
        if row_bytes % parts:
            return (f"all_to_all_vdev's kernel cuts a peer's bytes over {parts} blocks and "
                    f"traps on a remainder; the {what}'s rows of {row_bytes} bytes do not "
                    f"divide (choose --hidden so, or set {NBLOCKS_SETTING}={layer.ranks})")
    return None


def symm_refusal(torch, dist, world, layer: moe.Layer, no_nccl: str | None):
    """(symmetric memory's module, None) where the torch symm version can run here, else
    (None, why not); the same on every rank."""
    from ipcshare.baselines.torch_symm_alltoall import NBLOCKS_SETTING, all_to_all_vdev_module

    symm_mem, reason = None, None
    if dist is None:
        reason = f"needs torch.distributed's NCCL group, which is not there ({no_nccl})"
    elif world.node_count > 1:
        reason = f"maps peers by CUDA IPC: one node only, not {world.node_count}"
    else:
        try:
            symm_mem = all_to_all_vdev_module(torch)
        except ConfigError as exc:
            reason = str(exc)
        else:
            reason = vdev_trap(layer, os.environ.get(NBLOCKS_SETTING))
    reasons = [r for r in world.comm.allgather(reason) if r]
    return (None, reasons[0]) if reasons else (symm_mem, None)


# -- the table (pure: rows in, text out) -------------------------------------------------------

def ratios(rows: list[dict[str, Any]]) -> None:
    """Each timed row's time over ours (``over_ours``), where both were right and passed
    their checks; None elsewhere."""
    ours = next((row for row in rows if row["version"] == OURS), None)
    base = ours["time_us"] if ours and _clean(ours) else None
    for row in rows:
        row["over_ours"] = (round(row["time_us"] / base, 3)
                            if base and _clean(row) else None)


def _clean(row: dict[str, Any]) -> bool:
    return (row.get("time_us") is not None and not row["wrong"] and not row["errors"]
            and not row.get("measurement_errors"))


def exit_status(rows: list[dict[str, Any]]) -> int:
    """The ``ipcshare`` commands' status for these rows: a wrong element first (3), then a
    version that failed to run (1), then a figure that failed its checks (5), else 0."""
    from ipcshare.cli.exit_codes import EXIT_ERROR, EXIT_MEASUREMENT, EXIT_OK, EXIT_WRONG

    if any(row.get("wrong") for row in rows):
        return EXIT_WRONG
    if any(row.get("errors") for row in rows):
        return EXIT_ERROR
    if any(row.get("measurement_errors") for row in rows):
        return EXIT_MEASUREMENT
    return EXIT_OK


def _si(value: float, unit: str, digits: int) -> str:
    """``value`` with an SI prefix: (469762048, "B", 1) -> '469.8 MB'."""
    for prefix, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.{digits}f} {prefix}{unit}"
    return f"{value:.0f} {unit}".rstrip()


def render_markdown(results: dict[str, Any]) -> str:
    """The results as a Markdown table with its title and notes."""
    lines = [f"### MoE step: {results['layer_text']}, {results['device']}", "",
             f"{results['versions_text']}; median of {results['samples']} samples after "
             f"{results['warmup']} warm-up steps, each sample the slowest rank's.", "",
             "| version | timing | checked | µs per step | host clock µs | tokens/s "
             "| sent to peers per rank | GB/s | ÷ ipcshare |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    notes = []
    for row in results["rows"]:
        label = VERSIONS[row["version"]]
        if row.get("skipped"):
            lines.append(f"| {label} | not run | | | | | | | |")
            notes.append(f"{row['version']}: not run: {row['skipped']}")
            continue
        checked = (f"{row['checked_steps']} steps, "
                   + (f"{row['wrong']} WRONG" if row["wrong"] else "bit for bit")
                   if row["checked_steps"] else "")
        figures = ([f"{row['time_us']:.1f}", f"{row['host_clock_us']:.1f}",
                    _si(row["tokens_per_s"], "", 2), _si(row["bytes_per_rank"], "B", 1),
                    f"{row['gbps']:.1f}"] if row.get("time_us") is not None else [""] * 5)
        ratio = "" if row.get("over_ours") is None else f"{row['over_ours']:.2f}"
        lines.append(f"| {label} | {row['timing']} | {checked} | " + " | ".join(figures)
                     + f" | {ratio} |")
        if row.get("note"):
            notes.append(f"{row['version']}: {row['note']}")
        notes += [f"{row['version']}: ERROR: {error}"
                  for error in row["errors"] + row.get("measurement_errors", [])]
    if notes:
        lines += [""] + [f"- {note}" for note in notes]
    return "\n".join(lines) + "\n"


# -- one version: check, capture, time ------------------------------------------------------

class Bench:
    """One launch: the layer, the references (computed once per step number, shared by
    the versions), the timer and the checks. Collective throughout."""

    def __init__(self, torch, group, layer: moe.Layer, args: argparse.Namespace,
                 progress: ProgressLine) -> None:
        from ipcshare.patterns.driver import run_ceiling
        from ipcshare.vs_torch.clock import EventClock

        self.torch, self.group, self.layer, self.args = torch, group, layer, args
        self.world, self.comm = group.world, group.world.comm
        self.progress = progress
        self.weights = moe.router_weights(args.seed, layer.hidden, layer.experts)
        self.stream = torch.cuda.Stream()
        self.clock = EventClock(torch, self.stream, self.comm)
        self.ceiling = run_ceiling(group)
        self._references: dict[int, moe.Expected] = {}

    def expected(self, number: int) -> moe.Expected:
        if number not in self._references:
            self._references[number] = moe.reference(self.layer, self.weights,
                                                     self.args.seed, number, self.group.rank)
        return self._references[number]

    def _show(self, version: str, text: str) -> None:
        self.progress.show(f"{SCRIPT}: {version}: {text}")

    def measure(self, exchange) -> dict[str, Any]:
        """Collective: ``exchange``'s version of the step checked, then timed if right.

        Raises:
            IpcShareError: a step failed on some rank (on every rank alike).
        """
        torch, layer, args, name = self.torch, self.layer, self.args, exchange.name
        row: dict[str, Any] = {"version": name, "timing": "eager", "checked_steps": 0,
                               "wrong": 0, "errors": []}
        problems: list[str] = []
        graph = None

        def checked(number: int, run, what: str) -> None:
            self._show(name, f"checking step {number + 1} ({what})")
            with collective_step(self.world, f"{name}: checked step {number} ({what})"):
                parts = step.check(run, args.seed, number, self.weights,
                                   self.expected(number))
            row["wrong"] += sum(parts.values())
            row["checked_steps"] += 1
            if sum(parts.values()):
                problems.append(f"{name}: step {number} ({what}): "
                                f"{moe.describe_wrong(parts)}")

        with self.torch.cuda.stream(self.stream):
            with collective_step(self.world, f"{name}: setting up the step"):
                step = moe.GpuStep(torch, layer, self.weights, exchange)
            try:
                # Eager steps first: checked, and the warm-up torch asks for before a capture.
                for number in range(args.checks):
                    checked(number, step, "eager")
                if exchange.graphs:
                    graph, why = self._capture(step)
                    if graph is None:
                        row["note"] = f"not captured, timed eager: {why}"
                    else:
                        row["timing"] = "one CUDA graph"
                        for number in range(args.checks, 2 * args.checks):
                            checked(number, graph.replay, "graph replay")
                row["wrong"] = moe.settle(self.group, row["wrong"], problems, SCRIPT)
                if not row["wrong"]:
                    last = row["checked_steps"] - 1   # the tokens the step holds now
                    self._time(row, step, graph.replay if graph is not None else step,
                               self.expected(last))
            finally:
                if graph is not None:
                    graph.reset()
                torch.cuda.synchronize()
        return row

    def _capture(self, step) -> tuple[Any, str | None]:
        """(a CUDA graph of one step, None), or (None, why not) on every rank alike."""
        torch = self.torch
        graph, error = torch.cuda.CUDAGraph(), None
        try:
            torch.cuda.synchronize()
            # thread_local: NCCL's watchdog thread may query events while we capture.
            with torch.cuda.graph(graph, stream=self.stream, capture_error_mode="thread_local"):
                step()
            torch.cuda.synchronize()
        except Exception as exc:  # a capture torch refuses: timed eager, the reason shown
            error = " ".join(str(exc).split())[:200] or type(exc).__name__
        errors = [e for e in self.comm.allgather(error) if e]
        return (None, errors[0]) if errors else (graph, None)

    def _time(self, row: dict[str, Any], step, run, expected: moe.Expected) -> None:
        """Fill ``row``'s figures: ``run`` timed, one step per sample (collective)."""
        layer, args, name = self.layer, self.args, row["version"]
        for _ in range(args.warmup):
            run()
        step.exchange.synchronize()
        readings = []
        for sample in range(args.iters):
            self._show(name, f"timing sample {sample + 1} of {args.iters}")
            readings.append(self.clock.timed(run, 1))
        step.exchange.synchronize()   # what a kernel recorded while timed, raised
        timer = [timer_s for timer_s, _wall in readings]
        wall = [wall_s for _timer, wall_s in readings]
        mine = [error for error in [latency_clock_disagreement(
            timer, wall, f"{name} step", self.clock.offset())] if error]
        seconds = percentile(slowest_rank_samples(self.comm, timer), 50)
        host = percentile(slowest_rank_samples(self.comm, wall), 50)
        # What this rank sends its peers in the timed step (the tokens it holds now):
        # the dispatch's rows to other ranks, and the combine's rows back to them.
        rank = self.group.rank
        to_peers = (int(expected.sent_splits.sum() - expected.sent_splits[rank])
                    + int(expected.received_splits.sum() - expected.received_splits[rank])
                    ) * layer.itemsize
        busiest = max(self.comm.allgather(to_peers))
        row["time_us"], row["host_clock_us"] = seconds * 1e6, host * 1e6
        row["tokens_per_s"] = layer.tokens * layer.ranks / seconds
        row["bytes_per_rank"] = busiest
        row["gbps"] = busiest / seconds / 1e9
        ceiling = ceiling_error(row["gbps"], self.ceiling, f"{name} step")
        row["measurement_errors"] = agreed_errors(self.comm,
                                                  mine + ([ceiling] if ceiling else []))


def run_bench(group, layer: moe.Layer, args: argparse.Namespace) -> dict[str, Any]:
    """Collective: every version measured; the results document.

    Raises:
        moe.Refused: this job cannot run the benchmark (on every rank alike).
    """
    if group.backend_name == "host":
        raise moe.Refused("needs GPUs (CUDA graphs, NCCL), and this group runs on host memory "
                          "(backend host); moe_dispatch.py --backend host runs the step there")
    from torch_grad_allreduce_graph import start_nccl  # its sibling's, as moe_dispatch's

    torch = moe.import_torch()
    torch.cuda.set_device(group.backend.device)
    progress = ProgressLine(enabled=group.rank == 0)
    dist, no_nccl = start_nccl(group, torch)
    rows = []
    nvshmem_started = False
    try:
        symm_mem, no_symm = symm_refusal(torch, dist, group.world, layer, no_nccl)
        bench = Bench(torch, group, layer, args, progress)
        with moe.step_communicator(group, layer) as comm:
            rows.append(_guarded(bench, moe.LibraryExchange(torch, comm, bench.stream)))
        if dist is None:
            rows.append({"version": NCCL, "skipped": no_nccl})
        else:
            rows.append(_guarded(bench, HostSplitsNcclExchange(torch, dist)))
        if symm_mem is None:
            rows.append({"version": SYMM, "skipped": no_symm})
        else:
            rows.append(_symm_row(bench, torch, dist, symm_mem, layer))
            nvshmem_started = "skipped" not in rows[-1]
    finally:
        progress.clear()
        if nvshmem_started:
            # Its tensors freed (the step's cycles collected), then NVSHMEM finalized
            # while the process group it was started over still lives.
            gc.collect()
            torch.cuda.synchronize()
            from ipcshare.baselines.torch_symm_alltoall import finalize_nvshmem
            finalize_nvshmem(group.world.comm)
        if dist is not None:
            dist.destroy_process_group()
    ratios(rows)
    return _results(torch, group, layer, args, rows)


def _guarded(bench: Bench, exchange) -> dict[str, Any]:
    """``bench.measure(exchange)``, or a row carrying the error every rank agreed on; the
    step's memory given back to the GPU either way (the next version's must fit)."""
    try:
        return bench.measure(exchange)
    except IpcShareError as exc:
        return {"version": exchange.name, "timing": "", "checked_steps": 0, "wrong": 0,
                "errors": [str(exc)]}
    finally:
        bench.torch.cuda.empty_cache()


def _symm_row(bench: Bench, torch, dist, symm_mem, layer: moe.Layer) -> dict[str, Any]:
    from ipcshare.baselines.torch_symm_alltoall import use_nvshmem

    try:
        with collective_step(bench.world, "torch symm: NVSHMEM backend"):
            # Its heap must hold the step's tensors: NVSHMEM reads the size once, at its
            # first allocation.
            os.environ.setdefault("NVSHMEM_SYMMETRIC_SIZE",
                                  str(layer.exchanged_bytes + NVSHMEM_HEAP_SLACK))
            use_nvshmem(symm_mem, torch.device("cuda", torch.cuda.current_device()))
    except IpcShareError as exc:
        return {"version": SYMM, "skipped": str(exc)}
    return _guarded(bench, SymmExchange(torch, symm_mem, dist.group.WORLD.group_name,
                                             dist.get_rank()))


def _results(torch, group, layer: moe.Layer, args, rows) -> dict[str, Any]:
    nccl = torch.cuda.nccl.version()
    nccl = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    devices = group.world.comm.allgather(torch.cuda.get_device_name())
    return {
        "ipcshare": ipcshare.__version__, "benchmark": "moe_step",
        "layer": {"ranks": layer.ranks, "tokens": layer.tokens, "hidden": layer.hidden,
                  "experts": layer.experts, "topk": layer.topk, "dtype": layer.dtype},
        "layer_text": layer.describe(), "world_size": group.size,
        "nodes": group.world.node_count, "devices": devices,
        "device": f"{group.size} x {devices[0]}" if len(set(devices)) == 1 else
                  ", ".join(devices),
        "versions_text": f"torch {torch.__version__.split('+')[0]}, NCCL {nccl}",
        "samples": args.iters, "warmup": args.warmup, "checks": args.checks,
        "statistic": "median over samples of the slowest rank's time per step",
        "rows": rows,
        "ok": exit_status(rows) == 0,
        "exit_status": exit_status(rows),
    }


def result_rows(results: dict[str, Any], launch: str) -> list[dict[str, Any]]:
    """The result document's row of ``results`` (``_results``): ours, each baseline that
    ran beside it (``path``: how it was timed), the busiest rank's bytes sent per step as
    the size; no row where no version has a figure."""
    from ipcshare.runtime.result_document import baseline_figure, figure, make_row

    def timed(row: dict[str, Any]) -> bool:
        return "skipped" not in row and (row.get("time_us") is not None or row["wrong"])

    rows = results["rows"]
    ours = next((row for row in rows if row["version"] == OURS and timed(row)), None)
    theirs = [row for row in rows if row["version"] != OURS and timed(row)]
    if ours is None and not theirs:
        return []
    errors = list(ours.get("measurement_errors", [])) if ours else []
    errors += [f"{row['version']} baseline: {error}" for row in theirs
               for error in row.get("measurement_errors", [])]
    sized = next((row for row in (ours, *theirs) if row and row.get("bytes_per_rank")), {})
    layer = results["layer"]
    return [make_row(
        op="moe-step", size=int(sized.get("bytes_per_rank", 0)), dtype=layer["dtype"],
        algorithm=VERSIONS[OURS], mode="graph" if ours and ours["timing"] == "one CUDA graph"
        else "eager", world_size=results["world_size"], launch=launch,
        ours=None if ours is None or ours.get("time_us") is None else figure(
            ours["time_us"], ours["gbps"], None, wall_us=ours["host_clock_us"]),
        baselines=[baseline_figure(
            row["version"], row.get("time_us"), row.get("gbps"), None, wrong=row["wrong"],
            error="; ".join(row.get("measurement_errors", [])) or None,
            path=f"{VERSIONS[row['version']]}, timed {row['timing']}",
            **({"wall_us": row["host_clock_us"]} if row.get("time_us") is not None else {}))
            for row in theirs],
        wrong=ours["wrong"] if ours else None, errors=errors,
        details={"layer": results["layer_text"], "size": "bytes the busiest rank sends its "
                 "peers per step", "algbw": "those bytes over the step's time",
                 "tokens_per_s": ours.get("tokens_per_s") if ours else None})]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    moe.add_layer_flags(parser)
    parser.set_defaults(tokens=4096, hidden=7168, dtype="bfloat16", topk=8, experts=32)
    parser.add_argument("--checks", type=int, default=2,
                        help="checked steps per version, eager (and as many replays)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per version")
    parser.add_argument("--iters", type=int, default=20, help="timed steps per version")
    parser.add_argument("--markdown", metavar="FILE", help="write the table there (rank 0)")
    parser.add_argument("--json", metavar="FILE", help="write the results there (rank 0)")
    parser.add_argument("--result", metavar="FILE",
                        help="write the figures as a result document (rank 0; docs/CLI.md)")
    args = parser.parse_args(argv)
    moe.check_flags(parser, args, {**moe.LAYER_MINIMUMS, "--checks": 1, "--warmup": 0,
                                   "--iters": 1})
    for path in (args.markdown, args.json, args.result):
        try:
            check_writable(path)
        except ConfigError as exc:
            parser.error(str(exc))
    try:
        with ipcshare.Group(backend=args.backend) as group:
            layer = moe.make_layer(group, args)
            results = run_bench(group, layer, args)
            if group.rank == 0:
                table = render_markdown(results)
                print(table, end="", flush=True)
                if args.markdown:
                    with open(args.markdown, "w") as out:
                        out.write(table)
                if args.json:
                    with open(args.json, "w") as out:
                        json.dump(results, out, indent=1)
                        out.write("\n")
                if args.result:
                    from ipcshare.cli.result_file import write_result
                    from ipcshare.runtime.result_document import new_launch_id

                    write_result(args.result, tool=f"examples/{SCRIPT}",
                                 world_size=results["world_size"],
                                 rows=result_rows(results, new_launch_id()),
                                 exit_status=results["exit_status"],
                                 argv=["python", f"examples/{SCRIPT}",
                                       *(sys.argv[1:] if argv is None else argv)])
    except (moe.Refused, IpcShareError) as exc:  # every rank alike: one line each, no hang
        sys.stderr.write(f"{SCRIPT}: error: {exc}\n")
        return 1
    return results["exit_status"]


if __name__ == "__main__":
    sys.exit(main())
