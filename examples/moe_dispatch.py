"""A mixture-of-experts layer's token dispatch and combine across ranks with
``comm.all_to_all_v``, checked bit for bit against a reference every rank computes alone
and, on GPUs, against NCCL (torch.distributed's ``all_to_all_single``).

    mpiexec -n 4 python examples/moe_dispatch.py --backend host     # numpy, no GPU needed
    mpiexec -n 2 python examples/moe_dispatch.py                    # torch, a GPU per rank
        [--tokens T] [--hidden H] [--experts E] [--steps K] [--iters N] [--seed S]
        [--backend auto|host|cuda-ipc|cuda-vmm]

Every rank holds T tokens of H features, seeded by (seed, rank, step). A router (an H x E
matrix seeded by the seed alone, the same on every rank) sends each token to its
top-scoring expert. The E experts are spread over the ranks, E / size each: expert e
lives on rank e // (E / size). One step of the layer:

1. route: sort the tokens by expert (hence by destination rank) and count them per expert;
2. exchange those counts with ``comm.all_to_all``: every rank learns how many tokens each
   rank sends to each of its experts;
3. dispatch: ``comm.all_to_all_v`` sends each rank its experts' tokens;
4. experts: expert e maps a token x to x * (e + 1) + e;
5. combine: ``comm.all_to_all_v`` back, with the dispatch's splits reversed;
6. put the tokens back in their original order.

On host memory (numpy) the splits are host counts made from the exchanged counts. On GPUs
(torch) they never leave the device: the dispatch's ``input_splits`` is a tensor computed
from the routing and its ``output_splits`` a tensor the kernel *fills* with the counts
received; the experts run on a buffer sized for the worst case (every token of every rank)
masked by those counts; the combine takes the filled tensor as its ``input_splits`` and has
its own ``output_splits`` filled, which must equal the dispatch's sends. Nothing in the
step waits for the host, so the whole step is captured in one CUDA graph and replayed with
new tokens, hence new routing and new splits, every replay checked. The step is then timed
eager and as a graph replay: this example's timing on this machine, not a benchmark
(``ipcshare alltoall`` measures the collective itself).

Exact on purpose: tokens are integers in [-8, 8) and the router's weights integers in
[-2, 2], so every score is an integer that float32 adds exactly in any order (TF32
included) while H <= 2^20, and every expert's output is an integer too. Results are
compared bit for bit, not within a tolerance. The reference never calls the library: each
rank makes every rank's tokens from the seed and derives what its experts must receive and
what its own tokens must come back as. Exit status 0 when every check passed on every rank.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import numpy as np

import ipcshare
from ipcshare import IpcShareError
from ipcshare.runtime.config import BACKENDS

# Scores are sums of H products of magnitude <= 16, exact in float32 below 2^24; expert
# outputs have magnitude <= 9 E. Both limits keep every value an exact float32 integer.
MAX_HIDDEN = 1 << 20
MAX_EXPERTS = 1 << 20
EAGER_STEPS = 2   # checked eager steps on GPUs before the capture (they warm it up too)


class Refused(Exception):
    """This job cannot run the example; the message says why, in one line, and every rank
    raises it alike."""


@dataclasses.dataclass(frozen=True)
class Layer:
    """The layer's shape: ``tokens`` of ``hidden`` float32 per rank, ``experts`` spread
    over ``ranks``."""

    ranks: int
    tokens: int
    hidden: int
    experts: int

    @property
    def local_experts(self) -> int:
        """Experts per rank: expert e lives on rank e // local_experts."""
        return self.experts // self.ranks

    @property
    def capacity(self) -> int:
        """Tokens a rank can receive at most: every token of every rank."""
        return self.ranks * self.tokens

    @property
    def max_bytes(self) -> int:
        """The communicator's largest call: the worst-case inbox (the combine's input) or
        the count exchange (an int64 per expert), whichever is larger."""
        return max(self.capacity * self.hidden * 4, self.experts * 8)


