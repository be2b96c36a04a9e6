"""``Communicator``: all-gather, all-reduce, reduce-scatter, all-to-all and all-to-all-v
on the user's own arrays, over scratch windows sized once
(docs/COLLECTIVES.md)."""

from __future__ import annotations

import dataclasses
import inspect
import math
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..runtime.config import format_size
from ..runtime.errors import BackendError, CollectiveError, Unsupported
from ..topology.world import describe_disagreement
from .agreement import Signature
from .algorithms import algorithm, algorithm_names
from .algorithms.host_all_to_all import check_splits
from .arrays import ArrayRef, check_array, describe_array, device_dtype, to_numpy_dtype
from .bound_call import BoundCollective
from .call_cache import CallCache
from .call_guard import FAILED_CALL_ERRORS, CallGuard
from .call_marks import ArgumentProblem, blame
from .choice import choose
from .heap import Heap
from .host_path import HostPath
from .reduction import REDUCE_DTYPES, REDUCE_OPS, check_reduction
from .registry import Registration, Registry
from .scratch import ALIGN, ScratchLayout
from .split_args import GpuSplits

if TYPE_CHECKING:
    from ..window.window import Window

__all__ = ["Communicator", "agree_on_sizes"]


def _check_bytes(value: Any, name: str, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        unit = "byte" if minimum == 1 else "bytes"
        raise CollectiveError(f"{name}={value!r}: expected an int of at least {minimum} {unit}")
    return int(value)


def _fact(value: Any) -> str:
    """A size as ranks compare it: 1024 and numpy.int64(1024) alike, anything else as
    written."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return str(int(value))
    return repr(value)


def agree_on_sizes(group: Any, max_bytes: Any, heap_bytes: Any) -> tuple[int, int]:
    """Collective over ``group``: the communicator's ``max_bytes`` and ``heap_bytes``
    (default ``2 * max_bytes``), checked on every rank and compared across ranks.

    Raises:
        CollectiveError: a bad size on some rank, or ranks that pass different sizes (on
            every rank, naming what each passed).
    """
    facts = group.collective("communicator setup", (_fact(max_bytes), _fact(heap_bytes)))
    with group.step("communicator setup"):
        max_bytes = _check_bytes(max_bytes, "max_bytes", minimum=1)
        heap_bytes = (2 * max_bytes if heap_bytes is None else
                      _check_bytes(heap_bytes, "heap_bytes", minimum=0))
        if any(fact != facts[0] for fact in facts):
            raise CollectiveError(
                "ranks disagree on the communicator's sizes: " + describe_disagreement(
                    facts, verb=("passes", "pass"), spell=lambda fact:
                    f"max_bytes={fact[0]}, heap_bytes={fact[1]}"))
    return max_bytes, heap_bytes


def _spell_bytes(nbytes: int) -> str:
    short = format_size(nbytes)
    return f"{nbytes} bytes" + (f" ({short})" if short != str(nbytes) else "")


class Communicator:
    """Collectives on the user's arrays among the ranks of a ``Group``. Created by
    ``Group.communicator(max_bytes=...)`` (collective).

    Every call is collective: every rank calls the same collective with the same
    element count, dtype, ``op`` and ``algo``; ranks that do not raise CollectiveError on
    every rank, naming what each rank called. A call that one rank's checks refuse (an
    array that is not contiguous, of another device or dtype, of the wrong size, over
    ``max_bytes``; bad splits; an unknown ``op`` or ``algo``) is still one call for every
    rank: the refusing rank takes part with a mark (call_marks.py), no element moves, and
    every rank raises the same CollectiveError naming that rank and argument, in that call
    (on GPUs at ``synchronize()``); the next good call is right on every rank. Results are
    bitwise identical on every rank and from run to run (ipcshare.collectives.reduction
    says what each op computes). Arrays from ``empty()`` are read in place; other inputs
    are copied into the window first. On host memory every call is host-blocking: its
    output is complete when it returns.

    ``close()`` is collective and idempotent; closing the group closes it too.
    """

    def __init__(self, group: Any, max_bytes: int, *, heap_bytes: int | None = None) -> None:
        self._closed = False
        self.group = group
        world = group.world
        max_bytes, heap_bytes = agree_on_sizes(group, max_bytes, heap_bytes)
        if world.node_count > 1:  # Group.communicator gives such groups a NodesCommunicator
            raise Unsupported(f"Communicator over {world.node_count} nodes: make it with "
                              "Group.communicator(), which spans nodes")
        self.max_bytes = max_bytes
        self.heap_bytes = heap_bytes
        self._layout = ScratchLayout(max_bytes, heap_bytes, world.size,
                                     gpu=group.backend.device_memory)
        # No call after one failed on this rank; one host call at a time (call_guard.py).
        self._guard = CallGuard(on_fail=group.note_failed_call)
        if not group.backend.device_memory:
            self._path: Any = HostPath(group, self._layout, self._guard)
        else:
            from .gpu_path import GpuPath

            self._path = GpuPath(group, self._layout)
        # Ranks taking turns on a GPU (shared without MPS): auto runs the stepped kernels,
        # which never spin.
        self._time_sliced = bool(group.time_sliced_gpus) and group.backend.device_memory
        self._heap = Heap(heap_bytes, ALIGN)
        self._registry = Registry(group, local_buffer=self._path.local_buffer, path=self._path)
        self._path.registry = self._registry
        # Each call's signature and algorithm, by what the call asked: built (and its
        # digest computed) once, looked up after that.
        self._signatures: dict[tuple, tuple[Signature, Any]] = {}
        # GPU calls repeated on the same tensors launch what was resolved the first time.
        self._recent = None if self.memory == "host" else CallCache()

    # -- facts -------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self.group.rank

    @property
    def size(self) -> int:
        return self.group.size

    @property
    def memory(self) -> str:
        """``host`` (numpy arrays in host memory) or ``cuda``."""
        return self._path.memory

    @property
    def copies_in(self) -> int:
        """Calls so far whose input was copied into the window (not from ``empty()``)."""
        return self._path.copies_in

    @property
    def closed(self) -> bool:
        return self._closed or self._path.window.closed

    @property
    def window(self) -> Window:
        """The window this communicator's scratch and heap live in: ``empty()`` arrays
        are inside its buffers, so its ``buffer_ptrs`` and ``signal_pad_ptrs`` address
        them on every rank (what ``ipcshare.triton.device_view`` reads). Its layout
        beyond that is the communicator's own; do not write into it."""
        return self._path.window

    # -- arrays ------------------------------------------------------------------------
    def empty(self, shape: int | tuple[int, ...], dtype: Any) -> Any:
        """A new uninitialised C-contiguous array inside this rank's window: calls read
        it in place (no copy-in). Not collective: ranks may hold different arrays, each
        call says where its input lies. Its memory returns to the heap when the array
        and its views are gone. On host memory a numpy array; on GPUs a ``DeviceArray``
        (``torch.from_dlpack`` / ``cupy.from_dlpack`` view it without a copy; ``dtype``
        may then also be a torch dtype such as ``torch.bfloat16``).

        Raises:
            CollectiveError: closed communicator, bad shape or dtype, or a heap without
                room (naming its size and how to raise it).
            Unsupported: bfloat16 without ml_dtypes.
        """
        self._check_open()
        dims = (shape,) if isinstance(shape, (int, np.integer)) else shape
        if (not isinstance(dims, tuple) or
                any(isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0
                    for d in dims)):
            raise CollectiveError(f"shape={shape!r}: expected an int or a tuple of ints >= 0")
        numpy_dtype = to_numpy_dtype(dtype) if self.memory == "host" else device_dtype(dtype)
        nbytes = math.prod(int(d) for d in dims) * numpy_dtype.itemsize
        offset = self._heap.allocate(nbytes)
        if offset is None:
            raise CollectiveError(
                f"empty({shape!r}, {dtype!r}) needs {_spell_bytes(nbytes)} in one piece, but "
                f"the heap's largest free piece is {_spell_bytes(self._heap.largest_free)} "
                f"({_spell_bytes(self._heap.free_bytes)} free in all) of heap_bytes="
                f"{self.heap_bytes}: drop arrays from empty() that are no longer needed, or "
                f"create the communicator with a larger heap_bytes (default 2 * max_bytes)")
        array, owner = self._path.heap_array(self._layout.heap_offset + offset,
                                             tuple(int(d) for d in dims), numpy_dtype)
        weakref.finalize(owner, self._heap.free, offset)
        return array

    def register(self, array: Any) -> Registration:
        """Collective over the node: share ``array``, memory this rank already has, with
        every rank without a copy; every rank registers one array, in the same order.
        Returns a ``Registration`` whose ``peer(r)`` / ``buffer_ptrs`` are each rank's
        registered array mapped here. What can be shared: on GPUs, a cudaMalloc block
        (torch's caching allocator: by legacy IPC of its allocation) or a cuMem
        allocation exportable as a POSIX descriptor (torch's expandable segments); on
        host memory, a shared file mapping (a memfd, ``multiprocessing.shared_memory``).
        Peer mappings are counted per allocation and released by ``unregister`` or
        ``close``; the registration holds ``array`` until then.

        Calls read a registered input in place (no copy-in), on host memory and on GPUs
        (up to 64 live registrations there; inputs of further ones are copied in). Bound
        calls and CUDA graphs on a registered array must not run after ``unregister``.

        Raises:
            CollectiveError: closed (on this rank), or misuse on some rank (not an array,
                not contiguous, no bytes; on every rank, naming it).
            BackendError: some rank's memory cannot be shared, naming the rank and why
                (private host memory, host memory for a GPU group, another GPU, managed
                memory, an array across allocations, not IPC capable); on every rank.
        """
        self._check_open()
        return self._registry.register(array, self._registrable)

    def unregister(self, array: Any) -> None:
        """Collective over the node: drop a registration and unmap what no other
        registration uses. ``array`` is the ``Registration`` that ``register`` returned
        (that registration), or the array given to ``register`` (its latest
        registration).

        Raises:
            CollectiveError: ``array`` is not registered, or not an array, on some rank
                (on every rank, naming it).
        """
        self._check_open()
        self._registry.unregister(array)

    @property
    def registered(self) -> int:
        """Live registrations on this rank."""
        return len(self._registry)

    def _registrable(self, array: Any) -> ArrayRef:
        """The array's descriptor, checked on this rank for what any backend needs
        (contiguous, non-empty); where its memory lies is the backend's to judge."""
        ref = describe_array(array, "array")
        if not ref.contiguous:
            raise CollectiveError(f"array is {ref.spell()} that is not contiguous: register "
                                  "a C-contiguous array")
        if ref.nbytes == 0:
            raise CollectiveError(f"array is {ref.spell()} with no bytes: nothing to register")
        return ref

    # -- collectives -------------------------------------------------------------------
    def all_gather(self, output: Any, input: Any, *, stream: Any = None,
                   algo: str = "auto") -> Any:
        """Collective: every rank's ``input`` into ``output``, rank r's at block r.
        ``output.nbytes == size * input.nbytes`` and one dtype (any dtype: bytes are
        moved). In place when ``input`` is block ``rank`` of ``output``. Returns
        ``output``.

        Raises:
            CollectiveError: misuse on some rank, or ranks that disagree (on every rank,
                in this call; on GPUs at ``synchronize()`` where found by the kernels).
        """
        key = self._recent_key("all_gather", None, algo, output, input, stream)
        if key is not None and self._replay(key):
            return output
        return self._run(self._checked("all_gather", output, input, stream=stream, algo=algo),
                         key)

    def all_reduce(self, tensor: Any, *, op: str = "sum", output: Any = None,
                   stream: Any = None, algo: str = "auto") -> Any:
        """Collective: reduce every rank's ``tensor`` element-wise with ``op`` (sum, max,
        min) into ``tensor`` (in place) or ``output`` (same count and dtype). dtypes:
        float32, float16, bfloat16, int32. Returns the array written.

        Raises:
            CollectiveError: misuse on some rank, or ranks that disagree (on every rank,
                in this call; on GPUs at ``synchronize()`` where found by the kernels).
        """
        key = self._recent_key("all_reduce", op, algo, tensor, output, stream)
        if key is not None and self._replay(key):
            return tensor if output is None else output
        return self._run(self._checked("all_reduce", tensor, op=op, output=output,
                                       stream=stream, algo=algo), key)

    def reduce_scatter(self, output: Any, input: Any, *, op: str = "sum", stream: Any = None,
                       algo: str = "auto") -> Any:
        """Collective: reduce every rank's ``input`` element-wise with ``op`` and leave
        block ``rank`` of the result in ``output``; ``input.nbytes == size *
        output.nbytes``. In place when ``output`` is block ``rank`` of ``input``.
        Returns ``output``.

        Raises:
            CollectiveError: misuse on some rank, or ranks that disagree (on every rank,
                in this call; on GPUs at ``synchronize()`` where found by the kernels).
        """
        key = self._recent_key("reduce_scatter", op, algo, output, input, stream)
        if key is not None and self._replay(key):
            return output
        return self._run(self._checked("reduce_scatter", output, input, op=op, stream=stream,
                                       algo=algo), key)

    def all_to_all(self, output: Any, input: Any, *, stream: Any = None,
                   algo: str = "auto") -> Any:
        """Collective: block r of ``input`` to rank r; block q of ``output`` comes from
        rank q. ``input`` and ``output`` have one dtype (any: bytes are moved) and as many
        elements, ``size`` blocks of one length on every rank. In place when ``output``
        is ``input``. Returns ``output``.

        Raises:
            CollectiveError: misuse on some rank or ranks that disagree (on every rank,
                in this call), or ranks taking turns on a GPU (on all). A group spanning
                nodes runs it hierarchically (IPC inside each node, the rails' engine between them).
        """
        return self._run(self._checked("all_to_all", output, input, stream=stream, algo=algo))

    def all_to_all_v(self, output: Any, input: Any, output_splits: Any, input_splits: Any,
                     *, stream: Any = None, algo: str = "auto") -> Any:
        """Collective: the first ``input_splits[0]`` elements of ``input`` to rank 0, the
        next ``input_splits[1]`` to rank 1, and so on; ``output`` receives, in rank
        order and packed from its start, ``output_splits[q]`` elements from rank q.
        Splits are element counts, one per rank (a sequence of ints or a 1-D numpy
        integer array); they may differ from call to call, and ``output_splits[q]`` must
        equal rank q's ``input_splits[rank]``, which every call checks. Elements past the
        splits' sums are neither sent nor written. One dtype (any); in place when
        ``output`` is ``input`` (host memory only). Returns ``output``.

        On GPUs either splits may also be an int32 / int64 CUDA array of one count per
        rank, which the kernel reads at run time (no host synchronisation; a CUDA graph
        replays with the array's new counts): ``input_splits`` is read there, and
        ``output_splits`` is *filled* with the counts received from each rank, so the
        caller can size its next step on the device. The input must then fit
        ``max_bytes`` whole. Counts on the device are checked by the kernel on every
        rank (negative, past an array, or not what the sender sends): every rank's
        ``synchronize()`` raises the same CollectiveError, and no byte moves.

        Raises:
            CollectiveError: misuse on some rank (bad splits, sums over an array or
                ``max_bytes``) or ranks whose splits or calls disagree (on every rank in
                this call, naming them; on GPUs at ``synchronize()``), ranks taking turns
                on a GPU, or a
                group spanning nodes (on all: its counts differ per pair, which the
                hierarchical steps cannot relay; docs/COLLECTIVES.md).
        """
        return self._run(self._checked("all_to_all_v", output, input, output_splits,
                                       input_splits, stream=stream, algo=algo))

    def bind(self, collective: str, *args: Any, **kwargs: Any) -> BoundCollective:
        """Collective the first time a call of its shape is seen, like the call itself:
        check and resolve ``collective`` (``"all_gather"``, ``"all_reduce"``,
        ``"reduce_scatter"``, ``"all_to_all"`` or ``"all_to_all_v"``, whose splits are
        then bound too) with these arguments, exactly as the method of that name
        takes them, once, and return a ``BoundCollective`` that enqueues that call each
        time it is called, on the same arrays (whatever they hold then) and stream. On
        GPUs a bound call is one kernel launch from Python and nothing else, and it can
        be captured in CUDA graphs like the call.

        A bind that this rank's checks refuse returns a bound call that, each time it is
        called, takes part in the call refused (as the call itself would): every rank's
        call then raises the same error.

        Raises:
            CollectiveError: what the call itself raises.
        """
        self._check_open()
        try:
            with blame("collective"):
                if collective not in _PREPARERS:
                    raise CollectiveError(f"bind({collective!r}): choose all_gather, "
                                          "all_reduce, reduce_scatter, all_to_all or "
                                          "all_to_all_v")
                try:   # named as the user's method, not the one behind it
                    inspect.signature(getattr(self, collective)).bind(*args, **kwargs)
                except TypeError as exc:
                    raise CollectiveError(f"bind({collective!r}, ...): {exc}; the arguments "
                                          f"are those of {collective}()") from None
        except ArgumentProblem as problem:
            call: _Call | _Refused = self._refused(collective, problem, args, kwargs)
        else:
            call = self._checked(collective, *args, **kwargs)
        description, enqueue = self._bind_call(call)
        return BoundCollective(collective, f"bound {description}", enqueue,
                               self._check_open, call.result, (args, kwargs, enqueue))

    def _bind_call(self, call: _Call | _Refused) -> tuple[str, Callable[[], None]]:
        """The call described, and a callable that enqueues it again each time."""
        if isinstance(call, _Refused):
            return (f"{call.op} (refused on rank {self.rank})",
                    self._path.refused_call(call.op, call.problem, call.guess,
                                            stream=call.stream))
        extra = {} if call.splits is None else {"splits": call.splits}
        return call.signature.describe(), self._path.bind_call(
            call.signature, call.chosen, call.inp, call.out, in_place=call.in_place,
            stream=call.stream, **extra)

    def _checked(self, collective: str, *args: Any, **kwargs: Any) -> _Call | _Refused:
        """``collective``'s call with these arguments (those of its method, which Python
        has checked) checked on this rank and resolved (its signature and algorithm), or,
        where a check refuses an argument, the refused call this rank still takes part
        in. The good path pays the checks alone.

        Raises:
            CollectiveError: a closed communicator, or one that takes no more calls (the
                same on every rank: nothing collective can be met then); ranks taking
                turns on a GPU for an all-to-all (the same on every rank).
        """
        self._check_open()
        try:
            call = getattr(self, _PREPARERS[collective])(*args, **kwargs)
            with blame("algo"):
                self._resolve_call(call)
        except ArgumentProblem as problem:
            return self._refused(collective, problem, args, kwargs)
        return call

    def _refused(self, collective: str, problem: ArgumentProblem, args: tuple,
                 kwargs: dict) -> _Refused:
        """The call of ``collective`` with these arguments that ``problem`` refused, as
        this rank takes part in it (what it returns, its stream, the peers' call guessed)."""
        try:
            bound = inspect.signature(getattr(self, collective)).bind(*args, **kwargs)
            bound.apply_defaults()
            given = dict(bound.arguments)
        except (AttributeError, TypeError):   # an unknown collective or its arguments
            given = {}
        result = given.get("output")
        if collective == "all_reduce" and result is None:
            result = given.get("tensor")
        stream = None if problem.argument == "stream" else given.get("stream")
        return _Refused(collective, problem, result, stream, self._guess(collective, given))

    def _guess(self, collective: str, given: dict[str, Any]) -> tuple[Signature, Any] | None:
        """The signature and algorithm of the call the peers most likely make, from the
        arguments (by name) of a call this rank refused; None where they tell too little,
        and on host memory, whose refused calls need none. On GPUs the refusing rank
        launches that call's kernels, marked, so they meet the peers' kernels."""
        if self.memory == "host" or not given:
            return None
        size = self.size
        # Arrays the input's element count follows from: (name, times, over).
        sources = {"all_gather": (("input", 1, 1), ("output", 1, size)),
                   "all_reduce": (("tensor", 1, 1), ("output", 1, 1)),
                   "reduce_scatter": (("input", 1, 1), ("output", size, 1))}.get(
            collective, (("input", 1, 1), ("output", 1, 1)))
        redop = None
        if collective in ("all_reduce", "reduce_scatter"):
            redop = given.get("op") if _known_op(given.get("op")) else "sum"
        algo = given.get("algo")
        if algo not in algorithm_names(self.memory, collective):
            algo = "auto"
        guesses = []
        for name, times, over in sources:
            try:
                ref = describe_array(given.get(name), name)
            except CollectiveError:
                continue
            if ref.count * times % over:
                continue
            if redop is not None and ref.dtype not in REDUCE_DTYPES:
                continue   # no kernel reduces it: the peers' call differs
            count = ref.count * times // over
            nbytes = count * ref.itemsize * (size if collective == "all_gather" else 1)
            if nbytes > self.max_bytes:
                continue
            try:
                guesses.append(self._resolve(collective, algo, count, ref.dtype, ref.itemsize,
                                             redop, nbytes))
            except CollectiveError:
                continue
        # A call the ranks have made before is the likeliest (input and output may
        # disagree on the dtype, either one wrong); else the input's.
        known = [guess for guess in guesses if self._path.agreed(guess[0])]
        return (known or guesses or [None])[0]

    # -- calls, checked on this rank --------------------------------------------------
    def _all_gather(self, output: Any, input: Any, *, stream: Any = None,
                    algo: str = "auto") -> _Call:
        self._check_call(stream)
        with blame("output"):
            out = self._array(output, "output", writable=True)
        with blame("input"):
            inp = self._array(input, "input")
        with blame("output"):
            in_place = self._check_pair("all_gather", out, inp, "output", "input",
                                        blocks=self.size)
        return _Call("all_gather", algo, inp, out, None, in_place, out.nbytes, stream, output)

    def _all_reduce(self, tensor: Any, *, op: str = "sum", output: Any = None,
                    stream: Any = None, algo: str = "auto") -> _Call:
        self._check_call(stream)
        with blame("tensor"):
            inp = self._array(tensor, "tensor", writable=output is None)
        with blame("output"):
            out = inp if output is None else self._array(output, "output", writable=True)
        with blame("tensor" if _known_op(op) else "op"):
            check_reduction(inp.dtype, op, "tensor", call="all_reduce")
        with blame("tensor" if output is None else "output"):
            in_place = self._check_pair("all_reduce", inp, out, "tensor",
                                        "tensor" if output is None else "output", blocks=None)
        return _Call("all_reduce", algo, inp, out, op, in_place, inp.nbytes, stream,
                     tensor if output is None else output)

    def _reduce_scatter(self, output: Any, input: Any, *, op: str = "sum", stream: Any = None,
                        algo: str = "auto") -> _Call:
        self._check_call(stream)
        with blame("output"):
            out = self._array(output, "output", writable=True)
        with blame("input"):
            inp = self._array(input, "input")
        with blame("input" if _known_op(op) else "op"):
            check_reduction(inp.dtype, op, "input", call="reduce_scatter")
        with blame("output"):
            in_place = self._check_pair("reduce_scatter", inp, out, "input", "output",
                                        blocks=self.size)
        return _Call("reduce_scatter", algo, inp, out, op, in_place, inp.nbytes, stream, output)

    def _all_to_all(self, output: Any, input: Any, *, stream: Any = None,
                    algo: str = "auto") -> _Call:
        self._check_call(stream)
        self._refuse_all_to_all("all_to_all")
        with blame("output"):
            out = self._array(output, "output", writable=True)
        with blame("input"):
            inp = self._array(input, "input")
        with blame("output"):
            in_place = self._check_pair("all_to_all", out, inp, "output", "input", blocks=None)
        if inp.count % self.size:
            raise ArgumentProblem("input",
                f"all_to_all: input has {inp.count} elements, not a multiple of {self.size} "
                f"(the ranks): block r of input goes to rank r, so all blocks are as long")
        return _Call("all_to_all", algo, inp, out, None, in_place, inp.nbytes, stream, output)

    def _all_to_all_v(self, output: Any, input: Any, output_splits: Any, input_splits: Any,
                      *, stream: Any = None, algo: str = "auto") -> _Call:
        self._check_call(stream)
        self._refuse_all_to_all("all_to_all_v")
        with blame("output"):
            out = self._array(output, "output", writable=True)
        with blame("input"):
            inp = self._array(input, "input")
        if out.dtype != inp.dtype:
            raise ArgumentProblem("output", f"output is {out.spell()} and input {inp.spell()}: "
                                  "all_to_all_v takes one dtype")
        if self.memory == "host":
            with blame("input_splits"):
                sends = check_splits(input_splits, "input_splits", ranks=self.size,
                                     count=inp.count, array="input")
            with blame("output_splits"):
                receives = check_splits(output_splits, "output_splits", ranks=self.size,
                                        count=out.count, array="output")
            splits: Any = np.array((sends, receives), np.int64)
            sums = {"input_splits": sum(sends) * inp.itemsize,
                    "output_splits": sum(receives) * inp.itemsize}
        else:
            splits = GpuSplits.of(output_splits, input_splits, ranks=self.size,
                                  device=self._path.device, input_count=inp.count,
                                  output_count=out.count)
            sums = splits.host_bytes(inp.itemsize)
            if splits.send_array is not None:
                # The kernel may send all of the input: it is staged whole at most.
                with blame("input"):
                    self._check_max(inp.nbytes, "input (its splits are on the device)",
                                    "all_to_all_v")
        for name, nbytes in sums.items():
            if nbytes > self.max_bytes:
                raise ArgumentProblem(name,
                    f"all_to_all_v: {name} add up to {_spell_bytes(nbytes)}, more than this "
                    f"communicator's max_bytes={self.max_bytes} "
                    f"({format_size(self.max_bytes)}): create it with "
                    f"Group.communicator(max_bytes={nbytes}) or more")
        with blame("output"):
            in_place = self._in_place(out, inp, 0, whole_name="output", part_name="input",
                                      rule="all_to_all_v in place: input is output")
        if in_place and self.memory != "host":
            raise ArgumentProblem("output",
                "all_to_all_v in place (output is input) is not run on GPUs: its segments "
                "move, so the kernel would overwrite input not yet sent; pass an output "
                "distinct from input")
        return _Call("all_to_all_v", algo, inp, out, None, in_place, inp.nbytes, stream, output,
                     splits)

    def _refuse_all_to_all(self, call: str) -> None:
        """Raise where all-to-all cannot run: the same answer on every rank of a group,
        so no rank goes on into a call its peers refused.

        Raises:
            CollectiveError: ranks of the group take turns on a GPU (no MPS), where a
                kernel that spins on its peers would wait for a rank that cannot run.
        """
        if self._time_sliced:
            raise CollectiveError(
                f"{call}: ranks of this group take turns on a GPU (several ranks on one GPU "
                "without MPS), and the all-to-all kernels need every rank running at once: "
                "give each rank a GPU of its own, or start the MPS control daemon "
                "(nvidia-cuda-mps-control -d) before the job")

    def synchronize(self, stream: Any = None) -> None:
        """Wait until this rank's calls enqueued on ``stream`` (the communicator's own by
        default) are done, and raise what a kernel recorded. Host memory: nothing to do.

        Raises:
            CollectiveError: the ranks' calls differed (found on the GPU).
            SignalTimeout: a kernel gave up waiting for a peer, naming it.
        """
        self._check_open()
        if self.memory != "host":
            try:
                self._path.synchronize(stream)
            except FAILED_CALL_ERRORS as exc:  # a kernel gave up on a peer: out of step
                self._guard.fail(exc)
                raise

    @property
    def stream(self) -> Any:
        """The stream calls run on when given none (GPU), as a ``CUstream``; None on host."""
        return None if self.memory == "host" else self._path.window.engine.stream

    def close(self) -> None:
        """Close the window (collective over the node; idempotent). Arrays from
        ``empty()`` stay readable until they go, but calls raise."""
        if self._closed:
            return
        self._closed = True
        self.group.forget_communicator(self)
        if self._recent is not None:
            self._recent.clear()
        try:
            self._registry.close()
        finally:
            self._path.close()  # waits for the node: no peer maps a registration after it

    def inner_meetings(self) -> tuple[Any, ...]:
        """The rendezvous of groups that ``close`` closes besides its group's (none here;
        a node group across nodes): a with-block's grace reaches their barriers too."""
        return ()

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, kind: object, error: BaseException | None, trace: object) -> None:
        self.group.rendezvous.close_on_exit(error, self.close, "closing a communicator",
                                            inner=self.inner_meetings())

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"rank {self.rank} of {self.size}"
        return (f"Communicator({self.memory}, max_bytes={self.max_bytes}, "
                f"heap_bytes={self.heap_bytes}, {state})")

    # -- checks on this rank -----------------------------------------------------------
    def _check_open(self) -> None:
        if self.closed:
            raise CollectiveError("communicator is closed")
        self._guard.check()

    def _check_call(self, stream: Any) -> None:
        self._check_open()
        if stream is not None and self.memory == "host":
            raise ArgumentProblem("stream", f"stream={stream!r}: a communicator on host "
                                  "memory has no streams (its calls finish before they "
                                  "return); call without stream=")

    def _array(self, obj: Any, name: str, *, writable: bool = False) -> ArrayRef:
        try:
            ref = describe_array(obj, name)
        except CollectiveError:
            raise
        except (BufferError, ValueError, TypeError, RuntimeError, AttributeError,
                BackendError) as exc:
            # The array's own protocol failed (a closed or foreign object): a check that
            # refuses the call like the others, so every rank raises it (call_marks.py).
            raise CollectiveError(f"{name} ({type(obj).__name__}) cannot be read as an "
                                  f"array here: {type(exc).__name__}: {exc}") from None
        if self.memory == "host":
            check_array(ref, name, device="cpu", writable=writable)
            return ref
        check_array(ref, name, device="cuda", writable=writable)
        device = self._path.device
        if ref.device_id is not None and ref.device_id != device:
            raise CollectiveError(f"{name} is {ref.spell()} on cuda:{ref.device_id}, but this "
                                  f"rank's communicator lives on cuda:{device}: pass an array "
                                  f"of cuda:{device}")
        return ref

    def _check_pair(self, call: str, whole: ArrayRef, part: ArrayRef, whole_name: str,
                    part_name: str, *, blocks: int | None) -> bool:
        """Check that ``whole`` holds ``blocks`` times ``part``'s elements (as many when
        ``blocks`` is None) of one dtype, within ``max_bytes``; return whether ``part``
        is ``whole``'s block for this rank (all of it when ``blocks`` is None): in place.

        Raises:
            ArgumentProblem: ``whole`` over ``max_bytes`` (naming it).
            CollectiveError: naming the arguments and their values (the caller blames the
                output for them: a refused call's guess then comes from the input).
        """
        if whole.dtype != part.dtype:
            raise CollectiveError(f"{whole_name} is {whole.spell()} and {part_name} "
                                  f"{part.spell()}: {call} takes one dtype")
        if blocks is None and whole.count != part.count:
            raise CollectiveError(f"{call}: {part_name} has {part.count} elements and "
                                  f"{whole_name} {whole.count}: they must be as long")
        if blocks is not None and whole.count != blocks * part.count:
            raise CollectiveError(
                f"{call}: {whole_name} has {whole.count} elements, expected {blocks} x "
                f"{part.count} (the ranks times {part_name}'s)")
        with blame(whole_name):   # the caller blames the output for the rest
            self._check_max(whole.nbytes, whole_name, call)
        offset = 0 if blocks is None else self.rank * part.nbytes
        rule = (f"{part_name} is {whole_name}" if blocks is None else
                f"{part_name} is {whole_name}'s block for this rank")
        return self._in_place(whole, part, offset, whole_name=whole_name,
                              part_name=part_name, rule=f"{call} in place: {rule}")

    def _check_max(self, nbytes: int, name: str, call: str) -> None:
        if nbytes > self.max_bytes:
            raise CollectiveError(
                f"{call}: {name} has {_spell_bytes(nbytes)}, more than this communicator's "
                f"max_bytes={self.max_bytes} ({format_size(self.max_bytes)}): create it with "
                f"Group.communicator(max_bytes={nbytes}) or more")

    @staticmethod
    def _in_place(whole: ArrayRef, part: ArrayRef, offset: int, *, whole_name: str,
                  part_name: str, rule: str) -> bool:
        """Whether ``part`` is the block of ``whole`` at byte ``offset`` (in place);
        False when they do not overlap.

        Raises:
            CollectiveError: they overlap otherwise.
        """
        if not whole.overlaps(part):
            return False
        if part.ptr == whole.ptr + offset:
            return True
        raise CollectiveError(
            f"{part_name} overlaps {whole_name} but is not in place ({rule}): it starts at "
            f"byte {part.ptr - whole.ptr} of {whole_name}, in place is byte {offset}; pass "
            "arrays that do not overlap")

    def _resolve_call(self, call: _Call) -> None:
        """Set the call's signature and algorithm (a communicator over nodes agrees on
        its own).

        Raises:
            CollectiveError: an unknown ``algo``.
        """
        call.signature, call.chosen = self._signature(call)

    def _signature(self, call: _Call) -> tuple[Signature, Any]:
        """The call's signature and algorithm (``auto`` resolved), built once per shape."""
        return self._resolve(call.op, call.algo, call.inp.count, call.inp.dtype,
                             call.inp.itemsize, call.redop, call.nbytes)

    def _resolve(self, op: str, algo: Any, count: int, dtype: str, itemsize: int,
                 redop: str | None, nbytes: int) -> tuple[Signature, Any]:
        """The signature and algorithm of a call of ``op`` on ``count`` elements of
        ``dtype`` (``nbytes``: the bytes ``auto`` chooses by), built once per shape.

        Raises:
            CollectiveError: an unknown ``algo`` (listing the names there are).
        """
        # An all-to-all-v's arrays and counts differ from rank to rank; the communicator's
        # max_bytes, which bounds them all, is the same everywhere.
        if op == "all_to_all_v":
            nbytes = self.max_bytes
        name = choose(self.memory, op, nbytes, self.size,
                      shared_gpus=self._time_sliced) if algo == "auto" else algo
        if not isinstance(name, str):
            algorithm(self.memory, op, name)  # raises, naming the choices
        # All-to-all-v counts differ from rank to rank: its calls agree on the rest, and
        # their splits are checked every call.
        count = 0 if op == "all_to_all_v" else count
        key = (op, count, dtype, itemsize, redop, name)
        known = self._signatures.get(key)
        if known is None:
            chosen = algorithm(self.memory, op, name)
            known = self._signatures[key] = (
                Signature(op, count, dtype, itemsize, redop, chosen.name), chosen)
        return known

    def _recent_key(self, op: str, redop: str | None, algo: str, first: Any, second: Any,
                    stream: Any) -> tuple | None:
        recent = self._recent
        if recent is None or type(algo) is not str or type(redop) not in (str, type(None)):
            return None
        return recent.key(op, redop, algo, first, second, stream)

    def _replay(self, key: tuple) -> bool:
        """Launch the call remembered under ``key``, if any (after the open check)."""
        launch = self._recent.get(key)
        if launch is None:
            return False
        self._check_open()
        launch()
        return True

    def _run(self, call: _Call | _Refused, key: tuple | None = None) -> Any:
        if isinstance(call, _Refused):
            # Refused here, still one call for every rank: on host memory this raises
            # the error every rank raises; on GPUs the marked kernels are enqueued and
            # synchronize() raises it.
            try:
                self._path.refused_call(call.op, call.problem, call.guess,
                                        stream=call.stream)()
            except FAILED_CALL_ERRORS as exc:  # a kernel gave up on a peer: out of step
                self._guard.fail(exc)
                raise
            return call.result
        signature, chosen = call.signature, call.chosen
        if key is not None:
            # Checked once: remember the launch, so the next call on these tensors skips
            # the checks (call_cache.py).
            launch = self._path.bind_call(signature, chosen, call.inp, call.out,
                                          in_place=call.in_place, stream=call.stream)
            self._recent.put(key, launch)
            launch()
            return call.result
        # Only what the call has: the host path takes no stream, and splits are all-to-all-v's.
        extra: dict[str, Any] = {}
        if call.stream is not None:
            extra["stream"] = call.stream
        if call.splits is not None:
            extra["splits"] = call.splits
        self._path.run(signature, chosen, call.inp, call.out, in_place=call.in_place, **extra)
        return call.result


