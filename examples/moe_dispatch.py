"""A mixture-of-experts layer's token dispatch and combine across ranks with
``comm.all_to_all_v``, checked bit for bit against a reference every rank computes alone
and, on GPUs, against NCCL (torch.distributed's ``all_to_all_single``).

    mpiexec -n 4 python examples/moe_dispatch.py --backend host     # numpy, no GPU needed
    mpiexec -n 2 python examples/moe_dispatch.py                    # torch, a GPU per rank
        [--tokens T] [--hidden H] [--experts E] [--topk K] [--dtype float32|bfloat16]
        [--steps S] [--iters N] [--seed S] [--backend auto|host|cuda-ipc|cuda-vmm]
        [--result FILE]   # on GPUs: the timing as a result document

Every rank holds T tokens of H features, seeded by (seed, rank, step). A router (an H x E
matrix seeded by the seed alone, the same on every rank) sends each token to its K
top-scoring experts (the lowest expert first among equal scores). The E experts are
spread over the ranks, E / size each: expert e lives on rank e // (E / size). A token
sent to K experts travels as K copies, one per (token, expert) pair. One step of the
layer:

1. route: sort the pairs by expert (hence by destination rank), each expert's in token
   order, and count them per expert;
2. exchange those counts with ``comm.all_to_all``: every rank learns how many tokens each
   rank sends to each of its experts;
3. dispatch: ``comm.all_to_all_v`` sends each rank its experts' tokens;
4. experts: expert e maps a token x to x * (1 + e % 3) + e % 8;
5. combine: ``comm.all_to_all_v`` back, with the dispatch's splits reversed;
6. put the pairs back in their original order and sum each token's K expert outputs.

On host memory (numpy) the splits are host counts made from the exchanged counts. On GPUs
(torch) they never leave the device: the dispatch's ``input_splits`` is a tensor computed
from the routing and its ``output_splits`` a tensor the kernel *fills* with the counts
received; the experts run on a buffer sized for the worst case (every pair of every rank)
and the combine sends back only the rows the counts say arrived; the combine takes the
filled tensor as its ``input_splits`` and has its own ``output_splits`` filled, which
must equal the dispatch's sends. Nothing in the step waits for the host, so the whole
step is captured in one CUDA graph and replayed with new tokens, hence new routing and
new splits, every replay checked. The step is then timed eager and as a graph replay:
this example's timing on this machine (``examples/moe_step_bench.py`` times the same
step against NCCL and PyTorch symmetric memory).

Exact on purpose, in float32 and in bfloat16: tokens are integers in [-8, 8) and the
router's weights integers in [-2, 2]; scores are computed in float32 (from a float32 copy
of bfloat16 tokens), integers that float32 adds exactly in any order (TF32 included)
while H <= 2^20. An expert's output is an integer in [-24, 28], so a token's combined
output is an integer of magnitude at most 28 K, and so is every partial sum: exact in any
order while 28 K <= 2^24 in float32 and 28 K <= 2^8 in bfloat16 (K <= 9), the largest
magnitudes below which those types hold every integer. Flags past these limits are
refused. Results are compared bit for bit, not within a tolerance. The reference never
calls the library: each rank makes every rank's tokens from the seed and derives what its
experts must receive and what its own tokens must come back as. Exit status 0 when every
check passed on every rank.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import numpy as np

import ipcshare
from ipcshare import IpcShareError
from ipcshare.collectives.arrays import to_numpy_dtype
from ipcshare.runtime.config import BACKENDS

# Tokens are integers in [TOKEN_LOW, TOKEN_HIGH), router weights in [-WEIGHT, WEIGHT].
TOKEN_LOW, TOKEN_HIGH = -8, 8
WEIGHT = 2
# Expert e maps x to x * (1 + e % EXPERT_SCALES) + e % EXPERT_SHIFTS: outputs bounded
# whatever the number of experts, so that K of them still add up exactly in bfloat16.
EXPERT_SCALES = 3
EXPERT_SHIFTS = 8
MAX_EXPERT_OUTPUT = max(-TOKEN_LOW * EXPERT_SCALES,
                        (TOKEN_HIGH - 1) * EXPERT_SCALES + EXPERT_SHIFTS - 1)
# The token types, each with the magnitude up to which it holds every integer (2 to the
# significand's bits, the implicit one included).
EXACT_INTEGERS = {"float32": 1 << 24, "bfloat16": 1 << 8}
DTYPES = tuple(EXACT_INTEGERS)
# Scores are float32 sums of H products of magnitude <= 16: exact below 2^24.
MAX_HIDDEN = EXACT_INTEGERS["float32"] // (-TOKEN_LOW * WEIGHT)
# Routing keys are score * E + tie-break in int64; counts per expert are exchanged as
# int64 too (E x 8 bytes): a bound far above any layer, far below either limit.
MAX_EXPERTS = 1 << 20
EAGER_STEPS = 2   # checked eager steps on GPUs before the capture (they warm it up too)


class Refused(Exception):
    """This job cannot run the example; the message says why, in one line, and every rank
    raises it alike."""


def max_topk(dtype: str) -> int:
    """The most experts per token whose outputs still add up exactly in ``dtype``."""
    return EXACT_INTEGERS[dtype] // MAX_EXPERT_OUTPUT


def inexact(dtype: str, hidden: int, topk: int) -> str | None:
    """Why a layer of ``hidden`` features and ``topk`` experts per token cannot be checked
    bit for bit in ``dtype`` (in the example's flags' words), or None when it can."""
    if hidden > MAX_HIDDEN:
        return (f"--hidden {hidden}: a score adds {hidden} products of up to "
                f"{-TOKEN_LOW * WEIGHT} in float32, exact only up to {MAX_HIDDEN} features")
    if topk > max_topk(dtype):
        return (f"--topk {topk} with --dtype {dtype}: a token's {topk} expert outputs may add "
                f"up to {topk * MAX_EXPERT_OUTPUT}, past {EXACT_INTEGERS[dtype]}, the largest "
                f"magnitude below which {dtype} holds every integer; use --topk "
                f"{max_topk(dtype)} or less" + (" or --dtype float32" if dtype != "float32"
                                                 else ""))
    return None


@dataclasses.dataclass(frozen=True)
class Layer:
    """The layer's shape: ``tokens`` of ``hidden`` ``dtype`` per rank, each sent to its
    ``topk`` best of ``experts`` spread over ``ranks``."""

    ranks: int
    tokens: int
    hidden: int
    experts: int
    topk: int = 1
    dtype: str = "float32"

    @property
    def local_experts(self) -> int:
        """Experts per rank: expert e lives on rank e // local_experts."""
        return self.experts // self.ranks

    @property
    def pairs(self) -> int:
        """(token, expert) pairs a rank sends: each token once per expert it goes to."""
        return self.tokens * self.topk

    @property
    def capacity(self) -> int:
        """Rows a rank can receive at most: every pair of every rank."""
        return self.ranks * self.pairs

    @property
    def itemsize(self) -> int:
        """Bytes of one feature."""
        return 4 if self.dtype == "float32" else 2

    @property
    def max_bytes(self) -> int:
        """The communicator's largest call: the worst-case inbox (the combine's input) or
        the count exchange (an int64 per expert), whichever is larger."""
        return max(self.capacity * self.hidden * self.itemsize, self.experts * 8)

    @property
    def exchanged_bytes(self) -> int:
        """The GPU step's tensors that its exchanges move: the sorted pairs, the inbox,
        the experts' outputs, the pairs back, and the counts per expert each way."""
        return (2 * (self.pairs + self.capacity) * self.hidden * self.itemsize
                + 2 * self.experts * 8)

    def describe(self) -> str:
        """The layer in words, as the reports title it."""
        routing = f" (top-{self.topk})" if self.topk > 1 else ""
        return (f"{self.tokens} tokens x {self.hidden} {self.dtype} per rank, {self.experts} "
                f"experts{routing} on {self.ranks} rank(s)")


