"""What the GPU baselines share (NCCL through nccl4py, NCCL through torch.distributed,
PyTorch symmetric memory): buffers as torch tensors on this rank's GPU, the case's seeded
data and checks, nccl-tests timing (barrier, synchronize, host clock around back-to-back
calls, synchronize), latency timing by CUDA events, CUDA-graph capture, the kernel before
each operation, and the faster of a baseline's paths per size."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..liveness.consensus import collective_step
from ..patterns.base import SizePlan
from ..patterns.clock_check import (
    agreed_stretch,
    clock_disagreement,
    latency_clock_disagreement,
    torch_clock_offset,
    torch_event_reading,
    torch_event_stretch,
)
from ..patterns.rotation import warmup_iterations
from ..patterns.seeding import count_wrong, poison, seeded_bytes
from ..patterns.timing import mean_over_ranks, percentile, slowest_rank_samples
from ..runtime.errors import ConfigError
from ..topology.world import World, mpi

__all__ = ["GpuBaseline", "import_torch_cuda", "check_one_gpu_per_rank", "TORCH_DTYPES",
           "REDUCTION_OPS", "ALL_TO_ALL", "AllToAllSplits", "all_to_all_splits"]

# The reduction cases' datatypes as torch dtypes (attribute names of the torch module).
TORCH_DTYPES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16",
                "int32": "int32"}
REDUCTION_OPS = ("allreduce", "reducescatter")
ALL_TO_ALL = "alltoall"
# Moved as bytes: all-to-all too, whatever its datatype (nothing is reduced).
_BYTE_OPS = ("allgather", "ring")


@dataclass(frozen=True)
class AllToAllSplits:
    """Rank ``rank``'s side of the all-to-all case at one size, in bytes: what it sends
    each rank (``send[q]``, from its input in rank order) and receives from each rank
    (``receive[q]``, packed into its output in rank order); ``even`` when every block is
    alike (NCCL's ncclAlltoAll then, all-to-all-v otherwise)."""

    rank: int
    send: tuple[int, ...]
    receive: tuple[int, ...]
    even: bool

    @property
    def send_offsets(self) -> tuple[int, ...]:
        """Where the bytes for each rank start in the input."""
        return _starts(self.send)

    @property
    def receive_offsets(self) -> tuple[int, ...]:
        """Where the bytes from each rank start in the output."""
        return _starts(self.receive)


def _starts(lengths: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(start) for start in np.concatenate(([0], np.cumsum(lengths)[:-1])))


def all_to_all_splits(case: Any, plan: SizePlan, world_size: int, rank: int
                      ) -> AllToAllSplits:
    """Rank ``rank``'s byte counts of the all-to-all ``case`` at ``plan``: row ``rank``
    and column ``rank`` of the case's split matrix (the one the case checks with), times
    the element size. What NCCL's send / recv counts, torch's ``input_split_sizes`` /
    ``output_split_sizes`` and symmetric memory's device splits are made of."""
    m = case.split_matrix(plan, world_size) * plan.element_size
    return AllToAllSplits(rank=rank, send=tuple(int(b) for b in m[rank]),
                          receive=tuple(int(b) for b in m[:, rank]),
                          even=case.splits == "even")


def import_torch_cuda(flag: str) -> Any:
    """torch, when it has CUDA: the GPU baselines keep their buffers in torch tensors.

    Raises:
        ConfigError: torch is not importable or sees no CUDA device.
    """
    try:
        import torch
    except ImportError as exc:
        raise ConfigError(f"{flag} keeps its buffers in PyTorch tensors, and torch is not "
                          f"importable ({exc}); install torch with CUDA or use --baseline "
                          "mpi") from None
    if not torch.cuda.is_available():
        raise ConfigError(f"{flag} needs PyTorch with CUDA; this torch sees no CUDA device "
                          "(a CPU-only build?)")
    return torch


def check_one_gpu_per_rank(world: World, ordinal: int, flag: str) -> None:
    """Collective: raise on every rank when two ranks drive the same GPU (NCCL and PyTorch
    symmetric memory need one GPU per rank).

    Raises:
        ConfigError: two ranks on one GPU, named by rank, host and GPU UUID.
    """
    from ..runtime import cuda_driver
    from ..runtime.gpu_names import format_uuid

    # Same CUDA_VISIBLE_DEVICES or not, the driver's UUID names the GPU.
    uuid = format_uuid(cuda_driver.device_uuid(ordinal))
    places = world.comm.allgather((world.hostname, uuid))
    with collective_step(world, f"{flag} setup"):
        first: dict[tuple[str, str], int] = {}
        for rank, place in enumerate(places):
            if place in first:
                raise ConfigError(
                    f"{flag} needs one GPU per rank, but {world.where(first[place])} and "
                    f"{world.where(rank)} share GPU {place[1]}; use --baseline mpi, or one "
                    "rank per GPU")
            first[place] = rank


class GpuBaseline:
    """Times a pattern's equivalent on this rank's GPU, on every path the subclass offers
    (``_paths``), and reports the faster per size with its name.

    Subclasses set ``name`` and ``label``, ``version`` and ``path_column`` (whether paths
    are worth a table column), and fill in ``_allocate`` (a byte tensor of a path),
    ``_bind`` (one operation on typed views) and, where a path holds registrations,
    ``_release``. ``measure`` and ``measure_latency`` return ``(time, wrong, path)``.
    """

    name = ""
    label = ""
    path_column = False
    captures_graphs = True
    # --after-kernel: a one-element add on the stream before every operation (the driver
    # sets it; a kernel as small as the one it launches before ours).
    after_kernel = False

    def __init__(self, world: World, case: Any, torch: Any, ordinal: int) -> None:
        self.world = world
        self.case = case
        self.op = case.name
        self.version = ""
        self._torch = torch
        self.device = torch.device("cuda", ordinal)
        torch.cuda.set_device(self.device)
        # Every operation, check and timer of the baseline runs on this one stream.
        self._stream = torch.cuda.Stream(self.device)
        self._graphs: list[Any] = []  # captured on the path being measured
        # The last measure's figure on each path it timed (seconds, or the median sample).
        self.path_results: dict[str | None, float] = {}
        # The last measure's paths that returned wrong elements (never its figure while
        # another path is right), and its clock check: (this rank's disagreement of the
        # timer with the host clock, or None; the host clock's seconds per operation).
        self.wrong_paths: dict[str, int] = {}
        self.clock: tuple[str | None, float | None] | None = None
        # How many times the last measure timed its stretch again (clock_check).
        self.clock_rechecks = 0
        self._offset: float | None = None
        self._owner = True

    # -- what subclasses fill in -------------------------------------------------------
    def _paths(self, mode: str) -> tuple[str | None, ...]:
        """The paths timed for ``mode``; None names the only one."""
        return (None,)

    def _allocate(self, path: str | None, nbytes: int) -> Any:
        """A uint8 tensor of ``nbytes`` on this rank's GPU for ``path`` (collective)."""
        return self._torch.empty(nbytes, dtype=self._torch.uint8, device=self.device)

    def _bind(self, path: str | None, inputs: Any, output: Any, plan: SizePlan,
              mode: str) -> Callable[[], None]:
        """One operation of ``path``: ``inputs`` and ``output`` are typed views (bytes
        for all-gather, ring and all-to-all; the case's datatype for reductions); in place
        they overlap as NCCL's in-place convention has it (all-to-all: both start at the
        array, ``_all_to_all_source``)."""
        raise NotImplementedError

    def _release(self, path: str | None) -> None:
        """Undo ``path``'s registrations; every rank's work on them is finished."""

    def _check_plan(self, plan: SizePlan) -> None:
        """Raise (on every rank alike) for a size the baseline cannot time.

        Raises:
            ConfigError: the size does not suit the baseline.
        """

    # -- views of this baseline --------------------------------------------------------
    def for_pattern(self, case: Any) -> GpuBaseline:
        """This baseline timing ``case`` instead; the view owns nothing (its ``close()``
        does nothing), so one communicator serves a whole suite.

        Raises:
            ConfigError: an op or datatype the baseline cannot time.
        """
        type(self).check_case(case)
        view = copy.copy(self)
        view.case, view.op, view._owner = case, case.name, False
        return view

    @classmethod
    def check_case(cls, case: Any) -> None:
        """Raise unless this baseline can time ``case`` (a pattern: the op is its name;
        reductions carry ``op`` and ``datatype``).

        Raises:
            ConfigError: an op or datatype it cannot time.
        """

    # -- layout and data ---------------------------------------------------------------
    def _buffer_bytes(self, plan: SizePlan) -> tuple[int, int]:
        """(send, receive) bytes of this rank."""
        n = self.world.size
        if self.op in _BYTE_OPS:
            return plan.block_bytes, plan.block_bytes * n
        if self.op == ALL_TO_ALL:
            # The receive buffer holds the longest input or output of any rank: the same
            # size everywhere (symmetric windows), and in place it is the array itself.
            return plan.size, self.case.array_bytes(plan, n)
        if self.op == "allreduce":
            return plan.size, plan.size
        return plan.size, plan.size // n

    def _views(self, send: Any, receive: Any, plan: SizePlan, mode: str) -> tuple[Any, Any]:
        """(where this rank's input goes, where its output comes), as NCCL's in-place
        convention lays them out: all-gather in place reads this rank's block of the
        output, reduce-scatter in place writes this rank's block of the input; all-to-all
        in place reads and writes the one array from its start (as the case's window)."""
        me, block = self.world.rank, plan.block_bytes
        in_place = mode == "in-place"
        if self.op == ALL_TO_ALL:
            received = self.case.received_bytes(plan, me, self.world.size)
            return (receive[:plan.size] if in_place else send), receive[:received]
        if self.op == "ring" or (self.op == "allgather" and in_place):
            return receive[me * block:(me + 1) * block], receive
        if self.op == "allgather":
            return send, receive
        if self.op == "allreduce":
            return (receive, receive) if in_place else (send, receive)
        out = plan.size // self.world.size
        return send, (send[me * out:(me + 1) * out] if in_place else receive)

    def _all_to_all_source(self, path: str | None, inputs: Any, output: Any
                           ) -> tuple[Any, Callable[[], None] | None]:
        """(the buffer an all-to-all of ``path`` reads, a copy to run before each
        operation or None). Out of place that is ``inputs``. In place (``inputs`` and
        ``output`` start at one array) no library here has an all-to-all that may
        overwrite blocks its peers have yet to read (nccl-tests: "We don't support
        in-place alltoall"), so the array is first copied aside into a buffer of the
        path's own (a registered window where the path registers), as a program of
        theirs would do; the copy is part of the timed operation, as in the MPI baseline."""
        if inputs.data_ptr() != output.data_ptr():
            return inputs, None
        aside = self._allocate(path, inputs.numel())   # collective: same order everywhere

        def copy_aside() -> None:
            aside.copy_(inputs)   # on the current stream: the baseline's
        return aside, copy_aside

    def _typed(self, view: Any) -> Any:
        if self.op in _BYTE_OPS or self.op == ALL_TO_ALL:
            return view
        return view.view(getattr(self._torch, TORCH_DTYPES[self.case.datatype]))

    def _input_bytes(self, plan: SizePlan, iteration: int) -> np.ndarray:
        if self.op in _BYTE_OPS:
            return seeded_bytes(iteration, self.world.rank, plan.block_bytes)
        return self.case.input_bytes(plan, self.world.rank, self.world.size, iteration)

    def _expected_bytes(self, plan: SizePlan, iteration: int) -> np.ndarray:
        if self.op in _BYTE_OPS:
            return np.concatenate([seeded_bytes(iteration, rank, plan.block_bytes)
                                   for rank in range(self.world.size)])
        return self.case.expected_bytes(plan, self.world.rank, self.world.size, iteration)

    # -- measuring ---------------------------------------------------------------------
    def measure(self, plan: SizePlan, mode: str, *, iters: int, warmup: int, checks: int,
                buffers: int = 1, graph: bool = False) -> tuple[float, int, str | None]:
        """Collective, nccl-tests timing on every path: (seconds per operation averaged
        over ranks, of the faster right path; wrong elements summed over ranks of that
        path, or of every path when none is right; that path). ``buffers`` > 1 cycles
        the operations over that many disjoint buffer sets. With ``graph``, the checks
        replay a captured operation, and the ``iters`` timed operations are captured in
        one CUDA graph, launched once to warm it and once timed.

        Timed by CUDA events on the baseline's stream, as ours are on our stream, and
        held against the host clock from the first enqueue to a device-wide synchronize
        (``clock``: this rank's disagreement, or None, and that clock's seconds per
        operation)."""
        what = f"{iters} back-to-back operations"

        def back_to_back(operations: list[Callable[[], None]],
                         eager: list[Callable[[], None]]) -> tuple[float, str | None, float, int]:
            sequence = [eager[i % buffers] for i in range(iters)]
            if graph:
                whole = self._capture(sequence)
                self._graphs.append(whole)
                whole.replay()  # the first launch uploads the graph
                sequence = [whole.replay]

            def enqueue_all() -> None:
                for operation in sequence:
                    operation()

            def stretch() -> tuple[float, float, tuple[float, float]]:
                self._torch.cuda.synchronize(self.device)
                self.world.comm.Barrier()
                return torch_event_reading(self._torch, self.device, self._stream,
                                           enqueue_all)

            (elapsed, wall, _parts), error, again = agreed_stretch(
                self.world.comm, stretch,
                lambda reading: clock_disagreement(reading[0], reading[1], what,
                                                   self._clock_offset(), parts=reading[2]))
            seconds, wall = mean_over_ranks(self.world.comm, [elapsed / iters, wall / iters])
            return seconds, error, wall, again

        best, wrong = self._on_each_path(plan, mode, checks, warmup, buffers, graph,
                                         back_to_back, key=lambda timed: timed[0])
        seconds, error, wall, self.clock_rechecks = best[0]
        self.clock = (error, wall)
        return seconds, wrong, best[1]

    def measure_latency(self, plan: SizePlan, mode: str, *, iters: int, warmup: int,
                        checks: int, buffers: int = 1,
                        graph: bool = False) -> tuple[list[float], int, str | None]:
        """Collective, latency timing on every path: (seconds of each of ``iters``
        samples of one operation, timed by CUDA events on the baseline's stream, each
        sample the slowest rank's, of the right path with the lower median; wrong
        elements as ``measure``; that path). With ``graph``, each sample is one replay
        of a graph of one operation. ``clock`` as ``measure``'s, of the median samples."""
        what = f"{iters} samples of one operation"

        def samples_of(operations: list[Callable[[], None]], _eager: list[Callable[[], None]]
                       ) -> tuple[list[float], str | None, float, int]:
            def stretch() -> tuple[list[float], list[float]]:
                samples, walls = [], []
                for iteration in range(iters):
                    operation = operations[iteration % buffers]
                    self._torch.cuda.synchronize(self.device)
                    self.world.comm.Barrier()
                    sample, wall = torch_event_stretch(self._torch, self.device,
                                                       self._stream, operation)
                    samples.append(sample)
                    walls.append(wall)
                return samples, walls

            (samples, walls), error, again = agreed_stretch(
                self.world.comm, stretch,
                lambda reading: latency_clock_disagreement(*reading, what,
                                                           self._clock_offset()))
            wall, = mean_over_ranks(self.world.comm, [percentile(walls, 50)])
            return slowest_rank_samples(self.world.comm, samples), error, wall, again

        best, wrong = self._on_each_path(plan, mode, checks, warmup, buffers, graph,
                                         samples_of, key=lambda timed: percentile(timed[0], 50))
        samples, error, wall, self.clock_rechecks = best[0]
        self.clock = (error, wall)
        return samples, wrong, best[1]

    def _clock_offset(self) -> float:
        """What the host clock reads over an empty stretch of this baseline's stream
        (clock_check.torch_clock_offset), measured once."""
        if self._offset is None:
            self._offset = torch_clock_offset(self._torch, self.device, self._stream)
        return self._offset

    def _on_each_path(self, plan: SizePlan, mode: str, checks: int, warmup: int,
                      buffers: int, graph: bool, timed: Callable[..., Any],
                      key: Callable[[Any], float]) -> tuple[tuple[Any, str | None], int]:
        """((``timed``'s result on the right path ``key`` finds fastest, that path), the
        wrong elements of that path). A path whose checks found wrong elements is never
        the figure while another path is right (``wrong_paths`` names it with its count);
        when every path is wrong, the fastest is returned with the wrong elements of all.
        Every rank sees the same figures and counts (reduced over ranks), so every rank
        picks the same path."""
        torch = self._torch
        results: list[tuple[Any, str | None, int]] = []
        self._check_plan(plan)
        self.path_results = {}
        self.wrong_paths = {}
        for path in self._paths(mode):
            try:
                with torch.cuda.stream(self._stream):
                    sets = [self._views(self._allocate(path, send), self._allocate(path, receive),
                                        plan, mode)
                            for send, receive in [self._buffer_bytes(plan)] * buffers]
                    operations, eager, found = self._checked_operations(path, sets, plan, mode,
                                                                        checks, graph)
                    for iteration in range(warmup_iterations(warmup, buffers)):
                        operations[iteration % buffers]()
                    result = timed(operations, eager)
            except BaseException:
                # Another rank may be inside a collective: no barrier, the error ends the job.
                self._drop_path(path)
                raise
            self._torch.cuda.synchronize(self.device)
            self.world.comm.Barrier()  # no peer still reads a buffer released below
            self._drop_path(path)
            self.path_results[path] = key(result)
            results.append((result, path, found))
        right = [entry for entry in results if entry[2] == 0]
        if right:
            for _result, path, found in results:
                if found:
                    self.wrong_paths[str(path)] = found
            result, path, _found = min(right, key=lambda entry: key(entry[0]))
            return (result, path), 0
        result, path, _found = min(results, key=lambda entry: key(entry[0]))
        return (result, path), sum(found for _result, _path, found in results)

    def _drop_path(self, path: str | None) -> None:
        """Drop the path's graphs and registrations (its buffers go with their last
        reference)."""
        # In place: a view from for_pattern shares these lists with its baseline.
        while self._graphs:
            self._graphs.pop().reset()
        self._release(path)

    def _checked_operations(self, path: str | None, sets: list[tuple[Any, Any]],
                            plan: SizePlan, mode: str, checks: int, graph: bool
                            ) -> tuple[list[Callable[[], None]], list[Callable[[], None]], int]:
        """(what to run: one operation per buffer set, or with ``graph`` a replay of its
        one-operation graph; the eager operations; the wrong elements of ``checks``
        verified runs, iteration i on set i mod ``len(sets)``, summed over ranks)."""
        torch = self._torch
        eager = [self._operation(self._bind(path, self._typed(inputs), self._typed(output),
                                            plan, mode))
                 for inputs, output in sets]
        operations = eager
        if graph:
            for operation in eager:  # warm outside capture, as torch's graph docs ask
                operation()
            captured = [self._capture([operation]) for operation in eager]
            self._graphs.extend(captured)
            operations = [graph_of_one.replay for graph_of_one in captured]
        wrong = 0
        for iteration in range(checks):
            inputs, output = sets[iteration % len(sets)]
            output.copy_(torch.from_numpy(poison(output.numel())))
            inputs.copy_(torch.from_numpy(self._input_bytes(plan, iteration).copy()))
            torch.cuda.synchronize(self.device)
            self.world.comm.Barrier()
            operations[iteration % len(sets)]()
            torch.cuda.synchronize(self.device)
            wrong += count_wrong(output.cpu().numpy(), self._expected_bytes(plan, iteration),
                                 plan.element_size)
        return operations, eager, self.world.comm.allreduce(wrong, op=mpi().SUM)

    def _operation(self, operation: Callable[[], None]) -> Callable[[], None]:
        if not self.after_kernel:
            return operation
        scratch = self._torch.zeros(1, device=self.device)

        def after_a_kernel() -> None:
            scratch.add_(1)  # on the current stream: the baseline's
            operation()
        return after_a_kernel

    def _capture(self, operations: list[Callable[[], None]]) -> Any:
        """A ``torch.cuda.CUDAGraph`` of ``operations`` in order, captured on the
        baseline's stream (and replayed there)."""
        torch = self._torch
        captured = torch.cuda.CUDAGraph()
        torch.cuda.synchronize(self.device)
        # Thread-local: NCCL's watchdog thread may query events while we capture.
        with torch.cuda.graph(captured, stream=self._stream, capture_error_mode="thread_local"):
            for operation in operations:
                operation()
        torch.cuda.synchronize(self.device)
        return captured

    def close(self) -> None:
        """Release what the baseline set up (idempotent; collective like its creation)."""

    def __enter__(self) -> GpuBaseline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
