"""``NodesCommunicator``: the ``Communicator`` of a group that spans nodes. IPC inside each
node (a Communicator over the node's ranks), the rails' engine between nodes (``inter``:
NCCL through nccl4py, or MPI), composed by ``hierarchy``. Same calls, checks and results
as on one node; ``algo`` is ``hierarchical`` (or ``auto``)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from ...runtime.errors import CollectiveError, Unsupported
from ..agreement import Signature
from ..call_guard import FAILED_CALL_ERRORS, CallGuard
from ..call_marks import ArgumentProblem
from ..communicator import Communicator, _Call, _Refused, agree_on_sizes
from ..scratch import ALIGN
from .call_agreement import CallAgreement, Refusal
from .choice import open_inter_engine
from .hierarchy import (
    HostBytes,
    Levels,
    bind_all_gather,
    bind_all_reduce,
    bind_all_to_all,
    bind_reduce_scatter,
    check_even_nodes,
    typed_view,
)

__all__ = ["NodesCommunicator", "HIERARCHICAL"]

HIERARCHICAL = "hierarchical"
# Calls whose scratch is kept bound (their arrays, stream and shape); older ones are dropped.
_BOUND_KEPT = 16


class NodesCommunicator(Communicator):
    """Collectives on the user's arrays among the ranks of a ``Group`` that spans nodes
    (``Group.communicator`` makes one where the group's world has more than one node).

    Every call is collective over the whole group, checked as on one node (the same
    errors, naming arguments and values). Every call starts with an agreement of the
    whole group (call_agreement.py): a call that one rank's checks refuse, or ranks whose
    calls differ, raise the same error on every rank in that call, before any element
    moves, and the next good call is right everywhere. The steps inside a node run on a node
    communicator of ``max_bytes``; its heap holds ``empty()`` arrays (``heap_bytes``,
    default ``2 * max_bytes``) and the calls' scratch (``2 * max_bytes`` more). With the
    NCCL engine GPU calls are stream-ordered; with MPI they wait on the host for the rail
    step. Nodes must hold as many ranks each, numbered consecutively.

    Raises (at creation, on every rank):
        ConfigError: uneven or interleaved nodes, or an engine that cannot run here.
        CollectiveError: bad or disagreeing sizes.
    """

    def __init__(self, group: Any, max_bytes: int, *, heap_bytes: int | None = None,
                 inter: str = "auto") -> None:
        self._closed = True  # until everything below is open
        world = group.world
        self.group = group
        # One call at a time, and none after one failed on this rank, whatever step
        # failed (inside a node, between nodes, the agreement): call_guard.py. Calls here
        # run steps in Python, so the thread rule costs nothing that counts, on GPUs too.
        self._guard = CallGuard(on_fail=group.note_failed_call)
        # Agreed by the whole group first: a node whose ranks refused alone would leave
        # the other nodes waiting for it in the rail setup.
        max_bytes, user_heap = agree_on_sizes(group, max_bytes, heap_bytes)
        self.per_node = check_even_nodes(world.node_of_rank, "Group.communicator across nodes")
        self._node: Communicator | None = None
        self._inter: Any = None
        self._agreement: CallAgreement | None = None
        self._node_group = group.node_group()
        try:
            # The node's heap holds the user's empty() arrays and a call's two scratch
            # arrays (each aligned).
            node_heap = user_heap + 2 * max_bytes + 4 * ALIGN
            self._node = Communicator(self._node_group, max_bytes, heap_bytes=node_heap)
            self._inter = open_inter_engine(inter, group)
            # Collective too (a persistent MPI request over the group's communicator).
            self._agreement = CallAgreement(group)
        except BaseException:
            self._release()
            raise
        self.max_bytes, self.heap_bytes = self._node.max_bytes, user_heap
        self._path = self._node._path  # memory, device, window: the checks read them
        # Each call's signature by what the call asked: built (and its digest computed)
        # once, looked up after that.
        self._signatures: dict[tuple, Signature] = {}
        self._bound: OrderedDict[tuple, _Steps] = OrderedDict()
        self._recent = None
        self._closed = False

    # -- facts -------------------------------------------------------------------------
    @property
    def inter(self) -> str:
        """The engine between nodes that runs the rail steps: ``nccl`` or ``mpi``."""
        return self._inter.name

    @property
    def copies_in(self) -> int:
        return self._node.copies_in

    @property
    def registered(self) -> int:
        return 0

    @property
    def closed(self) -> bool:
        return self._closed or self._node.closed

    # -- arrays ------------------------------------------------------------------------
    def empty(self, shape: int | tuple[int, ...], dtype: Any) -> Any:
        """A new array inside this rank's node window (see ``Communicator.empty``)."""
        self._check_open()
        return self._node.empty(shape, dtype)

    def register(self, array: Any) -> Any:
        """Not across nodes: a registration maps memory between the ranks of one node.

        Raises:
            Unsupported: always, saying what to do instead.
        """
        raise Unsupported("register() on a communicator spanning nodes: registered memory "
                          "is mapped between the ranks of one node only; register on a "
                          "communicator of one node's group, or pass the array to the calls "
                          "(they copy it in)")

    def unregister(self, array: Any) -> None:
        raise Unsupported("unregister() on a communicator spanning nodes: nothing is "
                          "registered there")

    # -- calls ---------------------------------------------------------------------------
    def _refuse_all_to_all(self, call: str) -> None:
        """All-to-all runs hierarchically (hierarchy.bind_all_to_all); all-to-all-v has
        no hierarchical steps: its counts differ per pair, and the middle steps would
        need every rank's splits on every rank of its node and rail first.

        Raises:
            ArgumentProblem: for all_to_all_v (the call still takes part in its agreement,
                so a rank that calls it while its peers call another collective does not
                leave them waiting; every rank raises).
        """
        if call == "all_to_all_v":
            raise ArgumentProblem("collective",
                f"all_to_all_v on a communicator spanning nodes is not built: its "
                f"hierarchical steps would need every pair's counts on the ranks that relay "
                f"them; across these {self.group.world.node_count} nodes use all_to_all "
                "(equal blocks, padded), all_to_all_v on a communicator of one node's "
                "group, or MPI's Alltoallv")

    def _resolve_call(self, call: _Call) -> None:
        """Set the call's signature (built once per shape); its ranks agree on it each
        time it runs (call_agreement.py).

        Raises:
            CollectiveError: an algorithm other than hierarchical / auto (a check on this
                rank: the caller turns it into the refusal every rank raises).
        """
        if call.algo not in ("auto", HIERARCHICAL):
            raise CollectiveError(f"algo={call.algo!r}: a communicator spanning nodes runs "
                                  f"the {HIERARCHICAL} algorithm; pass algo='auto' or "
                                  f"'{HIERARCHICAL}'")
        inp = call.inp
        key = (call.op, inp.count, inp.dtype, inp.itemsize, call.redop)
        signature = self._signatures.get(key)
        if signature is None:
            signature = self._signatures[key] = Signature(
                call.op, inp.count, inp.dtype, inp.itemsize, call.redop, HIERARCHICAL)
        call.signature = signature

    def _guess(self, collective: str, given: dict[str, Any]) -> None:
        """None: a refused call across nodes launches nothing (its ranks agree before
        any step), so it needs no guess of the peers' call."""
        return None

    def _bind_call(self, call: _Call | _Refused) -> tuple[str, Callable[[], None]]:
        guard, agreement = self._guard, self._agreement
        refusal = _refusal(call) if isinstance(call, _Refused) else None
        if refusal is None:
            try:
                steps = guard.run(lambda: self._bind(call))
            except CollectiveError as exc:   # no room for its scratch: refused here
                refusal = _no_room(call.op, exc)
        if refusal is not None:
            return (f"{call.op} (refused on rank {self.rank})",
                    lambda: guard.run(lambda: agreement.refuse(refusal)))
        op, signature = call.op, call.signature
        return signature.describe(), lambda: guard.run(
            lambda: steps.agree_and_run(agreement, op, signature))

    def synchronize(self, stream: Any = None) -> None:
        self._check_open()
        try:
            self._node.synchronize(self.stream if stream is None else stream)
        except FAILED_CALL_ERRORS as exc:   # a kernel gave up on a peer: out of step
            self._guard.fail(exc)
            raise

    @property
    def stream(self) -> Any:
        """The stream calls run on when given none: the group's own (the stream of its
        windows' engine, as on one node), never the node group's, whose engine is
        another object with a stream of its own. Work the caller queued on the group's
        windows is then ordered before a call, and what they read after it follows it."""
        if self.memory == "host":
            return None
        return self.group.backend.engine().stream

    def _run(self, call: _Call | _Refused, key: tuple | None = None) -> Any:
        if isinstance(call, _Refused):
            refusal = _refusal(call)
            return self._guard.run(lambda: self._agreement.refuse(refusal))
        return self._guard.run(lambda: self._run_steps(call))

    def _run_steps(self, call: _Call) -> Any:
        """Bind the call's steps (or find them bound), agree on it with every rank,
        then run them.

        Raises:
            CollectiveError: as ``CallAgreement.agree``; a call whose scratch finds no
                room in the node heap is this rank's refusal (on every rank).
        """
        try:
            steps = self._binding(call)
        except CollectiveError as exc:
            self._agreement.refuse(_no_room(call.op, exc))   # raises
        steps.agree_and_run(self._agreement, call.op, call.signature)
        return call.result

    def _binding(self, call: _Call) -> _Steps:
        """The call's steps, bound on these arrays and stream (the last 16 kept)."""
        identity = (call.op, call.redop, call.inp.ptr, call.inp.nbytes, call.inp.dtype,
                    call.out.ptr, call.in_place, _stream_key(call.stream))
        steps = self._bound.get(identity)
        if steps is None:
            steps = self._bound[identity] = self._bind_making_room(call)
            if len(self._bound) > _BOUND_KEPT:
                # Its scratch returns to the heap: let work still queued on it finish.
                oldest = next(iter(self._bound))
                self._drain([oldest])
                del self._bound[oldest]
        else:
            self._bound.move_to_end(identity)
        return steps

    def _bind_making_room(self, call: _Call) -> _Steps:
        """``_bind``, and when the heap has no room left for the call's scratch, again
        after dropping the kept bindings (their scratch returns to the heap once the work
        queued on it has finished). Local: nothing here is collective."""
        try:
            return self._bind(call)
        except CollectiveError:
            if not self._bound:
                raise
        self._drain(list(self._bound))
        self._bound.clear()
        return self._bind(call)

    def _drain(self, identities: list[tuple]) -> None:
        """Wait for the work queued on the streams of these kept bindings (the last
        field of each identity: a stream handle, or None for the communicator's own)."""
        for stream in dict.fromkeys(identity[-1] for identity in identities):
            self._node.synchronize(self.stream if stream is None else stream)

    def _bind(self, call: _Call) -> _Steps:
        node = self._node
        memory = node.memory
        engine = node._path.window.engine
        if memory != "host":
            # The node steps and the rail step run on the caller's stream, the group's
            # own by default (``stream``): on the node group's stream they would race
            # the caller's work on either side of the call.
            engine = engine.on_stream(self.stream if call.stream is None else call.stream)
        check = (self._capture_check(engine) if memory != "host" and
                 not self._inter.stream_ordered else None)
        return _Steps(self._bind_steps(call, engine), check)

    def _capture_check(self, engine: Any) -> Callable[[], str | None]:
        """A check, each time the call runs, that its stream is not being captured: a
        host-blocking engine waits for the stream, which a CUDA graph cannot replay (and
        a wait inside a capture would invalidate the user's graph with an error that
        names no cause). It says why, or None."""
        from ...backends.cuda_streams import stream_capturing

        handle, name = int(engine.stream), self._inter.name

        def capture_problem() -> str | None:
            if not stream_capturing(handle):
                return None
            return (f"a call across nodes is being captured in a CUDA graph, but the engine "
                    f"between nodes is {name!r}, which waits on the host: create the "
                    "communicator with inter='nccl' to capture it, or call it outside the "
                    "capture")
        return capture_problem

    def _bind_steps(self, call: _Call, engine: Any) -> Callable[[], None]:
        world, node = self.group.world, self._node
        memory = node.memory
        byte_call = call.op in ("all_gather", "all_to_all")
        dtype = "uint8" if byte_call else call.inp.dtype
        # The node calls get the stream the steps were bound on (the group's when the
        # caller gave none): given None, they would run on the node group's own.
        stream = None if memory == "host" else engine.stream
        levels = Levels(node, self._inter, engine, stream,
                        lambda buffer: typed_view(buffer, memory, dtype), dtype, call.redop)
        inp, out = self._buffer(call.inp), self._buffer(call.out)
        if call.op == "all_gather":
            return bind_all_gather(levels, inp, out, nodes=world.node_count,
                                   per_node=self.per_node, node_index=world.node_index)
        if call.op == "all_reduce":
            return bind_all_reduce(levels, inp, out, element=call.inp.itemsize,
                                   in_place=call.in_place)
        if call.op == "all_to_all":
            return bind_all_to_all(levels, inp, out, nodes=world.node_count,
                                   per_node=self.per_node)
        return bind_reduce_scatter(levels, inp, out, element=call.inp.itemsize,
                                   nodes=world.node_count)

    def _buffer(self, ref: Any) -> Any:
        """The user's array as a buffer the steps slice: its bytes by address, holding
        no reference to the array (kept bindings must not keep the user's tensors alive;
        a later call at the same address means an array there again)."""
        if self.memory == "host":
            import ctypes

            import numpy as np

            raw = (ctypes.c_uint8 * ref.nbytes).from_address(ref.ptr) if ref.nbytes else b""
            return HostBytes(np.frombuffer(raw, np.uint8) if ref.nbytes else
                             np.empty(0, np.uint8))
        from ...backends.device_buffer import DeviceBuffer

        return DeviceBuffer(ref.ptr, ref.nbytes, self._path.device, None)

    def close(self) -> None:
        """Close the node communicator, the engine between nodes and the node group
        (collective over the group; idempotent)."""
        if self._closed:
            return
        self._closed = True
        self.group.forget_communicator(self)
        self._bound.clear()
        self._release()

    def inner_meetings(self) -> tuple[Any, ...]:
        """The node group's rendezvous: a with-block's grace reaches its closing barriers."""
        return (self._node_group.rendezvous,) if self._node_group is not None else ()

    def _release(self) -> None:
        node, self._node = self._node, None
        inter, self._inter = self._inter, None
        node_group, self._node_group = self._node_group, None
        agreement, self._agreement = self._agreement, None
        try:
            if agreement is not None:
                agreement.close()
            if node is not None:
                node.close()
            if inter is not None:
                inter.close()
        finally:
            if node_group is not None:
                node_group.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"rank {self.rank} of {self.size}"
        return (f"NodesCommunicator({self.memory}, {self.group.world.node_count} nodes x "
                f"{self.per_node}, inter {self._inter.name if self._inter else '-'}, "
                f"max_bytes={self.max_bytes}, {state})")


def _stream_key(stream: Any) -> Any:
    if stream is None:
        return None
    from ...backends.cuda_streams import stream_handle

    return stream_handle(stream)


class _Steps:
    """A call's steps bound on its arrays and stream (``run``), and the check it needs
    each time it runs (``check``: None, or what says why it cannot run now)."""

    __slots__ = ("run", "check")

    def __init__(self, run: Callable[[], None], check: Callable[[], str | None] | None
                 ) -> None:
        self.run, self.check = run, check

    def agree_and_run(self, agreement: CallAgreement, op: str, signature: Signature) -> None:
        """Agree on the call with every rank (this rank's refusal, if its check says
        so), then run its steps.

        Raises:
            CollectiveError: as ``CallAgreement.agree`` / ``refuse``.
        """
        problem = None if self.check is None else self.check()
        if problem is not None:
            agreement.refuse(Refusal(op, "stream", problem))
        agreement.agree(signature.digest, signature.describe)
        self.run()


def _refusal(call: _Refused) -> Refusal:
    """What this rank's checks refused of ``call``, as the agreement tells every rank."""
    return Refusal(call.op, call.problem.argument, call.problem.detail)


def _no_room(call: str, error: CollectiveError) -> Refusal:
    """A call whose steps found no room for their scratch in this rank's node heap (its
    ``empty()`` arrays hold it): refused on this rank, as a check would."""
    return Refusal(call, "scratch", str(error))