@dataclasses.dataclass
class Outcome:
    """What a step produced on one rank: the rows its experts received (in arrival order),
    the elements received from and returned by each rank, and its tokens after the layer."""

    received: np.ndarray
    received_splits: np.ndarray
    returned_splits: np.ndarray
    result: np.ndarray


# -- the model and the reference (numpy; no library call) ---------------------------------

def make_tokens(seed: int, rank: int, step: int, tokens: int, hidden: int,
                dtype: str = "float32") -> np.ndarray:
    """Rank ``rank``'s tokens at ``step``: integers in [TOKEN_LOW, TOKEN_HIGH)."""
    rng = np.random.default_rng([seed, rank, step])
    return rng.integers(TOKEN_LOW, TOKEN_HIGH, (tokens, hidden)).astype(to_numpy_dtype(dtype))


def router_weights(seed: int, hidden: int, experts: int) -> np.ndarray:
    """The router's matrix, the same on every rank: integers in [-2, 2] as float32."""
    rng = np.random.default_rng([seed, 1 << 30])   # a stream no rank's tokens use
    return rng.integers(-WEIGHT, WEIGHT + 1, (hidden, experts)).astype(np.float32)


def route(tokens: np.ndarray, weights: np.ndarray, topk: int = 1) -> np.ndarray:
    """Each token's ``topk`` experts, best first (tokens x topk): the highest scores, the
    lowest expert first among equal scores."""
    experts = weights.shape[1]
    scores = (tokens.astype(np.float64) @ weights.astype(np.float64)).astype(np.int64)
    # Unique keys: no choice depends on how a sort breaks ties (the GPU path uses them too).
    keys = scores * experts + np.arange(experts - 1, -1, -1)
    return np.argsort(-keys, axis=1)[:, :topk]