@dataclasses.dataclass
class Outcome:
    """What a step produced on one rank: the rows its experts received (in arrival order),
    the elements received from and returned by each rank, and its tokens after the layer."""

    received: np.ndarray
    received_splits: np.ndarray
    returned_splits: np.ndarray
    result: np.ndarray


# -- the model and the reference (numpy; no library call) ---------------------------------

def make_tokens(seed: int, rank: int, step: int, tokens: int, hidden: int) -> np.ndarray:
    """Rank ``rank``'s tokens at ``step``: integers in [-8, 8) as float32."""
    rng = np.random.default_rng([seed, rank, step])
    return rng.integers(-8, 8, (tokens, hidden)).astype(np.float32)


def router_weights(seed: int, hidden: int, experts: int) -> np.ndarray:
    """The router's matrix, the same on every rank: integers in [-2, 2] as float32."""
    rng = np.random.default_rng([seed, 1 << 30])   # a stream no rank's tokens use
    return rng.integers(-2, 3, (hidden, experts)).astype(np.float32)


def route(tokens: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Each token's expert: the highest score, the lowest expert among equal scores."""
    experts = weights.shape[1]
    scores = (tokens.astype(np.float64) @ weights.astype(np.float64)).astype(np.int64)
    # Unique keys: no argmax depends on how ties are broken (the GPU path uses the same).
    keys = scores * experts + np.arange(experts - 1, -1, -1)
    return np.argmax(keys, axis=1)


def apply_experts(rows: np.ndarray, experts: np.ndarray) -> np.ndarray:
    """Row i through expert ``experts[i]``: x * (e + 1) + e, exact in float32."""
    e = experts.astype(np.float32)[:, None]
    return rows * (e + 1) + e


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
    expert's in q's token order; and this rank's tokens through their experts in place."""
    per_rank = layer.local_experts
    mine = range(rank * per_rank, (rank + 1) * per_rank)
    parts, received = [], []
    for q in range(layer.ranks):
        tokens = make_tokens(seed, q, step, layer.tokens, layer.hidden)
        experts = route(tokens, weights)
        rows = [tokens[np.flatnonzero(experts == e)] for e in mine]
        parts += rows
        received.append(sum(len(r) for r in rows) * layer.hidden)
        if q == rank:
            own_tokens, own_experts = tokens, experts
    sent = [np.count_nonzero(own_experts // per_rank == q) * layer.hidden
            for q in range(layer.ranks)]
    return Expected(received=np.concatenate(parts) if parts else
                    np.zeros((0, layer.hidden), np.float32),
                    received_splits=np.array(received, np.int64),
                    sent_splits=np.array(sent, np.int64),
                    result=apply_experts(own_tokens, own_experts))


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


def _settle(group, wrong: int, problems: list[str], script: str) -> int:
    """This rank's problems on stderr (one line each), then every rank's count summed."""
    for line in problems:
        sys.stderr.write(f"{script}: rank {group.rank}: {line}\n")
    return sum(group.world.comm.allgather(wrong))


# -- on host memory: numpy ------------------------------------------------------------------

def host_step(comm, layer: Layer, tokens: np.ndarray, weights: np.ndarray) -> Outcome:
    """One step of the layer on numpy arrays."""
    n, per_rank, hidden = layer.ranks, layer.local_experts, layer.hidden
    experts = route(tokens, weights)
    order = np.argsort(experts, kind="stable")   # by expert, so by destination rank
    permuted = tokens[order]
    counts = np.bincount(experts, minlength=layer.experts).astype(np.int64)
    # Block q of counts_in came from rank q: its tokens for each of this rank's experts.
    counts_in = np.empty_like(counts)
    comm.all_to_all(counts_in, counts)
    sends = counts.reshape(n, per_rank).sum(axis=1) * hidden
    receives = counts_in.reshape(n, per_rank).sum(axis=1) * hidden
    inbox = np.empty((int(receives.sum()) // hidden, hidden), np.float32)
    comm.all_to_all_v(inbox, permuted, receives, sends)
    # Rank q's rows arrive grouped by expert, in the order of counts_in's block q.
    local = np.repeat(np.tile(np.arange(per_rank), n), counts_in)
    expert_out = apply_experts(inbox, comm.rank * per_rank + local)
    back = np.empty_like(permuted)
    comm.all_to_all_v(back, expert_out, sends, receives)
    result = np.empty_like(tokens)
    result[order] = back
    return Outcome(received=inbox, received_splits=receives, returned_splits=sends,
                   result=result)


def run_on_host(group, layer: Layer, steps: int, seed: int) -> tuple[bool, str]:
    """``steps`` steps with new tokens each, checked against the reference."""
    weights = router_weights(seed, layer.hidden, layer.experts)
    wrong, problems = 0, []
    with group.communicator(max_bytes=layer.max_bytes, heap_bytes=0) as comm:
        for step in range(steps):
            tokens = make_tokens(seed, group.rank, step, layer.tokens, layer.hidden)
            outcome = host_step(comm, layer, tokens, weights)
            parts = compare(reference(layer, weights, seed, step, group.rank), outcome)
            if sum(parts.values()):
                wrong += sum(parts.values())
                problems.append(f"step {step}: {describe_wrong(parts)}")
    total = _settle(group, wrong, problems, "moe_dispatch.py")
    verdict = ("verified bit for bit against the local reference" if total == 0 else
               f"MISMATCH against the local reference (#wrong {total} over all ranks)")
    return total == 0, f"{_title(layer, 'host')}: {steps} steps {verdict}"


def _title(layer: Layer, backend: str) -> str:
    return (f"MoE dispatch and combine of {layer.tokens} tokens x {layer.hidden} float32 "
            f"per rank, {layer.experts} experts on {layer.ranks} rank(s) ({backend})")


# -- on GPUs: torch, splits on the device, one CUDA graph -----------------------------------

class GpuStep:
    """One step of the layer on this rank's GPU, on fixed tensors (so a CUDA graph of it
    replays with whatever ``tokens`` holds), every collective bound once on ``stream``."""

    def __init__(self, torch, comm, layer: Layer, weights: np.ndarray, stream) -> None:
        self.torch, self.layer, self.rank = torch, layer, comm.rank
        device = torch.device("cuda", torch.cuda.current_device())
        t, h, cap = layer.tokens, layer.hidden, layer.capacity

        def zeros(*shape, dtype=torch.float32):
            return torch.zeros(shape, dtype=dtype, device=device)

        self.weights = torch.from_numpy(weights).to(device)
        self.tie_break = torch.arange(layer.experts - 1, -1, -1, device=device)
        self.positions = torch.arange(t, device=device)
        self.rows = torch.arange(cap, device=device)
        self.ones = torch.ones(t, dtype=torch.int64, device=device)
        self.zero = zeros()
        self.tokens = zeros(t, h)                        # the step's input
        self.order = zeros(t, dtype=torch.int64)         # position in permuted -> token
        self.permuted = zeros(t, h)                      # tokens sorted by expert
        self.counts = zeros(layer.experts, dtype=torch.int64)      # tokens per expert
        self.counts_in = zeros(layer.experts, dtype=torch.int64)   # block q: from rank q
        self.sends = zeros(layer.ranks, dtype=torch.int64)         # dispatch input_splits
        self.received = zeros(layer.ranks, dtype=torch.int64)      # filled by the dispatch
        self.inbox = zeros(cap, h)                       # the experts' tokens, worst case
        self.expert_out = zeros(cap, h)
        self.returned = zeros(layer.ranks, dtype=torch.int64)      # filled by the combine
        self.back = zeros(t, h)                          # in permuted order
        self.result = zeros(t, h)                        # in the tokens' order
        # Bound once, collectively and in this order on every rank: each call is then one
        # kernel launch, which a CUDA graph captures; device splits are read at run time.
        self._exchange_counts = comm.bind("all_to_all", self.counts_in, self.counts,
                                          stream=stream)
        self._dispatch = comm.bind("all_to_all_v", self.inbox.view(-1),
                                   self.permuted.view(-1), self.received, self.sends,
                                   stream=stream)
        self._combine = comm.bind("all_to_all_v", self.back.view(-1),
                                  self.expert_out.view(-1), self.returned, self.received,
                                  stream=stream)

    def __call__(self) -> None:
        """Enqueue one step on the current stream (the bound one): no host synchronisation."""
        torch, layer = self.torch, self.layer
        per_rank, hidden = layer.local_experts, layer.hidden
        # Route: integer scores (exact in float32), unique keys as in route().
        scores = torch.matmul(self.tokens, self.weights)
        expert = (scores.long() * layer.experts + self.tie_break).argmax(dim=1)
        # Sort by expert, ties in token order (unique keys: any sort gives this order).
        self.order.copy_(torch.argsort(expert * layer.tokens + self.positions))
        torch.index_select(self.tokens, 0, self.order, out=self.permuted)
        self.counts.zero_()
        self.counts.scatter_add_(0, expert, self.ones)
        torch.sum(self.counts.view(layer.ranks, per_rank), dim=1, out=self.sends)
        self.sends.mul_(hidden)   # splits count elements: a token is `hidden` of them
        self._exchange_counts()
        self._dispatch()          # fills self.received
        # Experts on the worst-case buffer, masked by the counts received: row i is valid
        # below the total, and its expert follows from the exchanged counts per expert.
        valid = self.rows < self.received.sum() // hidden
        segment = torch.searchsorted(torch.cumsum(self.counts_in, 0), self.rows, right=True)
        e = (segment % per_rank + self.rank * per_rank).to(torch.float32)[:, None]
        torch.where(valid[:, None], self.inbox * (e + 1) + e, self.zero, out=self.expert_out)
        self._combine()           # input_splits: self.received; fills self.returned
        self.result.index_copy_(0, self.order, self.back)

    def poison(self) -> None:
        """Outputs set to values no step writes, so anything a step leaves out shows."""
        for tensor in (self.inbox, self.back, self.result):
            tensor.fill_(float("nan"))
        self.received.fill_(-1)
        self.returned.fill_(-1)

    def outcome(self) -> Outcome:
        """What the last step produced, copied to the host (after it is done)."""
        received_splits = self.received.cpu().numpy()
        rows = min(max(int(received_splits.sum()) // self.layer.hidden, 0), len(self.inbox))
        return Outcome(received=self.inbox[:rows].cpu().numpy(),
                       received_splits=received_splits,
                       returned_splits=self.returned.cpu().numpy(),
                       result=self.result.cpu().numpy())


def _nccl_for_checks(group, torch):
    """``(torch.distributed, None)`` once NCCL runs over the MPI world, else ``(None,
    why not)``: on every rank alike (the sibling example's ``start_nccl``; this folder is
    on sys.path when an example runs as a script)."""
    from torch_grad_allreduce_graph import start_nccl

    return start_nccl(group, torch)


def _nccl_wrong(torch, dist, step: GpuStep, expected: Expected) -> int:
    """NCCL's dispatch of the same sorted tokens and its combine of the same expert outputs,
    with the reference's splits (in tokens), against ipcshare's: wrong elements."""
    hidden = step.layer.hidden
    receive_rows = [int(c) // hidden for c in expected.received_splits]
    send_rows = [int(c) // hidden for c in expected.sent_splits]
    total = sum(receive_rows)
    inbox = torch.empty_like(step.inbox[:total])
    dist.all_to_all_single(inbox, step.permuted, receive_rows, send_rows)
    back = torch.empty_like(step.back)
    dist.all_to_all_single(back, step.expert_out[:total], send_rows, receive_rows)
    torch.cuda.synchronize()
    return (wrong_elements(inbox.cpu().numpy(), step.inbox[:total].cpu().numpy())
            + wrong_elements(back.cpu().numpy(), step.back.cpu().numpy()))


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


def run_on_gpus(group, layer: Layer, steps: int, iters: int, seed: int) -> tuple[bool, str]:
    """Eager steps, then ``steps`` replays of one CUDA graph of the step with new tokens,
    every one checked; then the step timed eager and replayed.

    Raises:
        Refused: torch is missing.
    """
    try:
        import torch
    except ImportError:
        raise Refused("the GPU version of this example uses torch, which is not importable "
                      "here: pip install torch, or run it with --backend host") from None
    torch.cuda.set_device(group.backend.device)
    comm_world = group.world.comm
    weights = router_weights(seed, layer.hidden, layer.experts)
    dist, no_nccl = _nccl_for_checks(group, torch)
    wrong = nccl_wrong = 0
    problems: list[str] = []
    try:
        stream = torch.cuda.Stream()
        with group.communicator(max_bytes=layer.max_bytes, heap_bytes=0) as comm, \
                torch.cuda.stream(stream):
            step = GpuStep(torch, comm, layer, weights, stream)
            graph = torch.cuda.CUDAGraph()

            def checked(number: int, run, what: str) -> None:
                nonlocal wrong, nccl_wrong
                step.poison()
                step.tokens.copy_(torch.from_numpy(
                    make_tokens(seed, group.rank, number, layer.tokens, layer.hidden)))
                run()
                comm.synchronize(stream)   # raises what a kernel recorded, on every rank
                expected = reference(layer, weights, seed, number, group.rank)
                parts = compare(expected, step.outcome())
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
    total = _settle(group, wrong, problems, "moe_dispatch.py")
    total_nccl = sum(comm_world.allgather(nccl_wrong))
    against = ("the local reference and NCCL (torch.distributed all_to_all_single)"
               if dist is not None else f"the local reference (NCCL comparison skipped: "
                                        f"{no_nccl})")
    verdict = (f"verified bit for bit against {against}" if total == 0 else
               f"MISMATCH against {against} (#wrong {total} over all ranks, "
               f"{total_nccl} of them against NCCL)")
    return total == 0, (f"{_title(layer, group.backend_name)}: {EAGER_STEPS} eager steps and "
                        f"{steps} CUDA graph replays {verdict}; per step, this example's "
                        f"timing (not a benchmark): eager {eager_us:.1f} us, CUDA graph "
                        f"{graph_us:.1f} us")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048, help="tokens per rank")
    parser.add_argument("--hidden", type=int, default=256, help="float32 features per token")
    parser.add_argument("--experts", type=int, default=None,
                        help="experts in all, a multiple of the ranks (default: 2 per rank)")
    parser.add_argument("--steps", type=int, default=4,
                        help="checked steps (on GPUs: CUDA graph replays, after 2 eager ones)")
    parser.add_argument("--iters", type=int, default=20, help="timed steps on GPUs, each way")
    parser.add_argument("--seed", type=int, default=0, help="seeds tokens and router")
    parser.add_argument("--backend", default="auto", choices=BACKENDS,
                        help="host runs the numpy version; auto picks a GPU where there is one")
    args = parser.parse_args(argv)
    for flag, value, low, high in (("--tokens", args.tokens, 1, None),
                                   ("--hidden", args.hidden, 1, MAX_HIDDEN),
                                   ("--experts", args.experts, 1, MAX_EXPERTS),
                                   ("--steps", args.steps, 1, None),
                                   ("--iters", args.iters, 1, None),
                                   ("--seed", args.seed, 0, None)):
        if value is not None and value < low:
            parser.error(f"{flag} must be at least {low}, got {value}")
        if value is not None and high is not None and value > high:
            parser.error(f"{flag} must be at most {high} (exact float32 arithmetic), "
                         f"got {value}")
    try:
        with ipcshare.Group(backend=args.backend) as group:
            experts = 2 * group.size if args.experts is None else args.experts
            if experts % group.size:
                raise Refused(f"--experts {experts} is not a multiple of the {group.size} "
                              "ranks: every rank holds as many experts")
            layer = Layer(group.size, args.tokens, args.hidden, experts)
            if group.backend_name == "host":
                ok, line = run_on_host(group, layer, args.steps, args.seed)
            else:
                ok, line = run_on_gpus(group, layer, args.steps, args.iters, args.seed)
            if group.rank == 0:
                print(line, flush=True)
    except (Refused, IpcShareError) as exc:  # every rank alike: one line each, no hang
        # One write per line: ranks' lines must not interleave.
        sys.stderr.write(f"moe_dispatch.py: error: {exc}\n")
        return 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