@dataclasses.dataclass(eq=False, slots=True)
class _Call:
    """One call after the checks on this rank: the collective, the algorithm asked for,
    the arrays, the reduction, whether it is in place, the bytes ``auto`` chooses by,
    the stream, what the call returns, and (all-to-all-v) this rank's splits as an int64
    array ``[input_splits, output_splits]``."""

    op: str
    algo: str
    inp: ArrayRef
    out: ArrayRef
    redop: str | None
    in_place: bool
    nbytes: int
    stream: Any
    result: Any
    splits: np.ndarray | None = None
    signature: Signature | None = None
    chosen: Any = None


@dataclasses.dataclass(eq=False, slots=True)
class _Refused:
    """A call this rank's checks refused (``problem`` says which argument and why), as
    this rank still takes part in it: the collective, what the call returns, its stream,
    and (GPUs) the signature and algorithm the peers most likely run."""

    op: str
    problem: ArgumentProblem
    result: Any
    stream: Any
    guess: tuple[Signature, Any] | None


# The method that checks each collective's call on this rank.
_PREPARERS = {"all_gather": "_all_gather", "all_reduce": "_all_reduce",
              "reduce_scatter": "_reduce_scatter", "all_to_all": "_all_to_all",
              "all_to_all_v": "_all_to_all_v"}


def _known_op(op: Any) -> bool:
    return isinstance(op, str) and op in REDUCE_OPS
