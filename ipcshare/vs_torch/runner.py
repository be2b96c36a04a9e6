"""What a PyTorch user sees: ipcshare's collectives against NCCL through torch.distributed
on the user's own CUDA tensors, in one launch: same process, same tensors, same sizes,
one torch stream (``ipcshare vs-torch``, run under mpiexec on one node, one rank per GPU).

Ours against torch's, per op: ``comm.all_reduce(t, stream=s)`` / ``dist.all_reduce(t)``,
``comm.all_gather(out, t, stream=s)`` / ``dist.all_gather_into_tensor(out, t)``,
``comm.reduce_scatter(out, t, stream=s)`` / ``dist.reduce_scatter_tensor(out, t)``,
``comm.all_to_all(out, t, stream=s)`` / ``dist.all_to_all_single(out, t)``. Timings:

- graph: one torch CUDA graph of CALLS calls replayed REPLAYS times between CUDA events;
- eager: CALLS back-to-back calls between CUDA events, after WARMUP calls;
- host: Python's time per call over HOST_CALLS calls enqueued without waiting, ours bound
  (``comm.bind``, the target is 2 us) and plain, and torch's.

Every figure is the slowest rank's (a float64 MPI reduction). Before any is shown: every
kind of call (ours plain, bound and graph-replayed; torch's eager and graph-replayed) is
verified once per size against exact expected values (``expected.py``); each event
figure agrees with the host clock over the same calls (``clock.py``: 10% + 50 us after
the clock's offset); no busbw passes the ceiling of the rank's links
(topology/link_speed.py). A side with wrong elements shows ``wrong`` and is never divided
by; a row failing a check shows its errors and is left out of the ratios. An all-to-all
that ipcshare refuses here is shown as refused, with why.
"""

from __future__ import annotations

import datetime
import math
import os
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from .. import __version__
from ..runtime.config import format_size
from ..runtime.errors import ConfigError
from ..runtime.source_commit import source_commit
from . import expected as exact
from .clock import EventClock, clock_errors
from .plan import DTYPES, MODES, SIDES, Options, SizePlan, communicator_bytes, size_plan, sweep
from .rows import judge_row, max_over_ranks, new_row

__all__ = ["TorchComparison"]


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


class _RowFailed(Exception):
    """A step of a row failed on some rank; the messages, alike on every rank."""

    def __init__(self, messages: list[str]) -> None:
        super().__init__("; ".join(messages))
        self.messages = messages


class _Refused(Exception):
    """Every rank's ipcshare refused the call: rank 0's reason."""


def _commit() -> str | None:
    """The commit that runs (12 digits, with ``+dirty`` for uncommitted changes), or None
    where it is not known."""
    commit = source_commit()
    if commit["source"] == "unknown":
        return None
    return commit["id"][:12] + ("+dirty" if commit["dirty"] else "")


# Per-rank figures reduced in one buffer, in this order (seconds; NaN: not measured).
FIGURES = ("ours_graph", "ours_eager", "torch_graph", "torch_eager", "ours_graph_wall",
           "ours_eager_wall", "torch_graph_wall", "torch_eager_wall", "ours_host_bound",
           "ours_host_plain", "torch_host")


class RowProgress(Protocol):
    """What rank 0 tells as rows go: a row about to start, and a row judged."""

    def starting(self, index: int, total: int, plan: SizePlan) -> None: ...

    def done(self, index: int, total: int, row: dict[str, Any]) -> None: ...


