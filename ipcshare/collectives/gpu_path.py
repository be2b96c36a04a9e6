"""How a call runs on GPU memory: one collective kernel (kernels/src/collectives_*.cu) on the
call's stream, which stages the input (unless it lies in the heap), publishes the call's header,
meets the peers and does the collective; or, for the stepped and copy-engine algorithms,
kernels and copies with barriers of stream memory operations between them. Nothing waits on
the host, so calls are stream-ordered and a CUDA graph captures them.

Agreement: the host cannot read the peers' headers without waiting for the stream, so
the ranks compare a call's signature by ``group.collective`` the first time each rank
sees it (on every rank, naming every rank's call). After that the kernel compares the
digests in the headers and records a mismatch in the pad's error word, which
``synchronize()`` turns into the same error. (A rank that repeats a known call while a
peer makes a new one meets it only as a timeout.)

Calls of one communicator must be ordered on the GPU (one stream, or streams joined by
events), as NCCL requires of a communicator: the device-side call count, the staging
parity and the barrier epochs all follow from that order.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
from typing import Any

from ..backends.device_buffer import DeviceArray, DeviceBuffer
from ..runtime.errors import CollectiveError
from ..window.layout import (
    DISAGREEMENT_DIGESTS_SLOT,
    ERROR_SLOT,
    FLAG_BARRIER_RANKS,
    FLAG_BARRIER_SLOT_BASE,
    GUEST_IMPORTED,
    KERNEL_SLOT_BASE,
    LL_CLEANED_SLOT,
    LL_EPOCH_SLOT,
    ONE_SHOT_EPOCH_SLOT,
)
from .agreement import Signature, disagreement_error
from .algorithms import Algorithm
from .algorithms.gpu_kernel import MAX_BLOCKS, THREADS, GpuCall
from .arrays import ArrayRef
from .call_marks import (
    CALL_NUMBER_BITS,
    ArgumentProblem,
    decode_mark,
    encode_mark,
    is_mark,
    refused_error,
)
from .scratch import ScratchLayout
from .split_args import SPLITS_PROBLEM, splits_problem

__all__ = ["GpuPath"]

# The error word's peer field when a kernel found the ranks' digests differ (call.cuh).
_DISAGREEMENT = 0xFFFF
# Calls of one parity after which an LL kernel re-flags that parity's whole buffer
# (kernels/include/ipcshare/ll.cuh): far below 2**32, so no flag ever comes round again.
LL_CLEAN_EVERY = 1 << 30
# Rows of the registrations table (live registrations whose arrays kernels read in place;
# calls on arrays of further registrations copy them in).
REGISTRATION_ROWS = 64
# Values of CollectiveArgs.zero_copy: staged by the kernel, in the heap, registered.
_STAGED, _IN_HEAP, _REGISTERED = 0, 1, 2


def _run_now(step: Any) -> None:
    step()


def _where_only(ref: ArrayRef) -> ArrayRef:
    """``ref`` without the array it describes: where its bytes lie and what they hold."""
    return dataclasses.replace(ref, source=None, host=None)


def _not_capturing(stream: Any) -> Any:
    """A question for later: is ``stream`` (a CUstream) not being captured now? (Asked
    only where the answer matters: mapping memory is not allowed during a capture.)"""
    def ask() -> bool:
        from ..backends.cuda_streams import stream_capturing

        return not stream_capturing(int(stream))
    return ask


def _check_capture_valid(call: str, stream: Any, when: str) -> None:
    """Raise where the capture of ``stream`` was invalidated (a refused call's path asks,
    so a failed capture names the step that found it, not only the launch that failed).

    Raises:
        CollectiveError: the capture is invalidated.
    """
    from ..backends.cuda_streams import capture_invalidated

    if capture_invalidated(int(stream)):
        raise CollectiveError(
            f"{call}: the CUDA graph capture of this stream was invalidated {when}, by an "
            "operation not allowed during a capture (on this thread, or, in the global "
            "capture mode, any thread of the process) since the capture began: end the "
            "capture and capture again without it")


class _BoundCall:
    """A signature bound to a stream: its argument block (input, output and placement
    change per call, the rest is fixed), the kernel parameters pointing at it, and the
    algorithm's view of it."""

    __slots__ = ("args", "params", "address", "call", "stream")

    def __init__(self, args: Any, stream: Any) -> None:
        self.args = args
        self.params = (ctypes.c_void_p * 1)(ctypes.addressof(args))
        self.address = ctypes.addressof(self.params)
        self.stream = stream
        self.call: GpuCall | None = None