def apply_experts(rows: np.ndarray, experts: np.ndarray) -> np.ndarray:
    """Row i through expert ``experts[i]``: x * (1 + e % 3) + e % 8, exact in the rows'
    type (an integer in [-24, 28])."""
    e = experts.astype(np.int64)[:, None]
    out = rows.astype(np.float64) * (1 + e % EXPERT_SCALES) + e % EXPERT_SHIFTS
    return out.astype(rows.dtype)


def combine_reference(tokens: np.ndarray, experts: np.ndarray) -> np.ndarray:
    """Each token's combined output: the sum of its experts' outputs (``experts``: tokens x
    topk), exact in the tokens' type within the limits of ``inexact``."""
    total = sum(apply_experts(tokens, experts[:, slot]).astype(np.float64)
                for slot in range(experts.shape[1]))
    return total.astype(tokens.dtype)


@dataclasses.dataclass
class Expected:
    """What a step must produce on one rank (``Outcome``'s fields), from the seed alone."""

    received: np.ndarray
    received_splits: np.ndarray
    sent_splits: np.ndarray
    result: np.ndarray


def reference(layer: Layer, weights: np.ndarray, seed: int, step: int, rank: int) -> Expected:
    """Rank ``rank``'s expected outcome at ``step``, from every rank's seeded tokens: from
    each rank q in turn, q's tokens for each of this rank's experts in expert order, each
    expert's in q's token order; and this rank's tokens through their experts, summed."""
    per_rank = layer.local_experts
    mine = range(rank * per_rank, (rank + 1) * per_rank)
    parts, received = [], []
    for q in range(layer.ranks):
        tokens = make_tokens(seed, q, step, layer.tokens, layer.hidden, layer.dtype)
        experts = route(tokens, weights, layer.topk)
        rows = [tokens[np.flatnonzero((experts == e).any(axis=1))] for e in mine]
        parts += rows
        received.append(sum(len(r) for r in rows) * layer.hidden)
        if q == rank:
            own_tokens, own_experts = tokens, experts
    sent = [np.count_nonzero(own_experts // per_rank == q) * layer.hidden
            for q in range(layer.ranks)]
    return Expected(received=np.concatenate(parts) if parts else
                    np.zeros((0, layer.hidden), to_numpy_dtype(layer.dtype)),
                    received_splits=np.array(received, np.int64),
                    sent_splits=np.array(sent, np.int64),
                    result=combine_reference(own_tokens, own_experts))


def wrong_elements(got: np.ndarray, want: np.ndarray) -> int:
    """Elements of ``got`` whose bits differ from ``want``'s; every element when the shapes
    or types differ."""
    got, want = np.ascontiguousarray(got), np.ascontiguousarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        return max(got.size, want.size, 1)
    bits = f"u{got.itemsize}"
    return int(np.count_nonzero(got.view(bits) != want.view(bits)))


def compare(expected: Expected, outcome: Outcome) -> dict[str, int]:
    """Wrong elements of each part of a step's outcome, bit for bit."""
    return {
        "counts received": wrong_elements(
            np.asarray(outcome.received_splits, np.int64), expected.received_splits),
        "counts returned": wrong_elements(
            np.asarray(outcome.returned_splits, np.int64), expected.sent_splits),
        "tokens received": wrong_elements(outcome.received, expected.received),
        "combined tokens": wrong_elements(outcome.result, expected.result),
    }


def describe_wrong(wrong: dict[str, int]) -> str:
    """``compare``'s nonzero parts in words."""
    return ", ".join(f"{count} wrong in the {part}" for part, count in wrong.items() if count)


def settle(group, wrong: int, problems: list[str], script: str) -> int:
    """Collective: this rank's problems on stderr (one line each), then every rank's count
    summed."""
    for line in problems:
        sys.stderr.write(f"{script}: rank {group.rank}: {line}\n")
    return sum(group.world.comm.allgather(wrong))


# -- on host memory: numpy ------------------------------------------------------------------

def host_step(comm, layer: Layer, tokens: np.ndarray, weights: np.ndarray) -> Outcome:
    """One step of the layer on numpy arrays."""
    n, per_rank, hidden, topk = layer.ranks, layer.local_experts, layer.hidden, layer.topk
    experts = route(tokens, weights, topk).reshape(-1)   # pair p: token p // topk
    # By expert, so by destination rank; stable, so each expert's pairs in token order.
    order = np.argsort(experts, kind="stable")
    permuted = tokens[order // topk]
    counts = np.bincount(experts, minlength=layer.experts).astype(np.int64)
    # Block q of counts_in came from rank q: its tokens for each of this rank's experts.
    counts_in = np.empty_like(counts)
    comm.all_to_all(counts_in, counts)
    sends = counts.reshape(n, per_rank).sum(axis=1) * hidden
    receives = counts_in.reshape(n, per_rank).sum(axis=1) * hidden
    inbox = np.empty((int(receives.sum()) // hidden, hidden), tokens.dtype)
    comm.all_to_all_v(inbox, permuted, receives, sends)
    # Rank q's rows arrive grouped by expert, in the order of counts_in's block q.
    local = np.repeat(np.tile(np.arange(per_rank), n), counts_in)
    expert_out = apply_experts(inbox, comm.rank * per_rank + local)
    back = np.empty_like(permuted)
    comm.all_to_all_v(back, expert_out, sends, receives)
    pairs = np.empty_like(permuted)
    pairs[order] = back
    result = pairs.reshape(layer.tokens, topk, hidden).astype(np.float64).sum(axis=1)
    return Outcome(received=inbox, received_splits=receives, returned_splits=sends,
                   result=result.astype(tokens.dtype))


def run_on_host(group, layer: Layer, steps: int, seed: int) -> tuple[bool, str]:
    """``steps`` steps with new tokens each, checked against the reference."""
    weights = router_weights(seed, layer.hidden, layer.experts)
    wrong, problems = 0, []
    with group.communicator(max_bytes=layer.max_bytes, heap_bytes=0) as comm:
        for step in range(steps):
            tokens = make_tokens(seed, group.rank, step, layer.tokens, layer.hidden,
                                 layer.dtype)
            outcome = host_step(comm, layer, tokens, weights)
            parts = compare(reference(layer, weights, seed, step, group.rank), outcome)
            if sum(parts.values()):
                wrong += sum(parts.values())
                problems.append(f"step {step}: {describe_wrong(parts)}")
    total = settle(group, wrong, problems, "moe_dispatch.py")
    verdict = ("verified bit for bit against the local reference" if total == 0 else
               f"MISMATCH against the local reference (#wrong {total} over all ranks)")
    return total == 0, f"{_title(layer, 'host')}: {steps} steps {verdict}"


def _title(layer: Layer, backend: str) -> str:
    return f"MoE dispatch and combine of {layer.describe()} ({backend})"


# -- on GPUs: torch, splits on the device, one CUDA graph -----------------------------------

class LibraryExchange:
    """The step's three exchanges by ipcshare (``comm``), each bound once on ``stream``
    (one kernel launch each, which a CUDA graph captures; device splits are read at run
    time). The tensors they move live in the communicator's window, so the kernels read
    their inputs in place."""

    name = "ipcshare"
    graphs = True   # nothing in the step waits for the host

    def __init__(self, torch, comm, stream) -> None:
        self.torch, self.comm, self.stream = torch, comm, stream
        self.rank = comm.rank
        self.device = torch.device("cuda", torch.cuda.current_device())

    def buffer(self, shape: tuple[int, ...], dtype):
        """An uninitialised tensor in the window."""
        return self.torch.from_dlpack(self.comm.empty(shape, dtype))

    def bind(self, step: GpuStep) -> tuple:
        """(exchange counts, dispatch, combine) on ``step``'s tensors. Collective: every
        rank binds the same calls in the same order."""
        comm, stream = self.comm, self.stream
        return (comm.bind("all_to_all", step.counts_in, step.counts, stream=stream),
                comm.bind("all_to_all_v", step.inbox.view(-1), step.permuted.view(-1),
                          step.received, step.sends, stream=stream),
                comm.bind("all_to_all_v", step.back.view(-1), step.expert_out.view(-1),
                          step.returned, step.received, stream=stream))

    def synchronize(self) -> None:
        """Wait for the step; raises what a kernel recorded, on every rank."""
        self.comm.synchronize(self.stream)


class GpuStep:
    """One step of the layer on this rank's GPU, on fixed tensors (so a CUDA graph of it
    replays with whatever ``tokens`` holds). Its three exchanges are ``exchange``'s
    (``LibraryExchange`` here; the benchmark swaps in NCCL's and PyTorch symmetric
    memory's): it names the device (``device``), makes the tensors they move (``buffer``)
    and binds the exchanges to the step's tensors (``bind``); splits count elements."""

    def __init__(self, torch, layer: Layer, weights: np.ndarray, exchange) -> None:
        self.torch, self.layer, self.exchange = torch, layer, exchange
        self.rank, device = exchange.rank, exchange.device
        t, h, cap, pairs = layer.tokens, layer.hidden, layer.capacity, layer.pairs
        dtype = getattr(torch, layer.dtype)

        def zeros(*shape, dtype=torch.int64):
            return torch.zeros(shape, dtype=dtype, device=device)

        self.weights = torch.from_numpy(weights).to(device)
        self.tie_break = torch.arange(layer.experts - 1, -1, -1, device=device)
        self.pair_positions = torch.arange(pairs, device=device)
        self.rows = torch.arange(cap, device=device)
        self.ones = torch.ones(pairs, dtype=torch.int64, device=device)
        self.tokens = zeros(t, h, dtype=dtype)               # the step's input
        self.order = zeros(pairs)                            # sorted position -> pair
        moved = exchange.buffer                              # uninitialised
        self.permuted = moved((pairs, h), dtype)             # pairs sorted by expert
        self.counts = moved((layer.experts,), torch.int64)   # pairs per expert
        self.counts_in = moved((layer.experts,), torch.int64)    # block q: from rank q
        self.sends = zeros(layer.ranks)                      # dispatch input_splits
        self.received = zeros(layer.ranks)                   # filled by the dispatch
        self.inbox = moved((cap, h), dtype)                  # the experts' rows, worst case
        self.expert_out = moved((cap, h), dtype)
        self.returned = zeros(layer.ranks)                   # filled by the combine
        self.back = moved((pairs, h), dtype)                 # in sorted order
        self.unsorted = zeros(pairs, h, dtype=dtype)         # in pair order
        self.result = zeros(t, h, dtype=dtype)               # K outputs summed per token
        self._exchange_counts, self._dispatch, self._combine = exchange.bind(self)

    def __call__(self) -> None:
        """Enqueue one step on the current stream: no host synchronisation (unless the
        exchange has one)."""
        torch, layer = self.torch, self.layer
        per_rank, hidden, topk = layer.local_experts, layer.hidden, layer.topk
        # Route: integer scores (exact in float32), unique keys as in route().
        scores = torch.matmul(self.tokens.float(), self.weights)
        keys = scores.long() * layer.experts + self.tie_break
        expert = keys.topk(topk, dim=1).indices.reshape(-1)   # pair p: token p // topk
        # Sort by expert, then pair (unique keys: any sort gives this order).
        self.order.copy_(torch.argsort(expert * layer.pairs + self.pair_positions))
        torch.index_select(self.tokens, 0, self.order // topk, out=self.permuted)
        self.counts.zero_()
        self.counts.scatter_add_(0, expert, self.ones)
        torch.sum(self.counts.view(layer.ranks, per_rank), dim=1, out=self.sends)
        self.sends.mul_(hidden)   # splits count elements: a row is `hidden` of them
        self._exchange_counts()
        self._dispatch()          # fills self.received
        # Experts on the worst-case buffer: row i's expert follows from the exchanged
        # counts per expert; rows past those received are garbage the combine never sends.
        segment = torch.searchsorted(torch.cumsum(self.counts_in, 0), self.rows, right=True)
        e = (segment % per_rank + self.rank * per_rank)[:, None]
        scale = (e % EXPERT_SCALES + 1).to(self.inbox.dtype)
        shift = (e % EXPERT_SHIFTS).to(self.inbox.dtype)
        torch.addcmul(shift, self.inbox, scale, out=self.expert_out)
        self._combine()           # input_splits: self.received; fills self.returned
        self.unsorted.index_copy_(0, self.order, self.back)
        torch.sum(self.unsorted.view(layer.tokens, topk, hidden), dim=1, out=self.result)

    def poison(self) -> None:
        """Outputs set to values no step writes, so anything a step leaves out shows."""
        for tensor in (self.inbox, self.back, self.unsorted, self.result):
            tensor.fill_(float("nan"))
        self.received.fill_(-1)
        self.returned.fill_(-1)

    def outcome(self) -> Outcome:
        """What the last step produced, copied to the host (after it is done)."""
        def host(tensor) -> np.ndarray:
            # numpy has no bfloat16 of its own: the bits travel as int16 and are viewed.
            if tensor.dtype == self.torch.bfloat16:
                return tensor.view(self.torch.int16).cpu().numpy().view(
                    to_numpy_dtype("bfloat16"))
            return tensor.cpu().numpy()

        received_splits = self.received.cpu().numpy()
        rows = min(max(int(received_splits.sum()) // self.layer.hidden, 0), len(self.inbox))
        return Outcome(received=host(self.inbox[:rows]), received_splits=received_splits,
                       returned_splits=self.returned.cpu().numpy(),
                       result=host(self.result))

    def check(self, run, seed: int, number: int, weights: np.ndarray,
              expected: Expected | None = None) -> dict[str, int]:
        """Step ``number``'s tokens in, outputs poisoned, ``run()`` (the step or a replay
        of its graph), waited for: wrong elements per part against ``expected`` (the
        reference, computed here when not given)."""
        layer = self.layer
        self.poison()
        tokens = make_tokens(seed, self.rank, number, layer.tokens, layer.hidden, layer.dtype)
        if layer.dtype == "bfloat16":
            self.tokens.view(self.torch.int16).copy_(self.torch.from_numpy(
                tokens.view(np.int16)))
        else:
            self.tokens.copy_(self.torch.from_numpy(tokens))
        run()
        self.exchange.synchronize()
        if expected is None:
            expected = reference(layer, weights, seed, number, self.rank)
        return compare(expected, self.outcome())


def _nccl_for_checks(group, torch):
    """``(torch.distributed, None)`` once NCCL runs over the MPI world, else ``(None,
    why not)``: on every rank alike (the sibling example's ``start_nccl``; this folder is
    on sys.path when an example runs as a script)."""
    from torch_grad_allreduce_graph import start_nccl

    return start_nccl(group, torch)


def _nccl_wrong(torch, dist, step: GpuStep, expected: Expected) -> int:
    """NCCL's dispatch of the same sorted tokens and its combine of the same expert outputs,
    with the reference's splits (in rows), against ipcshare's: wrong elements."""
    hidden = step.layer.hidden
    receive_rows = [int(c) // hidden for c in expected.received_splits]
    send_rows = [int(c) // hidden for c in expected.sent_splits]
    total = sum(receive_rows)
    inbox = torch.empty_like(step.inbox[:total])
    dist.all_to_all_single(inbox, step.permuted, receive_rows, send_rows)
    back = torch.empty_like(step.back)
    dist.all_to_all_single(back, step.expert_out[:total], send_rows, receive_rows)
    return (bits_differ(torch, inbox, step.inbox[:total])
            + bits_differ(torch, back, step.back))


def bits_differ(torch, got, want) -> int:
    """Elements of two tensors of one shape and type whose bits differ (on the device)."""
    same_size_int = {2: torch.int16, 4: torch.int32, 8: torch.int64}[got.element_size()]
    return int((got.view(same_size_int) != want.view(same_size_int)).sum().item())


def _time_step(torch, stream, run, iters: int, comm_world) -> float:
    """Microseconds per step of ``iters`` back-to-back runs, the slowest rank's."""
    run()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    stream.synchronize()
    comm_world.Barrier()
    start.record(stream)
    for _ in range(iters):
        run()
    end.record(stream)
    end.synchronize()
    return max(comm_world.allgather(start.elapsed_time(end) * 1e3 / iters))


def import_torch():
    """torch, with CUDA.

    Raises:
        Refused: torch is missing.
    """
    try:
        import torch
    except ImportError:
        raise Refused("the GPU version of this example uses torch, which is not importable "
                      "here: pip install torch, or run it with --backend host") from None
    return torch


def step_communicator(group, layer: Layer):
    """The communicator a GPU step binds (``LibraryExchange``): its calls up to the
    worst-case inbox, its heap holding the tensors the step moves. Collective."""
    # Slack for the heap's alignment of each of the six blocks.
    return group.communicator(max_bytes=layer.max_bytes,
                              heap_bytes=layer.exchanged_bytes + (6 << 20))


def run_on_gpus(group, layer: Layer, steps: int, iters: int, seed: int,
                timed: list | None = None) -> tuple[bool, str]:
    """Eager steps, then ``steps`` replays of one CUDA graph of the step with new tokens,
    every one checked; then the step timed eager and replayed.

    Raises:
        Refused: torch is missing.
    """
    torch = import_torch()
    torch.cuda.set_device(group.backend.device)
    comm_world = group.world.comm
    weights = router_weights(seed, layer.hidden, layer.experts)
    dist, no_nccl = _nccl_for_checks(group, torch)
    wrong = nccl_wrong = 0
    problems: list[str] = []
    try:
        stream = torch.cuda.Stream()
        with step_communicator(group, layer) as comm, torch.cuda.stream(stream):
            step = GpuStep(torch, layer, weights, LibraryExchange(torch, comm, stream))
            graph = torch.cuda.CUDAGraph()

            def checked(number: int, run, what: str) -> None:
                nonlocal wrong, nccl_wrong
                expected = reference(layer, weights, seed, number, group.rank)
                parts = step.check(run, seed, number, weights, expected)
                if dist is not None:
                    parts["NCCL comparison"] = _nccl_wrong(torch, dist, step, expected)
                    nccl_wrong += parts["NCCL comparison"]
                if sum(parts.values()):
                    wrong += sum(parts.values())
                    problems.append(f"step {number} ({what}): {describe_wrong(parts)}")

            # Eager steps first: checked, and the warm-up torch asks for before a capture.
            for number in range(EAGER_STEPS):
                checked(number, step, "eager")
            with torch.cuda.graph(graph, stream=stream):
                step()
            for number in range(EAGER_STEPS, EAGER_STEPS + steps):
                checked(number, graph.replay, "graph replay")
            eager_us = _time_step(torch, stream, step, iters, comm_world)
            graph_us = _time_step(torch, stream, graph.replay, iters, comm_world)
            comm.synchronize(stream)
            del graph
    finally:
        if dist is not None:
            dist.destroy_process_group()
    total = settle(group, wrong, problems, "moe_dispatch.py")
    total_nccl = sum(comm_world.allgather(nccl_wrong))
    against = ("the local reference and NCCL (torch.distributed all_to_all_single)"
               if dist is not None else f"the local reference (NCCL comparison skipped: "
                                        f"{no_nccl})")
    verdict = (f"verified bit for bit against {against}" if total == 0 else
               f"MISMATCH against {against} (#wrong {total} over all ranks, "
               f"{total_nccl} of them against NCCL)")
    if timed is not None:   # (mode, microseconds per step, the slowest rank's), #wrong
        timed += [("eager", eager_us, total), ("graph", graph_us, total)]
    return total == 0, (f"{_title(layer, group.backend_name)}: {EAGER_STEPS} eager steps and "
                        f"{steps} CUDA graph replays {verdict}; per step, this example's "
                        f"timing (not a benchmark): eager {eager_us:.1f} us, CUDA graph "
                        f"{graph_us:.1f} us")


# -- flags: this example's and the benchmark's ------------------------------------------------

def add_layer_flags(parser: argparse.ArgumentParser) -> None:
    """The layer's flags (shape, routing, type, seed, backend)."""
    parser.add_argument("--tokens", type=int, default=2048, help="tokens per rank")
    parser.add_argument("--hidden", type=int, default=256, help="features per token")
    parser.add_argument("--experts", type=int, default=None,
                        help="experts in all, a multiple of the ranks (default: 2 per rank)")
    parser.add_argument("--topk", type=int, default=1,
                        help="experts each token goes to (its K best)")
    parser.add_argument("--dtype", default="float32", choices=DTYPES,
                        help="the tokens' type (bfloat16: --topk at most "
                             f"{max_topk('bfloat16')}, for exact sums)")
    parser.add_argument("--seed", type=int, default=0, help="seeds tokens and router")
    parser.add_argument("--backend", default="auto", choices=BACKENDS,
                        help="host runs the numpy version; auto picks a GPU where there is one")


def check_flags(parser: argparse.ArgumentParser, args: argparse.Namespace,
                minimums: dict[str, int]) -> None:
    """``parser.error`` (one line and exit status 2, on every rank alike: each parses the
    same flags) for a flag under its minimum (``minimums``: flag -> least value) or a
    layer that cannot be checked bit for bit."""
    for flag, low in minimums.items():
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        if value is not None and value < low:
            parser.error(f"{flag} must be at least {low}, got {value}")
    if args.experts is not None and args.experts > MAX_EXPERTS:
        parser.error(f"--experts must be at most {MAX_EXPERTS}, got {args.experts}")
    why = inexact(args.dtype, args.hidden, args.topk)
    if why is not None:
        parser.error(f"{why} (tokens are checked bit for bit)")


LAYER_MINIMUMS = {"--tokens": 1, "--hidden": 1, "--experts": 1, "--topk": 1, "--seed": 0}


def make_layer(group, args: argparse.Namespace) -> Layer:
    """The layer of these flags on ``group``'s ranks.

    Raises:
        Refused: experts the ranks cannot share evenly, or fewer than --topk (on every
            rank alike).
    """
    experts = 2 * group.size if args.experts is None else args.experts
    if experts % group.size:
        raise Refused(f"--experts {experts} is not a multiple of the {group.size} "
                      "ranks: every rank holds as many experts")
    if args.topk > experts:
        raise Refused(f"--topk {args.topk} is more than the {experts} experts")
    return Layer(group.size, args.tokens, args.hidden, experts, args.topk, args.dtype)


def write_timing(path: str, layer: Layer, timed: list, iters: int, exit_status: int) -> None:
    """The step's eager and graph timings (one launch) as a result document: one row each,
    the slowest rank's microseconds per step of ``iters`` back-to-back steps (the checked
    steps' #wrong, eager and replayed together, in each row's details; the exit status
    says whether they passed)."""
    from ipcshare.cli.result_file import write_result
    from ipcshare.runtime.result_document import figure, make_row, new_launch_id

    launch = new_launch_id()
    itemsize = 2 if layer.dtype in ("bfloat16", "float16") else 4
    rows = [make_row(op="moe-step", size=layer.tokens * layer.hidden * itemsize,
                     dtype=layer.dtype, algorithm="auto", mode=mode, world_size=layer.ranks,
                     launch=launch, ours=figure(us), wrong=None,
                     details={"wrong_over_every_checked_step": wrong,
                              "tokens": layer.tokens, "hidden": layer.hidden,
                              "experts": layer.experts, "topk": layer.topk, "iters": iters,
                              "note": "this example's timing; moe_step_bench.py benchmarks "
                                      "the step"})
            for mode, us, wrong in timed]
    write_result(path, tool="examples/moe_dispatch.py", world_size=layer.ranks, rows=rows,
                 exit_status=exit_status, argv=["python", *sys.argv])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_layer_flags(parser)
    parser.add_argument("--steps", type=int, default=4,
                        help="checked steps (on GPUs: CUDA graph replays, after 2 eager ones)")
    parser.add_argument("--iters", type=int, default=20, help="timed steps on GPUs, each way")
    parser.add_argument("--result", metavar="FILE",
                        help="on GPUs, write the step's timing as a result document (rank 0; "
                             "docs/CLI.md; moe_step_bench.py is the benchmark of this step)")
    args = parser.parse_args(argv)
    check_flags(parser, args, {**LAYER_MINIMUMS, "--steps": 1, "--iters": 1})
    try:
        if args.result:   # refused now, not after the run
            from ipcshare.runtime.output_files import check_writable

            check_writable(args.result)
        with ipcshare.Group(backend=args.backend) as group:
            layer = make_layer(group, args)
            timed: list = []
            if group.backend_name == "host":
                ok, line = run_on_host(group, layer, args.steps, args.seed)
            else:
                ok, line = run_on_gpus(group, layer, args.steps, args.iters, args.seed, timed)
            if group.rank == 0:
                print(line, flush=True)
                if args.result and timed:
                    write_timing(args.result, layer, timed, args.iters, 0 if ok else 1)
    except (Refused, IpcShareError) as exc:  # every rank alike: one line each, no hang
        # One write per line: ranks' lines must not interleave.
        sys.stderr.write(f"moe_dispatch.py: error: {exc}\n")
        return 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