class TorchComparison:
    """One launch: the group, the process group, the communicator, every row
    (``torch``, ``dist`` and ``mpi``: the modules, imported by the caller)."""

    def __init__(self, options: Options, torch: Any, dist: Any, mpi: Any, *,
                 progress: RowProgress | None = None) -> None:
        self.options, self.torch, self.dist, self.MPI = options, torch, dist, mpi
        self.progress = progress
        self.comm = mpi.COMM_WORLD
        self.rank, self.world = self.comm.Get_rank(), self.comm.Get_size()
        self.dtype = getattr(torch, options.dtype)
        self.int_view = torch.int16 if DTYPES[options.dtype][0] == 2 else torch.int32

    # -- setup --------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Collective: every row, measured, checked and judged; the results document.

        Raises:
            ConfigError: the run cannot start here (too many ranks, several nodes, ranks
                sharing a GPU, no size with an element per rank), on every rank alike.
        """
        from ..baselines.torch_rendezvous import start_nccl_process_group
        from ..patterns.driver import run_ceiling
        from ..runtime.nvlink_multicast import keep_multicast_off
        from ..window import Group

        torch, dist = self.torch, self.dist
        keep_multicast_off()  # NCCL_NVLS_ENABLE=0 unless the user set it
        if self.world > exact.MAX_RANKS:
            raise ConfigError(f"{self.world} ranks: at most {exact.MAX_RANKS} (the checks' sums "
                              "stay exact in bfloat16 up to there)")
        options = self.options
        itemsize = DTYPES[options.dtype][0]
        plans = [plan for op in options.ops
                 for size in sweep(options.min_bytes, options.max_bytes, options.step_factor)
                 if (plan := size_plan(op, size, self.world, itemsize)) is not None]
        if not plans:
            raise ConfigError("no size leaves one element per rank; raise -b")
        with Group(backend="cuda-vmm") as group:
            if group.world.node_count != 1:
                raise ConfigError(f"ranks on {group.world.node_count} nodes: one node only "
                                  "(the rendezvous is at 127.0.0.1)")
            if group.shared_gpus:
                raise ConfigError("ranks share a GPU: NCCL needs one GPU per rank")
            self.device = group.backend.device
            torch.cuda.set_device(self.device)
            start_nccl_process_group(dist, self.comm, rank=self.rank, size=self.world,
                                     device=torch.device("cuda", self.device))
            try:
                # The first collective builds NCCL's communicators: outside every timing.
                dist.barrier(device_ids=[self.device])
                torch.cuda.synchronize()
                self.ceiling = run_ceiling(group)
                with group.communicator(max_bytes=communicator_bytes(plans)) as cm:
                    self.cm = cm
                    self.stream = torch.cuda.Stream(device=self.device)
                    with torch.cuda.stream(self.stream):
                        self.clock = EventClock(torch, self.stream, self.comm)
                        self.offset = self.clock.offset()
                        rows = [self._row(plan, index, len(plans))
                                for index, plan in enumerate(plans, 1)]
                    torch.cuda.synchronize()
                results = self._results(rows, plans)
            finally:
                dist.destroy_process_group()
        return results

    def _agreed(self, name: str, action: Callable[[], Any], refusable: tuple = ()) -> Any:
        """Collective: ``action()`` on every rank; a failure anywhere raises _RowFailed on
        every rank with each rank's message, a refusal (of ``refusable``) on every rank
        raises _Refused."""
        kind = message = result = None
        try:
            result = action()
        except refusable as exc:
            kind, message = "refused", _one_line(exc)
        except Exception as exc:  # any rank's failure fails the row on every rank
            kind, message = "failed", f"{type(exc).__name__}: {_one_line(exc)}"
        found = self.comm.allgather((kind, message))
        if all(k is None for k, _ in found):
            return result
        if all(k == "refused" for k, _ in found):
            raise _Refused(found[0][1])
        raise _RowFailed([f"{name}: rank {r}: {m}" if k == "failed" else
                          f"{name}: rank {r}: refused: {m}"
                          for r, (k, m) in enumerate(found) if k])

    def _values(self, segments: Sequence[exact.Segment], count: int, dtype: Any) -> Any:
        """A device tensor of ``count`` elements holding ``segments``."""
        torch = self.torch
        out = torch.empty(count, dtype=dtype, device=self.device)
        at = 0
        for segment in segments:
            period = torch.from_numpy(exact.rolled(segment)).to(device=self.device, dtype=dtype)
            reps = -(-segment.length // exact.PERIOD)
            out[at:at + segment.length].copy_(period.repeat(reps)[:segment.length])
            at += segment.length
        return out

    def _wrong(self, got: Any, want: Any, tolerance: float) -> int:
        """Elements of ``got`` that are not ``want``: bit for bit, or within a relative
        ``tolerance`` (``want`` then in float32)."""
        if tolerance == 0:
            return int((got.view(self.int_view) != want.view(self.int_view)).sum().item())
        got = got.float()
        close = (got == want) | ((got - want).abs() <= tolerance * want.abs())
        return int((~close).sum().item())

    def _capture(self, call: Callable[[], None]) -> Any:
        torch = self.torch
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        # thread_local: NCCL's watchdog thread may query events while we capture.
        with torch.cuda.graph(graph, stream=self.stream, capture_error_mode="thread_local"):
            for _ in range(self.options.calls):
                call()
        torch.cuda.synchronize()
        return graph

    def _host(self, call: Callable[[], None]) -> float:
        """Python's seconds per call of ``host_calls`` calls, none waited for."""
        torch = self.torch
        for _ in range(self.options.warmup):
            call()
        torch.cuda.synchronize()
        self.comm.Barrier()
        start = time.perf_counter()
        for _ in range(self.options.host_calls):
            call()
        seconds = (time.perf_counter() - start) / self.options.host_calls
        torch.cuda.synchronize()
        self.comm.Barrier()
        return seconds

    # -- one row ------------------------------------------------------------------------
    def _calls(self, op: str, out: Any, inp: Any) -> tuple[Callable, Callable, Callable]:
        """(ours plain, ours bound once here, torch's) for ``op`` on these tensors."""
        cm, dist, s = self.cm, self.dist, self.stream
        if op == "all_reduce":
            return (lambda: cm.all_reduce(inp, stream=s),
                    lambda: cm.bind("all_reduce", inp, stream=s),
                    lambda: dist.all_reduce(inp))
        ours = {"all_gather": cm.all_gather, "reduce_scatter": cm.reduce_scatter,
                "all_to_all": cm.all_to_all}[op]
        theirs = {"all_gather": dist.all_gather_into_tensor,
                  "reduce_scatter": dist.reduce_scatter_tensor,
                  "all_to_all": dist.all_to_all_single}[op]
        return (lambda: ours(out, inp, stream=s), lambda: cm.bind(op, out, inp, stream=s),
                lambda: theirs(out, inp))

    def _row(self, plan: SizePlan, index: int, total: int) -> dict[str, Any]:
        from ..patterns.clock_check import agreed_errors

        torch = self.torch
        if self.rank == 0 and self.progress is not None:
            self.progress.starting(index, total, plan)
        row = new_row(plan)
        figures = dict.fromkeys(FIGURES, math.nan)
        graphs: list[Any] = []
        try:
            self._measure(plan, row, figures, graphs)
        except _RowFailed as failed:
            row["errors"] += failed.messages
            row["step_failed"] = True
        finally:
            for graph in graphs:
                graph.reset()
            torch.cuda.synchronize()
        reduced = max_over_ranks(self.comm, [figures[k] for k in FIGURES], self.MPI.MAX)
        value = {key: None if math.isnan(seconds) else float(seconds)
                 for key, seconds in zip(FIGURES, reduced, strict=True)}
        calls = self.options.calls
        per_call = {"graph": calls * self.options.replays, "eager": calls}
        for side in SIDES:
            for mode in MODES:
                seconds = value[f"{side}_{mode}"]
                row[side][f"{mode}_us"] = None if seconds is None else round(
                    seconds / per_call[mode] * 1e6, 3)
                wall = value[f"{side}_{mode}_wall"]
                row[side][f"{mode}_host_clock_us"] = None if wall is None else round(
                    wall / per_call[mode] * 1e6, 3)
        for key in ("host_bound", "host_plain"):
            seconds = value[f"ours_{key}"]
            row["ours"][f"{key}_us"] = None if seconds is None else round(seconds * 1e6, 3)
        seconds = value["torch_host"]
        row["torch"]["host_us"] = None if seconds is None else round(seconds * 1e6, 3)
        row["errors"] += agreed_errors(self.comm, row.pop("_clock_errors", []))
        judge_row(row, world=self.world, ceiling=self.ceiling)
        if self.rank == 0 and self.progress is not None:
            self.progress.done(index, total, row)
        return row

    def _measure(self, plan: SizePlan, row: dict[str, Any], figures: dict[str, float],
                 graphs: list[Any]) -> None:
        """Collective: check every kind of call of ``plan``'s op on both sides, then time
        the sides found right, filling ``row`` and this rank's ``figures`` (seconds);
        the graphs made go into ``graphs`` (the caller releases them)."""
        torch, args = self.torch, self.options
        rank, world = self.rank, self.world
        segments, tolerance = exact.graph_expected(plan, rank, world, args.calls, args.dtype)

        def tensors() -> tuple[Any, Any, Any, Any, Any]:
            pristine = self._values(exact.input_segments(plan, rank, world), plan.in_count,
                                    self.dtype)
            inp = torch.empty_like(pristine)
            out = inp if plan.op == "all_reduce" else torch.empty(
                plan.out_count, dtype=self.dtype, device=self.device)
            expected = self._values(exact.expected_segments(plan, rank, world), plan.out_count,
                                    self.dtype)
            after_graph = expected if segments is None else self._values(
                segments, plan.out_count, self.dtype if tolerance == 0 else torch.float32)
            return pristine, inp, out, expected, after_graph
        pristine, inp, out, expected, after_graph = self._agreed("allocating the tensors",
                                                                 tensors)

        def checked(run: Callable[[], None], ours: bool, want: Any = expected,
                    tol: float = 0.0) -> Callable[[], int]:
            """A step: fresh input, poisoned output, ``run()`` once, its wrong elements."""
            def check() -> int:
                inp.copy_(pristine)
                if out is not inp:
                    out.fill_(math.nan)
                torch.cuda.synchronize()
                self.comm.Barrier()
                run()
                if ours:
                    self.cm.synchronize(self.stream)  # what a kernel recorded, raised
                torch.cuda.synchronize()
                return self._wrong(out, want, tol)
            return check

        plain, bind, theirs = self._calls(plan.op, out, inp)
        wrong: dict[str, int] = {}
        ours = None  # (bound call, graph) once every check of ours ran
        try:
            ours = self._check_ours(plan, plain, bind, checked, after_graph, tolerance,
                                    wrong, graphs)
        except _Refused as refused:
            row["ours"]["refused"] = str(refused)
        wrong["torch call"] = self._agreed("torch checked call", checked(theirs, False))
        torch_graph = self._agreed("torch graph capture", lambda: self._capture(theirs))
        graphs.append(torch_graph)
        wrong["torch graph"] = self._agreed(
            "torch checked graph", checked(torch_graph.replay, False, after_graph, tolerance))
        # Wrong elements summed over the ranks, as one int64 buffer.
        mine = np.asarray(list(wrong.values()), dtype=np.int64)
        total = np.empty_like(mine)
        self.comm.Allreduce(mine, total, op=self.MPI.SUM)
        summed = dict(zip(wrong, (int(n) for n in total), strict=True))
        for side in SIDES:
            by_call = {k.split(" ", 1)[1]: n for k, n in summed.items() if k.startswith(side)}
            row[side]["wrong_by_call"] = by_call
            if side == "torch" or ours is not None:
                row[side]["wrong"] = sum(by_call.values())
        if plan.op == "all_reduce":
            inp.zero_()  # timed in place: zero is the one sum that stays what it was
        # A wrong side is not timed: it has no figure to show.
        sides = [] if row["torch"]["wrong"] else [("torch", theirs, torch_graph)]
        if ours is not None and not row["ours"]["wrong"]:
            sides.insert(0, ("ours", plain, ours[1]))
        readings: dict[str, tuple[float, float]] = {}
        for side, call, captured in sides:
            timed = self._agreed(f"{side} timing",
                                 lambda call=call, captured=captured, side=side:
                                 self._time_side(side, call, captured))
            for mode, (timer_s, wall_s) in timed.items():
                figures[f"{side}_{mode}"], figures[f"{side}_{mode}_wall"] = timer_s, wall_s
                stretch = (f"{side} {mode} {plan.op} {format_size(plan.size)} "
                           f"({args.calls} calls" + (f" x {args.replays} replays)"
                                                      if mode == "graph" else ")"))
                readings[stretch] = (timer_s, wall_s)
        if ours is not None and not row["ours"]["wrong"]:
            bound = ours[0]
            figures["ours_host_bound"] = self._agreed("ours host time, bound",
                                                      lambda: self._host(bound))
            figures["ours_host_plain"] = self._agreed("ours host time, plain",
                                                      lambda: self._host(plain))
            self._agreed("ours after host timing",
                         lambda: self.cm.synchronize(self.stream))
        figures["torch_host"] = self._agreed("torch host time", lambda: self._host(theirs))
        row["_clock_errors"] = clock_errors(readings, self.offset)

    def _check_ours(self, plan: SizePlan, plain: Callable[[], None], bind: Callable[[], Any],
                    checked: Callable[..., Callable[[], int]], after_graph: Any,
                    tolerance: float, wrong: dict[str, int],
                    graphs: list[Any]) -> tuple[Any, Any]:
        """Collective: check ours plain, bound and graph-replayed (wrong elements into
        ``wrong``); (the bound call, the graph).

        Raises:
            _Refused: every rank's ipcshare refused an all-to-all call.
        """
        from ..runtime.errors import CollectiveError, Unsupported

        refusable = (CollectiveError, Unsupported) if plan.op == "all_to_all" else ()
        wrong["ours call"] = self._agreed("ours checked call", checked(plain, True), refusable)
        bound = self._agreed("ours bind", bind, refusable)
        wrong["ours bound"] = self._agreed("ours checked bound call", checked(bound, True),
                                           refusable)
        graph = self._agreed("ours graph capture", lambda: self._capture(plain), refusable)
        graphs.append(graph)
        wrong["ours graph"] = self._agreed(
            "ours checked graph", checked(graph.replay, True, after_graph, tolerance),
            refusable)
        return bound, graph

    def _time_side(self, side: str, call: Callable[[], None],
                   captured: Any) -> dict[str, tuple[float, float]]:
        """(event seconds, host-clock seconds) of ``side``'s eager stretch of ``calls``
        calls, after ``warmup`` calls, and of ``replays`` replays of its graph."""
        for _ in range(self.options.warmup):
            call()
        eager = self.clock.timed(call, self.options.calls)
        captured.replay()  # the first launch uploads the graph
        in_graph = self.clock.timed(captured.replay, self.options.replays)
        if side == "ours":
            self.cm.synchronize(self.stream)  # what a kernel recorded, raised
        return {"eager": eager, "graph": in_graph}

    # -- outputs --------------------------------------------------------------------------
    def _results(self, rows: list[dict[str, Any]], plans: list[SizePlan]) -> dict[str, Any]:
        torch, options = self.torch, self.options
        offsets = max_over_ranks(self.comm, [self.offset], self.MPI.MAX)
        version = torch.cuda.nccl.version()
        nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        facts = {
            "world_size": self.world, "hostname": socket.gethostname(),
            "gpu_name": torch.cuda.get_device_name(self.device),
            "gpu_count": torch.cuda.device_count(), "nccl": nccl,
            "torch": torch.__version__.split("+")[0], "ipcshare": __version__,
            "commit": _commit() if self.rank == 0 else None,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE"),
        }
        failed = [row for row in rows if not row["ok"]]
        return {
            "tool": "vs-torch", "facts": facts,
            "options": {"dtype": options.dtype, "ops": list(options.ops),
                        "sizes": sorted({plan.size for plan in plans}),
                        "calls": options.calls, "replays": options.replays,
                        "warmup": options.warmup, "host_calls": options.host_calls,
                        "max_bytes": communicator_bytes(plans)},
            "ceiling": None if self.ceiling is None else self.ceiling.to_dict(),
            "clock_offset_us": round(float(offsets[0]) * 1e6, 3),
            # Stretches timed again because the clocks disagreed once (every rank alike).
            "clock_rechecks": self.clock.rechecks,
            "checks": {"rows": len(rows), "failed": len(failed),
                       "refused": sum(bool(row["ours"]["refused"]) for row in rows),
                       "errors": [f"{row['op']} {format_size(row['size'])}: {error}"
                                  for row in failed for error in row["errors"]]},
            "rows": rows,
        }