class GpuPath:
    """Calls on GPU memory over the group's window of ``layout.total_bytes`` (collective:
    creating it creates the window)."""

    memory = "cuda"

    def __init__(self, group: Any, layout: ScratchLayout) -> None:
        from ..kernels.launcher import MAX_KERNEL_RANKS, CollectiveArgs
        from ..runtime.cuda_driver import driver

        self.group = group
        self.layout = layout
        self.window = group.window(layout.total_bytes)
        window = self.window
        try:
            self.rank, self.size = window.rank, window.world_size
            self.device = group.backend.device
            self._kernels = group.backend.kernels("collectives.cu")
            self._kernels.load_all(first=self.rank)
            self._local_ptr = window.local.ptr
            template = CollectiveArgs()
            if self.size <= MAX_KERNEL_RANKS:
                for rank in range(self.size):
                    template.windows[rank] = window.peer(rank).ptr
                    template.pads[rank] = window.signal_pad(rank).ptr
            for parity in (0, 1):
                template.staging_offset[parity] = layout.staging_offset(parity)
                template.result_offset[parity] = layout.result_offset(parity)
                template.splits_offset[parity] = layout.splits_offset(parity)
            # Kernels give up at half the host's patience, so the peer is named from
            # the pad before the host gives up on the stream.
            template.timeout_ns = int(group.signal_timeout * 0.5e9)
            template.rank, template.nranks = self.rank, self.size
            template.slot_base, template.epoch_word = KERNEL_SLOT_BASE, ONE_SHOT_EPOCH_SLOT
            template.header_base = layout.header_slot(0)
            template.ll_epoch_word, template.ll_cleaned_word = LL_EPOCH_SLOT, LL_CLEANED_SLOT
            template.ll_offset[0], template.ll_offset[1] = layout.ll_offset(0), layout.ll_offset(1)
            template.ll_slot_bytes = layout.ll_slot_bytes
            template.ll128_offset[0] = layout.ll128_offset(0)
            template.ll128_offset[1] = layout.ll128_offset(1)
            template.ll128_slot_bytes = layout.ll128_slot_bytes
            template.ll_clean_every = LL_CLEAN_EVERY
            self._clear_ll_buffers()
            # Where every rank's registered arrays are mapped here (see registered()).
            self._table = group.backend.allocate_private(
                REGISTRATION_ROWS * MAX_KERNEL_RANKS * 8)
            # Where a GPU takes turns, guests hand their allocations to its leader
            # (collectives/guest_imports.py); collective, so made on every rank.
            from .guest_imports import ImportChannel

            self._import_channel = ImportChannel.open(group)
        except BaseException:
            window.close()
            raise
        self._template = template
        # Ranks sharing a GPU run their kernels on it together, and a spinning block needs
        # its peers' blocks resident: with k ranks on a GPU (the most of any GPU of the
        # group, so every rank cuts grids alike) each kernel gets MAX_BLOCKS // k blocks.
        # Found with 4 ranks on one H100 under MPS, where 4 x 128 blocks of LL all-reduce
        # did not fit and waited out their timeouts.
        sharing = max((len(ranks) for ranks in group.shared_gpus.values()), default=1)
        self._max_blocks = max(1, MAX_BLOCKS // sharing)
        # On a time-sliced GPU, stepped calls run in one context: the lowest rank there
        # runs them for the others (collectives/time_sliced.py).
        from .time_sliced import TimeSlicedRole

        self._time_sliced = TimeSlicedRole.of(self, self._import_channel)
        self._launch_kernel = driver.cuLaunchKernel
        self._success = driver.CUresult.CUDA_SUCCESS
        self._engines: dict[int, Any] = {}       # stream handle -> engine on it
        self._meetings: dict[int, tuple] = {}    # stream handle -> its two flag barriers
        self._bound: dict[tuple[Signature, int], _BoundCall] = {}
        self._agreed: set[Signature] = set()
        self._functions: dict[str, Any] = {}
        self.copies_in = 0
        # Copies a guest of a time-sliced GPU made itself (each hands the GPU over).
        self.guest_copies = 0
        self.calls = 0
        # Communicator.register's arrays (set by the communicator), and the device table
        # of where every rank's array of each live registration is mapped here.
        self.registry: Any = None
        self._rows: dict[int, int] = {}          # registration number -> table row
        # What this rank's checks said of the calls it refused, by mark (added to the
        # error synchronize() raises here as a note; the message is every rank's).
        self._refusals: dict[int, str] = {}

    def _clear_ll_buffers(self) -> None:
        """Zero this rank's LL and LL128 buffers before any peer may write them: no line
        may hold a flag that a call could take for its own (allocations are not zeroed).
        Collective: no rank returns before every rank has cleared its own."""
        import numpy as np

        layout, window = self.layout, self.window
        for first, end in ((layout.ll_offset(0), layout.ll_offset(2)),
                           (layout.ll128_offset(0), layout.ll128_offset(2))):
            if end > first:
                window.engine.upload(window.local.slice(first, end - first),
                                     np.zeros(end - first, np.uint8))
        window.engine.synchronize()
        self.group.barrier()

    # -- arrays ------------------------------------------------------------------------
    def heap_array(self, offset: int, dims: tuple[int, ...], dtype: Any) -> tuple[Any, Any]:
        """A DeviceArray of ``dims`` and ``dtype`` (a numpy dtype) at ``offset`` of this
        rank's window, and the object whose end frees it (the array itself: DLPack and
        CUDA-array-interface consumers keep it alive)."""
        nbytes = int(dtype.itemsize)
        for dim in dims:
            nbytes *= dim
        window = self.window
        array = DeviceArray(self._local_ptr + offset, nbytes, self.device,
                            owner=window.local, shape=dims, dtype=dtype.name)
        return array, array

    def local_buffer(self, ref: ArrayRef) -> DeviceBuffer:
        """A buffer of this rank's own registered array (register's hook)."""
        return DeviceBuffer(ref.ptr, ref.nbytes, self.device, owner=ref.source)

    def registered(self, registration: Any) -> None:
        """Registry's hook, on every rank in the same order, inside register's agreed
        step (a failure fails every rank): give ``registration`` the lowest free row of
        the registrations table (so rows agree across ranks) and write there where every
        rank's array is mapped here; kernels then read a call's input from it in place.
        With every row taken, calls on it copy the input in.

        Raises:
            CudaError: the row could not be written.
        """
        import numpy as np

        from ..kernels.launcher import MAX_KERNEL_RANKS

        taken = set(self._rows.values())
        row = next((r for r in range(REGISTRATION_ROWS) if r not in taken), None)
        if row is None or self.size > MAX_KERNEL_RANKS:
            return
        engine = self.window.engine
        entries = np.zeros(MAX_KERNEL_RANKS, np.uint64)
        entries[:self.size] = registration.buffer_ptrs
        engine.upload(self._table.buffer(row * MAX_KERNEL_RANKS * 8, entries.nbytes),
                      entries.view(np.uint8))
        engine.synchronize()
        self._rows[registration.index] = row

    def unregistered(self, registration: Any) -> None:
        """Registry's hook: free the registration's row (bound calls on its arrays must
        not run after this, as the arrays themselves may then be freed)."""
        self._rows.pop(registration.index, None)

    def registered_row(self, ptr: int, nbytes: int) -> tuple[int, int] | None:
        """(row of the registrations table, offset in the array) of ``nbytes`` at ``ptr``
        of this rank's registered arrays, or None (not registered, or it has no row)."""
        if not self._rows or self.registry is None:
            return None
        registration = self.registry.find(ptr, nbytes)
        row = None if registration is None else self._rows.get(registration.index)
        return None if row is None else (row, ptr - registration.ptr)

    @property
    def registrations_table_ptr(self) -> int:
        return self._table.ptr

    def launch(self, entry: str, blocks: int, stream: Any, address: int,
               parties: int = 1) -> None:
        """Launch the collective kernel ``entry`` on ``stream`` with ``blocks`` blocks and the
        kernel parameters at ``address`` (an argument block's); ``parties`` rows of them
        where a time-sliced GPU's leader runs a stepped kernel for its guests too.

        Raises:
            CudaError: the launch failed.
        """
        err = self._launch_kernel(self._function(entry), blocks, parties, 1, THREADS, 1, 1,
                                  0, stream, address, 0)[0]
        if int(err) != 0:
            from ..runtime.cuda_driver import check

            check("cuLaunchKernel", (err,))

    # -- calls -------------------------------------------------------------------------
    def engine_for(self, stream: Any) -> Any:
        """The window's engine on ``stream`` (None: the window's own), cached by handle."""
        engine = self.window.engine
        if stream is None:
            return engine
        from ..backends.cuda_streams import stream_handle

        handle = stream_handle(stream)
        found = self._engines.get(handle)
        if found is None:
            found = self._engines[handle] = engine.on_stream(stream)
        return found

    def run(self, signature: Signature, algorithm: Algorithm, input_ref: ArrayRef,
            output_ref: ArrayRef, *, in_place: bool, stream: Any = None,
            splits: Any = None) -> None:
        """Enqueue one call on ``stream`` (arrays already validated on this rank;
        ``splits``: an all-to-all-v's ``GpuSplits``).

        Raises:
            CollectiveError: the first call of a signature that the ranks do not make
                alike (on every rank), or an algorithm that cannot run it.
        """
        bound = self._bound_for(signature, algorithm, stream)
        steps = bound.call.time_sliced
        if steps is not None and steps.guest:
            placement = self._describe_guest_call(steps, signature, algorithm, input_ref,
                                                  output_ref, in_place, bound.stream)
            copies = placement.copies_input
            self.guest_copies += placement.copy_in + placement.copy_out
        else:
            if steps is not None:
                self._time_sliced.serve(_not_capturing(bound.stream))
            copies = not self._place(bound.args, signature, algorithm, input_ref, output_ref,
                                     in_place, splits)
        self.copies_in += copies
        self.calls += 1
        algorithm.run(bound.call)

    def agreed(self, signature: Signature) -> bool:
        """Whether the ranks have agreed on ``signature`` (made a call of it) before."""
        return signature in self._agreed

    def refused_call(self, call: str, problem: ArgumentProblem, guess: Any, *,
                     stream: Any = None):
        """A call of ``call`` that this rank's checks refused (``problem``), as a
        function of no arguments that enqueues the kernels of ``guess`` (the signature
        and algorithm the peers most likely run) with an argument block of its own whose
        digest is the call's mark and whose arrays are this rank's scratch: the kernels
        meet the peers' as usual, every rank's kernels find the mark where the digest
        goes, move no element and record it, and every rank's ``synchronize()`` raises
        the same error (a CUDA graph capturing it replays the mark). Outside a capture
        the refusing rank waits for its kernels and raises that error in the call. Where
        ranks take turns on this GPU and the guess is a stepped call, a guest hands its
        leader the marked call, and a leader runs it for itself and its guests
        (collectives/time_sliced.py).

        Raises:
            CollectiveError: at once, where no such call can be launched: ``guess`` is
                None (the arguments do not say which call the peers make); the peers then
                meet this rank's next call, so close the communicator on every rank. At
                the first sight of the guessed call, where the peers make another: the
                refusal, raised by every rank in the host's meeting (``_agree``). And
                the returned function, called outside a capture, raises the refused
                call's error (the kernels' record of it); in a capture already
                invalidated (by an operation not allowed there), either raises, naming
                the step.
        """
        if guess is None:
            raise CollectiveError(
                f"{call}: {problem.detail} (refused on rank {self.rank}, which cannot take "
                "part in the call marked: its arguments do not say which call the peers "
                "make; unless every rank refused it alike, the ranks are out of step: close "
                "the communicator on every rank)")
        signature, algorithm = guess
        cu_stream = self.engine_for(stream).stream
        not_capturing = _not_capturing(cu_stream)
        if not not_capturing():
            _check_capture_valid(call, cu_stream, "before this rank refused the call (by "
                                 "its checks or earlier in the capture)")
        mark = encode_mark(self.rank, problem.argument, call)
        self._refusals[mark] = problem.detail
        self._agree(signature, (mark, problem.detail))
        enqueue, _, _ = self._bind_once(signature, algorithm, None, None, in_place=False,
                                        stream=stream, mark=mark)

        def refused() -> None:
            capturing = not not_capturing()
            if capturing:
                _check_capture_valid(call, cu_stream, "before its kernels were launched "
                                     "(while it was bound, or earlier in the capture)")
            enqueue()
            if capturing:
                return   # a captured call raises at synchronize() after each replay
            # The refusing rank raises in the call (the host waits here, on an error path
            # only), with what its check said (the error names the lowest refusing rank).
            note = f"rank {self.rank}'s check said: {problem.detail}"
            try:
                self.synchronize(stream)
            except CollectiveError as error:
                if note not in getattr(error, "__notes__", ()):
                    error.add_note(note)
                raise
            # Only a rank alone gets here: no peer's digest to differ from its mark.
            error = refused_error([mark], where=(
                f"on the GPU by every rank at call {self.calls} of this communicator"))
            error.add_note(note)
            raise error
        refused.keep = enqueue
        return refused

    def bind_call(self, signature: Signature, algorithm: Algorithm, input_ref: ArrayRef,
                  output_ref: ArrayRef, *, in_place: bool, stream: Any = None,
                  splits: Any = None):
        """The call as a function of no arguments that enqueues its kernel on ``stream``
        and does nothing else (``Communicator.bind``): an argument block of its own,
        filled now, and the entry point and grid the algorithm picks, resolved now.

        On a time-sliced GPU the leader's call first maps what its guests handed over
        (guest_imports.py: one probe for messages when there is none), and a guest's call
        whose arrays wait for its leader's mapping binds itself again once the reply is
        in (until then it copies them, as before).

        Raises:
            CollectiveError: as ``run``, at the first sight of the signature.
        """
        enqueue, provisional, checks = self._bind_once(
            signature, algorithm, input_ref, output_ref, in_place=in_place, stream=stream,
            splits=splits)
        role = self._time_sliced
        if (role is None or role.imports is None
                or not getattr(algorithm, "leader_runs_time_sliced", False)):
            return enqueue
        may_map = _not_capturing(self._bound_for(signature, algorithm, stream).stream)
        if not role.guest:
            serve = role.serve

            def leader_enqueue() -> None:
                serve(may_map)
                enqueue()
            leader_enqueue.keep = enqueue
            return leader_enqueue
        if not provisional and not checks:
            return enqueue
        imports = role.imports
        state = [enqueue, provisional, checks]
        # Binding again needs only where the arrays lie. Hold no more: a call remembered
        # by the call cache (call_cache.py) must not keep the user's arrays alive (a bound
        # call keeps its own, in BoundCollective).
        input_ref, output_ref = _where_only(input_ref), _where_only(output_ref)

        def guest_enqueue() -> None:
            # Bound again where an array's allocation was freed and another took its
            # address (the leader's mapping would be the old memory), and, outside any
            # capture, once the replies for the allocations it copies are in.
            launch, waiting, arrays = state
            if (any(imports.buffer_id(ptr) != identity for ptr, identity in arrays)
                    or waiting and imports.settled() and may_map()):
                state[:] = self._bind_once(signature, algorithm, input_ref, output_ref,
                                           in_place=in_place, stream=stream)
                launch = state[0]
            launch()
        guest_enqueue.keep = state
        return guest_enqueue

    def _bind_once(self, signature: Signature, algorithm: Algorithm,
                   input_ref: ArrayRef | None, output_ref: ArrayRef | None, *,
                   in_place: bool, stream: Any, splits: Any = None, mark: int | None = None
                   ) -> tuple[Any, bool, list[tuple[int, int | None]]]:
        """``bind_call``'s enqueue; whether it copies a guest's array only because the
        leader's mapping of it has not been confirmed yet (provisional); and (pointer,
        buffer id) of each guest array it names by the leader's mapping. With ``mark``
        (a refused call's; no arrays) the call is the marked one (``refused_call``)."""
        bound = self._bound_for(signature, algorithm, stream)
        args = type(self._template)()
        ctypes.memmove(ctypes.addressof(args), ctypes.addressof(bound.args),
                       ctypes.sizeof(args))
        # (entry, blocks, parties) of a kernel, the turn of a meeting, a list of copies,
        # or a step of a time-sliced GPU's call (a callable)
        recorded: list[Any] = []
        engine = self.engine_for(stream)

        def record_kernel(entry: str, blocks: int, parties: int = 1) -> None:
            recorded.append((entry, blocks, parties))
        time_sliced = self._time_sliced_steps(algorithm, engine, args, record_kernel,
                                              recorded.append)
        guest_copies, provisional, checks = 0, False, []
        if mark is not None:
            zero_copy = self._place_refused(args, signature, mark, time_sliced)
        elif time_sliced is not None and time_sliced.guest:
            placement = self._describe_guest_call(time_sliced, signature, algorithm,
                                                  input_ref, output_ref, in_place, bound.stream)
            zero_copy = not placement.copies_input
            guest_copies = placement.copy_in + placement.copy_out
            imports = self._time_sliced.imports
            provisional = bool(guest_copies) and imports is not None and not imports.settled()
            checks = [(ref.ptr, imports.buffer_id(ref.ptr)) for ref, flags in (
                (input_ref, placement.input_flags), (output_ref, placement.output_flags))
                if flags & GUEST_IMPORTED]
        else:  # a leader maps its guests' allocations in bind_call's wrapper, every launch
            zero_copy = self._place(args, signature, algorithm, input_ref, output_ref, in_place,
                                    splits)
        algorithm.run(GpuCall(signature, self.size, record_kernel,
                              self.layout.ll_max_bytes, meet=recorded.append,
                              copy=recorded.append, args=args, max_blocks=self._max_blocks,
                              max_bytes=self.layout.max_bytes, time_sliced=time_sliced,
                              ll128_max_bytes=self.layout.ll128_max_bytes))
        params = (ctypes.c_void_p * 1)(ctypes.addressof(args))
        address, cu_stream, launch = ctypes.addressof(params), bound.stream, self._launch_kernel
        steps = [step if callable(step)
                 else (self._function(step[0]), *step[1:]) if isinstance(step, tuple)
                 else self.copier(engine, step) if isinstance(step, list)
                 else self._meetings_on(engine)[step] for step in recorded]
        path, success = self, self._success

        def enqueue() -> None:
            for step in steps:
                if type(step) is not tuple:
                    step()  # a meeting, or copies
                    continue
                function, blocks, parties = step
                err = launch(function, blocks, parties, 1, THREADS, 1, 1, 0, cu_stream,
                             address, 0)[0]
                if err is not success and int(err) != 0:
                    from ..runtime.cuda_driver import check

                    check("cuLaunchKernel", (err,))
            path.calls += 1
            path.guest_copies += guest_copies
            if not zero_copy:
                path.copies_in += 1
        enqueue.keep = (args, params, time_sliced)  # all must outlive every launch
        # The grid it launches (the bench reports the SMs a call uses).
        enqueue.blocks = max((step[1] * step[2] for step in recorded
                              if isinstance(step, tuple)), default=None)
        return enqueue, provisional, checks

    def _time_sliced_steps(self, algorithm: Algorithm, engine: Any, args: Any,
                           launch_own: Any, sink: Any) -> Any:
        """This rank's steps of ``algorithm``'s calls on a time-sliced GPU (None where its
        calls run as usual): a guest's hand-over, or the leader's steps for its guests.
        The leader's steps write ``args.guest_mask``: ``args`` must be the block its
        kernels are launched with (one row of blocks per party in the mask)."""
        role = self._time_sliced
        if role is None or not getattr(algorithm, "leader_runs_time_sliced", False):
            return None
        if role.guest:
            return role.guest_steps(engine, sink)
        return role.leader_steps(engine, args, launch_own, sink)

    def _describe_guest_call(self, steps: Any, signature: Signature, algorithm: Algorithm,
                             input_ref: ArrayRef, output_ref: ArrayRef, in_place: bool,
                             stream: Any) -> Any:
        """Set a guest's steps for this call's arrays on ``stream`` and return their
        placement (which copies the guest makes, and whether the input is copied)."""
        placement = self._time_sliced.place(signature, algorithm, input_ref, output_ref,
                                            in_place, _not_capturing(stream))
        steps.placement, steps.digest = placement, signature.digest
        steps.input = (input_ref.ptr, signature.nbytes)
        steps.output = (output_ref.ptr, output_ref.nbytes)
        return placement

    def _bound_for(self, signature: Signature, algorithm: Algorithm, stream: Any) -> _BoundCall:
        engine = self.engine_for(stream)
        cu_stream = engine.stream
        key = (signature, int(cu_stream))
        bound = self._bound.get(key)
        if bound is None:
            bound = self._bound[key] = self._bind(signature, algorithm, engine)
        return bound

    def copier(self, engine: Any, jobs: list[tuple[int, int, int]]) -> Any:
        """A callable enqueuing copy-engine copies ``(dst, src, nbytes)`` on ``engine``'s
        stream (large copies to several peers at once on side lanes)."""
        device = self.device
        return engine.copier([(DeviceBuffer(dst, nbytes, device),
                               DeviceBuffer(src, nbytes, device)) for dst, src, nbytes in jobs])

    def _meetings_on(self, engine: Any) -> tuple:
        """The two barriers of stream memory operations that stepped and copy-engine
        calls meet with on ``engine``'s stream (flag sets 0 and 1 of the pad's
        FLAG_BARRIER words), made once per stream. Fixed values only, so graphs replay
        them; see docs/MEMORY-ORDERING.md."""
        handle = int(engine.stream)
        found = self._meetings.get(handle)
        if found is None:
            window, rank = self.window, self.rank
            others = [r for r in range(self.size) if r != rank]

            def what(slot: int) -> str:
                peer = slot % FLAG_BARRIER_RANKS
                return (f"rank {rank} in a collective call's stream barrier waiting for "
                        f"rank {peer}")
            found = self._meetings[handle] = tuple(
                engine.make_flag_barrier(
                    window.signal_pad(rank), [window.signal_pad(r) for r in others],
                    base + rank, [base + r for r in others],
                    timeout=self.group.signal_timeout, what=what)
                for base in (FLAG_BARRIER_SLOT_BASE,
                             FLAG_BARRIER_SLOT_BASE + FLAG_BARRIER_RANKS))
        return found

    def _reach(self, ptr: int, nbytes: int, may_alias: bool = True) -> tuple[int, int, int]:
        """How peers reach the ``nbytes`` at ``ptr``: ``(mode, registration row,
        offset)``, the mode ``_IN_HEAP`` (offset into the heap), ``_REGISTERED`` (offset
        into that registered array) or ``_STAGED`` (not at all; row and offset 0)."""
        offset = ptr - self._local_ptr
        if not may_alias:
            return _STAGED, 0, 0
        if self.layout.in_heap(offset, nbytes):
            return _IN_HEAP, 0, offset
        if nbytes:
            found = self.registered_row(ptr, nbytes)
            if found is not None:
                row, offset = found
                return _REGISTERED, row, offset
        return _STAGED, 0, 0

    def _place(self, args: Any, signature: Signature, algorithm: Algorithm,
               input_ref: ArrayRef, output_ref: ArrayRef, in_place: bool,
               splits: Any = None) -> bool:
        """Point ``args`` at the call's arrays; return whether the call makes no copy of
        the input: peers read it in place (it lies in the heap or in a registered array,
        and in place only where the algorithm allows it), or the algorithm never stages
        (``stages_input``); else the kernel stages it. Also say whether peers can reach
        the output, so the push collectives store results there themselves. ``splits``
        (an all-to-all-v's GpuSplits) go into ``args`` with the arrays' counts."""
        may_alias = not in_place or algorithm.aliasing_safe
        # An all-to-all-v's signature has no count: its arrays say what it may touch.
        nbytes = input_ref.nbytes if splits is not None else signature.nbytes
        mode, row, offset = self._reach(input_ref.ptr, nbytes, may_alias)
        if splits is not None:
            args.count, args.output_count = input_ref.count, output_ref.count
            args.itemsize = input_ref.itemsize
            splits.place(args)
        args.input = input_ref.ptr
        args.output = output_ref.ptr
        args.zero_copy = mode
        args.input_offset = offset
        args.registration_row = row
        args.registrations = self._table.ptr
        (args.output_mapped, args.output_registration_row,
         args.output_offset) = self._reach(output_ref.ptr, output_ref.nbytes)
        return mode != _STAGED or not algorithm.stages_input

    def _place_refused(self, args: Any, signature: Signature, mark: int,
                       time_sliced: Any = None) -> bool:
        """Make ``args`` a refused call's: the mark where the digest goes, and this rank's
        staging areas as its arrays, the input read in place (nothing is staged, and no
        kernel writes an output or reads a peer's input once a digest differs). An
        all-to-all-v sends and expects nothing (its digest fails first). A guest of a
        time-sliced GPU (``time_sliced``: its steps) hands over the mark instead, its
        own staging and result areas as its places, copying nothing (a leader's
        ``args`` are marked as anyone's: its guests' rows keep their own calls). Returns
        True: the call copies nothing in."""
        if time_sliced is not None and time_sliced.guest:
            time_sliced.placement = self._time_sliced.place_refused()
            time_sliced.digest = mark
            time_sliced.input = time_sliced.output = (0, 0)
            return True
        args.digest = mark
        args.input = self._local_ptr + self.layout.staging_offset(0)
        # Another area than the copy-engine calls' inbox (staging area 0), which their
        # copies into the output read.
        args.output = self._local_ptr + self.layout.staging_offset(1)
        args.zero_copy, args.input_offset = _IN_HEAP, self.layout.staging_offset(0)
        args.registration_row = 0
        args.registrations = self._table.ptr
        args.output_mapped, args.output_registration_row, args.output_offset = 0, 0, 0
        if signature.op == "all_to_all_v":
            args.count = args.output_count = 0
            args.itemsize = signature.itemsize
            args.send_splits = args.receive_splits = None
            args.send_splits_itemsize = args.receive_splits_itemsize = 8
            args.expect_receives = 0
            for side in (0, 1):
                for rank in range(self.size):
                    args.splits_inline[side][rank] = 0
        return True

    def _function(self, entry: str) -> Any:
        function = self._functions.get(entry)
        if function is None:
            function = self._functions[entry] = self._kernels.function(entry)
        return function

    def _agree(self, signature: Signature, refusal: tuple[int, str] | None = None) -> None:
        """At the first sight of ``signature``, meet every rank on the host and check that
        every rank makes that call. A rank whose checks refused its call brings
        ``refusal`` (its mark, what its check said) beside the call it guessed the peers
        make: where the guess was right the call goes on (its kernels carry the mark);
        where it was not, every rank raises the refusal, naming the rank and argument,
        rather than a disagreement with a call the rank never made.

        Raises:
            CollectiveError: the ranks' calls differ (naming what each rank called), or
                some rank refused its call and guessed wrong; on every rank.
        """
        if signature in self._agreed:
            return
        mine = signature.describe()
        notes = self.group.collective("collective call",
                                      mine if refusal is None else (mine, *refusal))
        calls = [note if isinstance(note, str) else note[0] for note in notes]
        if any(call != calls[0] for call in calls):
            refused = [note for note in notes if not isinstance(note, str)]
            if refused:
                raise refused_error([mark for _, mark, _ in refused],
                                    [None if isinstance(note, str) else note[2]
                                     for note in notes])
            raise disagreement_error(calls)
        self._agreed.add(signature)

    def _bind(self, signature: Signature, algorithm: Algorithm, engine: Any) -> _BoundCall:
        self._agree(signature)
        args = type(self._template)()
        ctypes.memmove(ctypes.addressof(args), ctypes.addressof(self._template),
                       ctypes.sizeof(args))
        cu_stream = engine.stream
        # Kernels that move bytes count bytes (all-to-all-v: the arrays' elements, per call).
        byte_ops = ("all_gather", "all_to_all")
        args.count = signature.nbytes if signature.op in byte_ops else signature.count
        args.itemsize = signature.itemsize   # the copy-engine all-reduce's guard sizes by it
        args.digest = signature.digest
        bound = _BoundCall(args, cu_stream)
        ll_max_bytes = self.layout.ll_max_bytes
        ll128_max_bytes = self.layout.ll128_max_bytes
        why = algorithm.unsupported(GpuCall(signature, self.size, lambda *_: None, ll_max_bytes,
                                            ll128_max_bytes=ll128_max_bytes))
        if why is not None:
            raise CollectiveError(f"algo={algorithm.name!r} cannot run {signature.describe()}: "
                                  f"{why}")
        address = bound.address

        def launch_on_stream(entry: str, blocks: int, parties: int = 1) -> None:
            self.launch(entry, blocks, cu_stream, address, parties)
        bound.call = GpuCall(signature, self.size, launch_on_stream, ll_max_bytes,
                             meet=lambda turn: self._meetings_on(engine)[turn](),
                             copy=lambda jobs: self.copier(engine, jobs)(), args=bound.args,
                             max_blocks=self._max_blocks, max_bytes=self.layout.max_bytes,
                             time_sliced=self._time_sliced_steps(
                                 algorithm, engine, bound.args, launch_on_stream, _run_now),
                             ll128_max_bytes=ll128_max_bytes)
        return bound

    def synchronize(self, stream: Any = None) -> None:
        """Wait for ``stream`` (the window's by default), then raise what a kernel of
        this communicator recorded: ranks that disagreed, or a peer that never came.

        Raises:
            CollectiveError: the ranks' calls differed, or an all-to-all-v's splits did
                not match (found by the kernel).
            SignalTimeout: a kernel gave up waiting for a peer (naming it).
        """
        self.engine_for(stream).synchronize()
        pad = self.window.signal_pad(self.rank)
        word = self.window.engine.download(pad.slice(ERROR_SLOT * 8, 8))
        code = int(word.view("<u8")[0])
        if is_mark(code):
            # As for a splits problem: every rank stopped the same call, nothing moved.
            import numpy as np

            self.window.engine.upload(pad.slice(ERROR_SLOT * 8, 8), np.zeros(8, np.uint8))
            self.window.engine.synchronize()
            mark = code & ~CALL_NUMBER_BITS
            error = refused_error([mark], where=(
                f"on the GPU by every rank at call {code & CALL_NUMBER_BITS} of this "
                "communicator"))
            if decode_mark(mark)[0] == self.rank and mark in self._refusals:
                # Only this rank knows what its check said; the message is every rank's.
                error.add_note(f"rank {self.rank}'s check said: {self._refusals[mark]}")
            raise error
        if code >> 48 == SPLITS_PROBLEM:
            # Every rank stopped the same call at the same point and moved nothing: the
            # ranks are still in step, so the communicator goes on taking calls (as on
            # host memory) once the word is clear.
            import numpy as np

            self.window.engine.upload(pad.slice(ERROR_SLOT * 8, 8), np.zeros(8, np.uint8))
            self.window.engine.synchronize()
            raise CollectiveError(splits_problem(code))
        if code >> 48 == _DISAGREEMENT:
            raise self._disagreement(code & 0xFFFFFFFFFFFF)
        self.window.raise_kernel_error("a collective kernel")

    def _disagreement(self, call: int) -> CollectiveError:
        """The error of call ``call``, whose ranks' digests differed: what each rank called,
        by the digests the kernel that found it left in our pad (DISAGREEMENT_DIGESTS_SLOT)
        and the signatures agreed before (a later call of shapes every rank made before),
        the same line on every rank; without them, the call's number alone."""
        pad = self.window.signal_pad(self.rank)
        words = self.window.engine.download(
            pad.slice(DISAGREEMENT_DIGESTS_SLOT * 8, self.size * 8)).view("<u8")
        digests = [int(word) for word in words]
        own = digests[self.rank]
        where = f"found on the GPU at call {call} of this communicator"
        if not own:
            return CollectiveError(
                f"rank {self.rank}: ranks disagree on a collective call ({where}): every "
                "rank must make the same calls in the same order")
        known = {signature.digest: signature.describe() for signature in self._agreed}
        descriptions = [known.get(digest or own, f"a call of digest 0x{digest or own:016x} "
                                                 "(a shape this rank never agreed)")
                        for digest in digests]
        error = disagreement_error(descriptions)
        return CollectiveError(f"{error} ({where}); every rank must make the same calls in "
                               "the same order")

    def close(self) -> None:
        """Close the window, then unmap the guests' allocations and free the
        registrations table (collective over the node; idempotent)."""
        self._bound.clear()
        self._engines.clear()
        self._meetings.clear()
        self._rows.clear()
        table, self._table = self._table, None
        channel, self._import_channel = self._import_channel, None
        # Run last first, each even when one before it raised: the window's closing
        # barrier, then the guests' mappings, the table, the messages' communicator.
        with contextlib.ExitStack() as later:
            if channel is not None:
                later.callback(channel.close)
            if table is not None:
                later.callback(table.close)
            if self._time_sliced is not None:
                later.callback(self._time_sliced.close)
            self.window.close()
