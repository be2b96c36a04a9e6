"""All-to-all and all-to-all-v on GPUs, on torch tensors: every byte against a reference
built from every rank's seeded input, every dtype, odd counts, even / random / skewed /
all-but-one-zero splits, in and out of place, arrays from empty() and registered ones,
splits from the host and from device arrays (the counts received filled on the device),
bound calls and CUDA graphs replayed with new data and new device splits, and splits that
do not match: the same one-line error on every rank, after which the communicator goes on.
Every test runs each GPU algorithm (pull, balanced, ll, ll128 and push, all-to-all and
all-to-all-v; copy-engine for all_to_all with even splits; all-to-all-v in place is
refused by all);
arrays that start off a 16-byte boundary and all-to-one splits reach balanced's shifted
copies and its cutting by bytes. ll and ll128 also: the largest block their slots take
and the first they do not (all-to-all: refused on the host; all-to-all-v: found by every
rank on the GPU, output untouched; the communicator goes on both ways), graphs of several
LL calls replayed with new data and new device splits, ranks that disagree (output
untouched, in place too); ll's silent peer is test_gpu_communicator.py's. copy-engine
also: an input of the communicator's whole max_bytes, calls right after other
algorithms' calls that read their staging areas (and before them), and ranks that
disagree (found on every rank). push also: small tiles into reachable outputs and
inboxes, and (all-to-all-v) a receiver out of reach that would get more than its inbox
holds, found by every rank.
Run under mpiexec with one GPU per rank (or GPUs shared under MPS)."""

from __future__ import annotations

import numpy as np
import pytest

from ipcshare.collectives.algorithms.gpu_all_to_all_ll import all_to_all_v_block_capacity
from ipcshare.collectives.algorithms.gpu_ll128 import all_to_all_v_ll128_capacity
from ipcshare.collectives.scratch import LL128_MAX_BYTES, LL_MAX_BYTES, ScratchLayout
from ipcshare.patterns.alltoall import split_matrix
from ipcshare.runtime.errors import CollectiveError

from .refusals import assert_refused
from .torch_communicator import torch_communicator

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu, pytest.mark.mpi]

_TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "int32": torch.int32, "uint8": torch.uint8, "int64": torch.int64}
_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "int32": 4, "uint8": 1, "int64": 8}
# Elements each rank sends each rank (all-to-all), or each rank's input (all-to-all-v).
BLOCKS = (1, 3, 4099, 65_537)
LARGEST_INPUT_BYTES = 65_537 * 8
# The GPU algorithms of all_to_all, and those of all_to_all_v (algorithms/__init__.py).
ALGOS = ("pull", "balanced", "ll", "copy-engine", "push", "eager", "ll128")
V_ALGOS = ("pull", "balanced", "ll", "push", "eager", "ll128")
# The algorithms no peer of which reads an input: nothing is ever copied in, in place too.
NOTHING_STAGED = ("ll", "copy-engine", "push", "ll128")
# The low-latency all-to-alls and the most bytes their slots take from one rank (the
# communicator's max_bytes, at most this).
SLOT_LIMIT = {"ll": LL_MAX_BYTES, "ll128": LL128_MAX_BYTES}


@pytest.fixture(params=ALGOS)
def algo(request):
    return request.param


def _needs_v(algo: str) -> None:
    if algo not in V_ALGOS:
        pytest.skip(f"algo {algo!r} runs all_to_all (even splits) only: no all_to_all_v of "
                    "it is built")


# The algorithms that run all_to_all (eager runs all_to_all_v alone).
EVEN_ALGOS = tuple(algo for algo in ALGOS if algo != "eager")


def _needs_even(algo: str) -> None:
    if algo not in EVEN_ALGOS:
        pytest.skip(f"algo {algo!r} runs all_to_all_v only: no all_to_all of it is built")


@pytest.fixture(scope="module")
def shared():
    # A rank's largest input: the ranks times the largest block of the largest dtype.
    with torch_communicator("cuda-vmm", 4 << 20,
                            per_rank_bytes=LARGEST_INPUT_BYTES) as (group, comm, stream):
        yield group, comm, stream


@pytest.fixture
def setup(shared):
    group, comm, _stream = shared
    if group.time_sliced_gpus:  # the refusal is tested below
        pytest.skip("ranks here take turns on a GPU (no MPS): the all-to-all kernels spin "
                    "on their peers and are refused")
    return shared


def test_ranks_taking_turns_on_a_gpu_are_refused_on_every_rank_in_one_line(shared, algo):
    group, comm, _stream = shared
    if not group.time_sliced_gpus:
        pytest.skip("every rank here runs its kernels at once (a GPU each, or MPS)")
    n, device = comm.size, group.backend.device
    array = torch.zeros(4 * n, dtype=torch.float32, device=f"cuda:{device}")
    calls = [lambda: comm.all_to_all_v(torch.zeros_like(array), array, [4] * n, [4] * n,
                                       algo=algo)]
    if algo in EVEN_ALGOS:
        calls.append(lambda: comm.all_to_all(torch.zeros_like(array), array, algo=algo))
    for call in calls:
        with pytest.raises(CollectiveError, match=r"ranks of this group take turns on a GPU "
                                                  r".*nvidia-cuda-mps-control -d"):
            call()
    comm.all_reduce(array)   # the communicator still works
    comm.synchronize()


def _bytes(seed: int, rank: int, nbytes: int) -> np.ndarray:
    return np.random.default_rng([seed, rank]).integers(0, 256, nbytes, dtype=np.uint8)


def _tensor(data: np.ndarray, dtype: str, device: int) -> torch.Tensor:
    """The exact bytes of ``data`` as a CUDA tensor of ``dtype``."""
    if not data.nbytes:
        # torch gives an empty array from numpy a stride of 0, which no view to a wider
        # type accepts (the count-0 cases failed on that, not on the library).
        return torch.empty(0, dtype=_TORCH[dtype], device=f"cuda:{device}")
    return torch.from_numpy(data.copy()).to(f"cuda:{device}").view(_TORCH[dtype])


def _host_bytes(tensor: torch.Tensor) -> np.ndarray:
    return tensor.contiguous().view(torch.uint8).cpu().numpy()


def _expected(m: np.ndarray, inputs: list[np.ndarray], me: int, itemsize: int) -> np.ndarray:
    """What rank ``me`` receives, packed in rank order: from each rank q the ``m[q, me]``
    elements that follow those q sends to lower ranks."""
    parts = []
    for q, data in enumerate(inputs):
        start = int(m[q, :me].sum()) * itemsize
        parts.append(data[start:start + int(m[q, me]) * itemsize])
    return np.concatenate(parts) if parts else np.zeros(0, np.uint8)


def _matrix(kind: str, count: int, n: int) -> np.ndarray:
    """``m[r, q]``: elements rank r sends rank q, every row adding up to ``count``."""
    if kind == "all-but-one-zero":   # every rank sends all it has to the next rank
        m = np.zeros((n, n), np.int64)
        for r in range(n):
            m[r, (r + 1) % n] = count
        return m
    if kind == "all-to-one":         # every rank sends all it has to the last rank
        m = np.zeros((n, n), np.int64)
        m[:, n - 1] = count
        return m
    return split_matrix(kind, count, n)


@pytest.mark.parametrize("dtype", sorted(_TORCH))
@pytest.mark.parametrize("block", BLOCKS)
def test_all_to_all_moves_every_block(setup, algo, dtype, block):
    _needs_even(algo)
    group, comm, _stream = setup
    n, me, device, item = comm.size, comm.rank, group.backend.device, _ITEMSIZE[dtype]
    inputs = [_bytes(block, r, n * block * item) for r in range(n)]
    want = np.concatenate([inputs[q][me * block * item:(me + 1) * block * item]
                           for q in range(n)])
    source = _tensor(inputs[me], dtype, device)
    out = torch.zeros_like(source)
    assert comm.all_to_all(out, source, algo=algo) is out
    comm.synchronize()
    assert np.array_equal(_host_bytes(out), want)
    assert np.array_equal(_host_bytes(source), inputs[me])    # the input is left alone
    comm.all_to_all(source, source, algo=algo)                 # in place
    comm.synchronize()
    assert np.array_equal(_host_bytes(source), want)


def test_arrays_from_empty_and_registered_ones_are_read_in_place(setup, algo):
    _needs_even(algo)
    group, comm, _stream = setup
    n, me, block = comm.size, comm.rank, 10_007
    inputs = [_bytes(7, r, n * block * 4) for r in range(n)]
    want = np.concatenate([inputs[q][me * block * 4:(me + 1) * block * 4] for q in range(n)])
    array = torch.from_dlpack(comm.empty((n * block,), "float32"))
    registered = torch.zeros(n * block, dtype=torch.float32,
                             device=f"cuda:{group.backend.device}")
    comm.register(registered)
    try:
        for source in (array, registered):
            out = torch.zeros_like(source)
            for call in range(3):  # the user rewrites the input between calls
                data = [_bytes(100 + call, r, n * block * 4) for r in range(n)]
                source.copy_(_tensor(data[me], "float32", group.backend.device))
                before = comm.copies_in
                comm.all_to_all(out, source, algo=algo)
                comm.synchronize()
                assert comm.copies_in == before    # peers read it where it lies
                expect = np.concatenate([data[q][me * block * 4:(me + 1) * block * 4]
                                         for q in range(n)])
                assert np.array_equal(_host_bytes(out), expect), call
            # In place on memory peers read in place: staged first, and still right (ll,
            # copy-engine: no peer reads an input, so nothing is staged).
            source.copy_(_tensor(inputs[me], "float32", group.backend.device))
            before = comm.copies_in
            comm.all_to_all(source, source, algo=algo)
            comm.synchronize()
            assert comm.copies_in == before + (0 if algo in NOTHING_STAGED else 1)
            assert np.array_equal(_host_bytes(source), want)
    finally:
        comm.unregister(registered)


@pytest.mark.parametrize("kind", ["even", "random", "skewed", "all-but-one-zero",
                                  "all-to-one"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "uint8", "int64"])
@pytest.mark.parametrize("count", [0, 5, 4099, 65_537])
def test_all_to_all_v_with_host_splits(setup, algo, kind, dtype, count):
    _needs_v(algo)
    group, comm, _stream = setup
    n, me, device, item = comm.size, comm.rank, group.backend.device, _ITEMSIZE[dtype]
    m = _matrix(kind, count, n)
    inputs = [_bytes(count + 3, r, count * item) for r in range(n)]
    want = _expected(m, inputs, me, item)
    capacity = int(m.sum(axis=0).max()) + 3   # room past what comes: left untouched
    source = _tensor(inputs[me], dtype, device)
    out = torch.full((capacity * item,), 0xA5, dtype=torch.uint8,
                     device=f"cuda:{device}").view(_TORCH[dtype])
    comm.all_to_all_v(out, source, m[:, me].tolist(), m[me].tolist(), algo=algo)
    comm.synchronize()
    got = _host_bytes(out)
    assert np.array_equal(got[:want.nbytes], want)
    assert np.all(got[want.nbytes:] == 0xA5)


@pytest.mark.parametrize("splits_dtype", ["int32", "int64"])
def test_device_splits_are_read_on_the_gpu_and_the_received_counts_filled(setup, algo,
                                                                          splits_dtype):
    _needs_v(algo)
    group, comm, _stream = setup
    n, me, device = comm.size, comm.rank, group.backend.device
    count = 30_011
    m = _matrix("random", count, n)
    inputs = [_bytes(41, r, count * 2) for r in range(n)]
    source = _tensor(inputs[me], "float16", device)
    out = torch.zeros(int(m.sum(axis=0).max()), dtype=torch.float16, device=f"cuda:{device}")
    sends = torch.tensor(m[me], dtype=_TORCH[splits_dtype], device=f"cuda:{device}")
    received = torch.full((n,), -1, dtype=_TORCH[splits_dtype], device=f"cuda:{device}")
    comm.all_to_all_v(out, source, received, sends, algo=algo)
    comm.synchronize()
    assert received.cpu().tolist() == m[:, me].tolist()
    want = _expected(m, inputs, me, 2)
    assert np.array_equal(_host_bytes(out)[:want.nbytes], want)
    # Device sends with host receives (checked by the kernel), and the other way round.
    comm.all_to_all_v(out, source, m[:, me].tolist(), sends, algo=algo)
    comm.all_to_all_v(out, source, received, m[me].tolist(), algo=algo)
    comm.synchronize()
    assert np.array_equal(_host_bytes(out)[:want.nbytes], want)


def test_graph_replays_take_new_data_and_new_device_splits(setup, algo):
    """All-to-all-v beside all-to-all in one graph."""
    group, comm, stream = setup
    n, me, device = comm.size, comm.rank, group.backend.device
    with_v = algo in V_ALGOS
    count, block = 20_000, 1_001
    source = torch.zeros(count, dtype=torch.int32, device=f"cuda:{device}")
    out = torch.zeros(count * n, dtype=torch.int32, device=f"cuda:{device}")
    sends = torch.zeros(n, dtype=torch.int64, device=f"cuda:{device}")
    received = torch.zeros(n, dtype=torch.int64, device=f"cuda:{device}")
    even_in = torch.zeros(n * block, dtype=torch.int32, device=f"cuda:{device}")
    even_out = torch.zeros_like(even_in)
    # Bound once outside the capture (agreement and binding), then captured.
    v = comm.bind("all_to_all_v", out, source, received, sends, stream=stream,
                  algo=algo) if with_v else None
    # eager runs all_to_all_v alone: the all-to-all beside it is auto's.
    even = comm.bind("all_to_all", even_out, even_in, stream=stream,
                     algo=algo if algo in EVEN_ALGOS else "auto")
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        if v is not None:
            v()
        even()
    for replay in range(15):
        kind = ("random", "skewed", "all-but-one-zero", "even", "all-to-one")[replay % 5]
        m = _matrix(kind, count - replay, n)
        inputs = [_bytes(500 + replay, r, count * 4) for r in range(n)]
        evens = [_bytes(900 + replay, r, n * block * 4) for r in range(n)]
        source.copy_(_tensor(inputs[me], "int32", device))
        even_in.copy_(_tensor(evens[me], "int32", device))
        sends.copy_(torch.tensor(m[me], dtype=torch.int64))
        stream.synchronize()
        graph.replay()
        comm.synchronize(stream)
        if with_v:
            assert received.cpu().tolist() == m[:, me].tolist(), replay
            want = _expected(m, inputs, me, 4)
            assert np.array_equal(_host_bytes(out)[:want.nbytes], want), replay
        expect = np.concatenate([evens[q][me * block * 4:(me + 1) * block * 4]
                                 for q in range(n)])
        assert np.array_equal(_host_bytes(even_out), expect), replay


def test_splits_that_do_not_match_stop_every_rank_alike_and_the_next_call_runs(setup, algo):
    _needs_v(algo)
    group, comm, _stream = setup
    n, me, device = comm.size, comm.rank, group.backend.device
    count = 4096
    m = _matrix("even", count, n)
    source = _tensor(_bytes(3, me, count * 4), "float32", device)
    out = torch.full((count + 64,), 7.0, dtype=torch.float32, device=f"cuda:{device}")
    # Rank 0 expects one element too many from the last rank (host receives).
    expects = m[:, me].tolist()
    if me == 0:
        expects[n - 1] += 1
    comm.all_to_all_v(out, source, expects, m[me].tolist(), algo=algo)
    with pytest.raises(CollectiveError, match=rf"^all_to_all_v: rank 0's output_splits"
                                              rf"\[{n - 1}\] is not what rank {n - 1} sends"):
        comm.synchronize()
    assert bool(torch.all(out == 7.0))   # no element moved
    # Device sends: the last rank sends a negative count.
    sends = torch.tensor(m[me], dtype=torch.int32, device=f"cuda:{device}")
    if me == n - 1:
        sends[0] = -5
    received = torch.zeros(n, dtype=torch.int32, device=f"cuda:{device}")
    comm.all_to_all_v(out, source, received, sends, algo=algo)
    with pytest.raises(CollectiveError, match=rf"rank {n - 1}'s input_splits\[0\] is negative"):
        comm.synchronize()
    # Device sends past the input, and more than an output holds.
    sends = torch.tensor(m[me], dtype=torch.int32, device=f"cuda:{device}")
    if me == 0:
        sends[0] += count     # rank 0 sends more than it has
    comm.all_to_all_v(out, source, received, sends, algo=algo)
    with pytest.raises(CollectiveError, match=r"rank 0's input_splits add up to more "
                                              r"elements than its input holds"):
        comm.synchronize()
    # Every rank receives as much (even splits): an output one element short on all.
    small = torch.zeros(int(m[:, 0].sum()) - 1, dtype=torch.float32, device=f"cuda:{device}")
    comm.all_to_all_v(small, source, received, torch.tensor(m[me], device=f"cuda:{device}"),
                      algo=algo)
    with pytest.raises(CollectiveError, match=r"rank 0 would receive more elements than its "
                                              r"output holds"):
        comm.synchronize()
    # Still in step: a right call after them, by either algorithm.
    comm.all_to_all_v(out, source, received, torch.tensor(m[me], device=f"cuda:{device}"),
                      algo=algo)
    comm.synchronize()
    assert received.cpu().tolist() == m[:, me].tolist()
    other = V_ALGOS[(V_ALGOS.index(algo) + 1) % len(V_ALGOS)]
    comm.all_to_all_v(out, source, received, torch.tensor(m[me], device=f"cuda:{device}"),
                      algo=other)
    comm.synchronize()
    assert received.cpu().tolist() == m[:, me].tolist()


def test_misuse_is_refused_in_the_call(setup, algo):
    """Every rank misuses the call alike: each raises in it, naming rank 0 and the
    argument (a refused call, collectives/call_marks.py)."""
    group, comm, _stream = setup
    n, device = comm.size, group.backend.device
    array = torch.zeros(4 * n, dtype=torch.float32, device=f"cuda:{device}")
    if algo in V_ALGOS:
        assert_refused(lambda: comm.all_to_all_v(array, array, [4] * n, [4] * n, algo=algo),
                       "rank 0's output .*all_to_all_v in place .* is not run on GPUs")
    assert_refused(lambda: comm.all_to_all_v(torch.zeros_like(array), array, [4] * n,
                                             array[:n]),
                   r"rank 0's input_splits .*input_splits is a float32 array")
    assert_refused(lambda: comm.all_to_all_v(
        torch.zeros_like(array), array,
        torch.zeros(n + 1, dtype=torch.int32, device=f"cuda:{device}"), [4] * n),
        rf"output_splits is an int32 array .* shape \({n},\)")
    if n > 1 and algo in EVEN_ALGOS:
        assert_refused(lambda: comm.all_to_all(torch.zeros(4 * n + 1, device=f"cuda:{device}"),
                                               torch.zeros(4 * n + 1, device=f"cuda:{device}"),
                                               algo=algo),
                       "rank 0's input .*not a multiple of")
    out = torch.zeros_like(array)
    comm.all_to_all_v(out, array + comm.rank, [4] * n, [4] * n)   # still in step
    comm.synchronize()
    assert out.cpu().tolist() == [float(r) for r in range(n) for _ in range(4)]


@pytest.mark.parametrize("dtype", ["uint8", "bfloat16", "float32", "int64"])
@pytest.mark.parametrize("kind", ["even", "random", "skewed", "all-to-one"])
def test_arrays_off_a_16_byte_boundary_move_exactly(setup, algo, dtype, kind):
    """Inputs and outputs that start at odd element offsets of larger tensors, so neither
    they nor the segments in them share a 16-byte alignment: every byte arrives, nothing
    around the output is written (all-to-all, in place too, and all-to-all-v)."""
    if kind != "even":
        _needs_v(algo)
    else:
        _needs_even(algo)
    group, comm, _stream = setup
    n, me, device, item = comm.size, comm.rank, group.backend.device, _ITEMSIZE[dtype]
    count = 3 * 4099 + n           # elements of each rank's input
    m = _matrix(kind, count, n)
    inputs = [_bytes(71, r, count * item) for r in range(n)]
    want = _expected(m, inputs, me, item)
    received = int(m[:, me].sum())
    for lead in (1, 3):            # elements before the arrays in their tensors
        # Slices of uint8 tensors, viewed as dtype: offsets of lead elements.
        held = torch.zeros((count + lead + 5) * item, dtype=torch.uint8,
                           device=f"cuda:{device}")
        held[lead * item:(lead + count) * item] = torch.from_numpy(inputs[me].copy()).to(
            held.device)
        source = held[lead * item:(lead + count) * item].view(_TORCH[dtype])
        width = int(m.sum(axis=0).max())
        space = torch.full(((width + 2 * lead + 3) * item,), 0xA5, dtype=torch.uint8,
                           device=f"cuda:{device}")
        out = space[(lead + 1) * item:(lead + 1 + width) * item].view(_TORCH[dtype])
        if kind == "even":
            block = count // n
            even_source = source[:block * n]
            even_out = out[:block * n]
            comm.all_to_all(even_out, even_source, algo=algo)
            comm.synchronize()
            expect = np.concatenate([inputs[q][me * block * item:(me + 1) * block * item]
                                     for q in range(n)])
            got = _host_bytes(space)
            start = (lead + 1) * item
            assert np.array_equal(got[start:start + expect.nbytes], expect), lead
            assert np.all(got[:start] == 0xA5) and np.all(got[start + expect.nbytes:] == 0xA5)
            comm.all_to_all(even_source, even_source, algo=algo)     # in place
            comm.synchronize()
            assert np.array_equal(_host_bytes(even_source), expect), lead
            continue
        comm.all_to_all_v(out, source, m[:, me].tolist(), m[me].tolist(), algo=algo)
        comm.synchronize()
        got = _host_bytes(space)
        start = (lead + 1) * item
        assert np.array_equal(got[start:start + received * item], want), lead
        assert np.all(got[:start] == 0xA5)
        assert np.all(got[start + received * item:] == 0xA5)   # nothing past the received


@pytest.mark.parametrize("splits", ["even", "random", "skewed"])
def test_each_bench_row_reports_its_busiest_link_bound_and_blocks(setup, algo, splits):
    """The alltoall case's rows on GPUs (what `ipcshare alltoall` and the bench print):
    the busiest link's bytes, the fraction of their time at the link's speed the row
    reached (present, above 0, at most 1), and the blocks its call launched."""
    from ipcshare.patterns import make_pattern
    from ipcshare.patterns.alltoall import busiest_link_bytes
    from ipcshare.patterns.driver import run_pattern
    from ipcshare.runtime.config import merge_options

    if splits != "even":
        _needs_v(algo)
    else:
        _needs_even(algo)
    group, comm, _stream = setup
    if algo == "eager" and comm.size > 2:
        pytest.skip("eager's slots hold max_bytes over the ranks but one, and the case's "
                    "random and skewed calls send more than that to a rank at 3 ranks and up")
    pattern = make_pattern("alltoall", algo, splits=splits, datatype="float32")
    # ll, ll128: blocks up to their slots' limit at any world size (one rank included).
    largest = min(SLOT_LIMIT.get(algo, 4 << 20), 4 << 20)
    options = merge_options({"backend": "cuda-vmm", "algo": algo, "iters": 3, "warmup": 1,
                             "checks": 1, "min_bytes": 4096, "max_bytes": largest,
                             "step_factor": 32})
    try:
        result = run_pattern(group, pattern, options, emit=lambda _line: None)
    finally:
        pattern.close()
    assert result.wrong_total == 0
    n = comm.size
    for row in result.rows:
        m = pattern.split_matrix(pattern.plan(row.size, n, 4), n)
        assert row.facts["busiest_link_bytes"] == busiest_link_bytes(m, 4)
        assert row.facts["blocks"] >= 1
        if n > 1:
            assert 0 < row.facts["bound_fraction"] <= 1, row.facts


# -- ll: what its slots bound, and its one-round-trip protocol -----------------------------

def _even_want(inputs: list[np.ndarray], me: int, block_bytes: int) -> np.ndarray:
    """What rank ``me`` receives from an even all-to-all of ``inputs``."""
    return np.concatenate([data[me * block_bytes:(me + 1) * block_bytes] for data in inputs])


@pytest.mark.parametrize("low", ["ll", "ll128"])
def test_ll_takes_blocks_as_large_as_its_slots_and_refuses_larger_ones_on_every_rank(setup,
                                                                                     low):
    """A block (the bytes a rank sends each rank) of the slots' limit fills a slot to its
    last line and arrives whole, out of place and in place, as does one with a short last
    line; one of 8 bytes more is refused on every rank before anything runs, and the
    communicator goes on with the algorithm and with pull."""
    _group, comm, _stream = setup
    n, me, limit = comm.size, comm.rank, SLOT_LIMIT[low]
    with torch_communicator("cuda-vmm", 0, per_rank_bytes=limit + 8) as (
            group, cm, stream):
        device = group.backend.device
        for block in (limit, limit - 3):
            inputs = [_bytes(block, r, n * block) for r in range(n)]
            source = _tensor(inputs[me], "uint8", device)
            out = torch.zeros_like(source)
            cm.all_to_all(out, source, algo=low, stream=stream)
            cm.synchronize(stream)
            assert np.array_equal(_host_bytes(out), _even_want(inputs, me, block)), block
            cm.all_to_all(source, source, algo=low, stream=stream)   # in place
            cm.synchronize(stream)
            assert np.array_equal(_host_bytes(source), _even_want(inputs, me, block)), block
        large = limit + 8
        source = torch.zeros(n * large, dtype=torch.uint8, device=f"cuda:{device}")
        with pytest.raises(CollectiveError, match=(
                rf"^algo='{low}' cannot run all_to_all of {n * large} uint8 .*: its buffers "
                rf"take blocks \(the bytes a rank sends each rank\) of up to {limit} bytes "
                rf"and this call's are {large} \({n * large} bytes over {n} ranks\)")):
            cm.all_to_all(torch.zeros_like(source), source, algo=low, stream=stream)
        inputs = [_bytes(5, r, n * large) for r in range(n)]
        source.copy_(_tensor(inputs[me], "uint8", device))
        out = torch.zeros_like(source)
        cm.all_to_all(out, source, algo="pull", stream=stream)
        small = torch.arange(4 * n, dtype=torch.int32, device=f"cuda:{device}") + 100 * me
        small_out = torch.zeros_like(small)
        cm.all_to_all(small_out, small, algo=low, stream=stream)
        cm.synchronize(stream)
        assert np.array_equal(_host_bytes(out), _even_want(inputs, me, large))
        assert small_out.cpu().tolist() == [100 * q + 4 * me + k for q in range(n)
                                            for k in range(4)]


def _captured(calls, stream):
    """A CUDA graph of the bound ``calls`` on ``stream``, in order."""
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for call in calls:
            call()
    return graph


@pytest.mark.parametrize("low", ["ll", "ll128"])
def test_ll_graphs_of_several_ll_calls_take_new_data_every_replay(setup, low):
    """Three LL calls per replay (so the buffers' parity changes from replay to replay):
    an all-to-all (ll or ll128), an ll all-reduce sharing its call counter, an in-place
    all-to-all of another dtype and block; 200 replays, new data each, every one
    checked."""
    group, comm, stream = setup
    n, me, device = comm.size, comm.rank, group.backend.device
    small, large = 3, 4099                      # elements of a block
    a_in = torch.zeros(n * small, dtype=torch.int32, device=f"cuda:{device}")
    a_out = torch.zeros_like(a_in)
    b = torch.zeros(n * large, dtype=torch.bfloat16, device=f"cuda:{device}")
    total = torch.zeros(1000, dtype=torch.int32, device=f"cuda:{device}")
    calls = [comm.bind("all_to_all", a_out, a_in, stream=stream, algo=low),
             comm.bind("all_reduce", total, stream=stream, algo="ll"),
             comm.bind("all_to_all", b, b, stream=stream, algo=low)]
    graph = _captured(calls, stream)
    for replay in range(200):
        a_data = [_bytes(1000 + replay, r, n * small * 4) for r in range(n)]
        b_data = [_bytes(3000 + replay, r, n * large * 2) for r in range(n)]
        a_in.copy_(_tensor(a_data[me], "int32", device))
        b.copy_(_tensor(b_data[me], "bfloat16", device))
        total.fill_(replay + me)
        stream.synchronize()
        graph.replay()
        comm.synchronize(stream)
        assert np.array_equal(_host_bytes(a_out), _even_want(a_data, me, small * 4)), replay
        assert np.array_equal(_host_bytes(b), _even_want(b_data, me, large * 2)), replay
        want = n * replay + n * (n - 1) // 2
        assert bool(torch.all(total == want)), replay


def test_push_stores_into_outputs_peers_reach_and_into_inboxes_tile_by_tile(setup,
                                                                           monkeypatch):
    """Tiles of 4 KiB, so every block signals several: outputs from empty() and registered
    ones (the peers store into them), a plain one (into the inbox), and in place on each
    (a rank in place takes its tiles in its inbox, never in its output: a peer's store
    there would overwrite input not yet sent), over calls with new data and a graph
    replayed with new data. Blocks of 10,007 float32 start off 16-byte boundaries."""
    from ipcshare.collectives.algorithms import gpu_all_to_all_push

    monkeypatch.setattr(gpu_all_to_all_push.GpuPushAllToAll, "tile_bytes", 4 << 10)
    group, comm, stream = setup
    n, me, device, block = comm.size, comm.rank, group.backend.device, 10_007
    width = block * 4
    registered = torch.zeros(n * block, dtype=torch.float32, device=f"cuda:{device}")
    comm.register(registered)
    try:
        reached = torch.from_dlpack(comm.empty((n * block,), "float32"))
        plain = torch.zeros(n * block, dtype=torch.float32, device=f"cuda:{device}")
        source = torch.zeros_like(plain)
        for out in (reached, registered, plain):
            for call in range(3):
                data = [_bytes(300 + call, r, n * width) for r in range(n)]
                source.copy_(_tensor(data[me], "float32", device))
                out.fill_(-1.0)
                comm.all_to_all(out, source, algo="push")
                comm.synchronize()
                assert np.array_equal(_host_bytes(out), _even_want(data, me, width)), call
            data = [_bytes(400, r, n * width) for r in range(n)]
            out.copy_(_tensor(data[me], "float32", device))
            comm.all_to_all(out, out, algo="push")                 # in place
            comm.synchronize()
            assert np.array_equal(_host_bytes(out), _even_want(data, me, width))
        bound = comm.bind("all_to_all", reached, source, stream=stream, algo="push")
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            bound()
            bound()      # twice: the second call's stores follow the first's in the graph
        for replay in range(5):
            data = [_bytes(600 + replay, r, n * width) for r in range(n)]
            source.copy_(_tensor(data[me], "float32", device))
            stream.synchronize()
            graph.replay()
            comm.synchronize(stream)
            assert np.array_equal(_host_bytes(reached), _even_want(data, me, width)), replay
    finally:
        comm.unregister(registered)


@pytest.mark.parametrize("algo", ["push", "eager"])
def test_push_all_to_all_v_lands_in_outputs_peers_reach_and_in_inboxes_tile_by_tile(
        setup, monkeypatch, algo):
    """Tiles of 1 KiB, so every block's part has several: outputs from empty() and
    registered ones (push's senders store into them; eager's always into their slots), a
    plain one (into the inbox, copied out tile by tile), random, skewed and all-to-one
    device splits over calls with new data, and a graph replayed with new splits. Counts
    are odd, so segments start anywhere."""
    from ipcshare.collectives.algorithms import gpu_all_to_all_push

    monkeypatch.setattr(gpu_all_to_all_push.GpuPushAllToAllV, "tile_bytes", 1 << 10)
    group, comm, stream = setup
    n, me, device = comm.size, comm.rank, group.backend.device
    count = 100_003
    width = n * count                       # the most any rank receives (all-to-one)
    registered = torch.zeros(width, dtype=torch.float32, device=f"cuda:{device}")
    comm.register(registered)
    try:
        reached = torch.from_dlpack(comm.empty((width,), "float32"))
        plain = torch.zeros(width, dtype=torch.float32, device=f"cuda:{device}")
        source = torch.zeros(count, dtype=torch.float32, device=f"cuda:{device}")
        sends = torch.zeros(n, dtype=torch.int64, device=f"cuda:{device}")
        received = torch.zeros(n, dtype=torch.int64, device=f"cuda:{device}")
        for out in (reached, registered, plain):
            for call, kind in enumerate(("random", "skewed", "all-to-one")):
                m = _matrix(kind, count - call, n)
                data = [_bytes(700 + call, r, count * 4) for r in range(n)]
                source.copy_(_tensor(data[me], "float32", device))
                sends.copy_(torch.tensor(m[me], dtype=torch.int64))
                out.fill_(-1.0)
                comm.all_to_all_v(out, source, received, sends, algo=algo)
                comm.synchronize()
                assert received.cpu().tolist() == m[:, me].tolist(), kind
                want = _expected(m, data, me, 4)
                got = _host_bytes(out)
                assert np.array_equal(got[:want.nbytes], want), kind
                assert np.all(out[want.nbytes // 4:].cpu().numpy() == -1.0), kind
        bound = comm.bind("all_to_all_v", reached, source, received, sends, stream=stream,
                          algo=algo)
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            bound()
        for replay in range(6):
            kind = ("random", "skewed", "all-but-one-zero")[replay % 3]
            m = _matrix(kind, count - 7 * replay, n)
            data = [_bytes(800 + replay, r, count * 4) for r in range(n)]
            source.copy_(_tensor(data[me], "float32", device))
            sends.copy_(torch.tensor(m[me], dtype=torch.int64))
            stream.synchronize()
            graph.replay()
            comm.synchronize(stream)
            want = _expected(m, data, me, 4)
            assert np.array_equal(_host_bytes(reached)[:want.nbytes], want), replay
    finally:
        comm.unregister(registered)


def _all_to_one(cm, device: int, seed: int):
    """Every rank's whole input (the communicator's max_bytes, float32) to the last rank,
    splits on the device: (m, every rank's bytes, source, an output of 7.0 as large as
    all that comes, sends, received)."""
    n, me = cm.size, cm.rank
    count = cm.max_bytes // 4
    m = np.zeros((n, n), np.int64)
    m[:, n - 1] = count
    data = [_bytes(seed, r, count * 4) for r in range(n)]
    source = _tensor(data[me], "float32", device)
    out = torch.full((n * count,), 7.0, dtype=torch.float32, device=f"cuda:{device}")
    sends = torch.tensor(m[me], device=f"cuda:{device}")
    received = torch.zeros(n, dtype=torch.int64, device=f"cuda:{device}")
    return m, data, source, out, sends, received


def test_push_all_to_all_v_past_an_inbox_stops_every_rank_and_a_registered_output_takes_it(
        setup):
    """Every rank sends all its input (max_bytes) to the last rank, whose plain output
    cannot be reached: more than its inbox holds, found by every rank before any byte
    moves; the same call into registered outputs lands in them, and the communicator
    goes on."""
    _group, comm, _stream = setup
    if comm.size < 2:
        pytest.skip("needs 2 ranks")
    with torch_communicator("cuda-vmm", 1 << 20) as (group, cm, stream):
        n, me = cm.size, cm.rank
        m, data, source, out, sends, received = _all_to_one(cm, group.backend.device, 900)
        cm.all_to_all_v(out, source, received, sends, algo="push", stream=stream)
        with pytest.raises(CollectiveError, match=rf"^all_to_all_v: rank {n - 1} would "
                                                  r"receive more bytes than algo='push' can "
                                                  r"land in its window .*Communicator\.register"):
            cm.synchronize(stream)
        assert bool(torch.all(out == 7.0))     # no element moved
        cm.register(out)
        try:
            cm.all_to_all_v(out, source, received, sends, algo="push", stream=stream)
            cm.synchronize(stream)
            assert received.cpu().tolist() == m[:, me].tolist()
            want = _expected(m, data, me, 4)
            assert np.array_equal(_host_bytes(out)[:want.nbytes], want)
        finally:
            cm.unregister(out)


def test_eager_segments_past_a_slot_stop_every_rank_and_the_communicator_goes_on(setup):
    """At 3 ranks and more a slot is the staging area over the peers: every rank sends
    its whole input (max_bytes) to the last rank, more than a slot, found by every rank
    before any byte moves; a call within the slots runs after it."""
    _group, comm, _stream = setup
    if comm.size < 3:
        pytest.skip("at 2 ranks a slot is the whole staging area: every call fits")
    with torch_communicator("cuda-vmm", 1 << 20) as (group, cm, stream):
        n, me, device = cm.size, cm.rank, group.backend.device
        m, data, source, out, sends, received = _all_to_one(cm, device, 950)
        count = int(m[0, n - 1])
        cm.all_to_all_v(out, source, received, sends, algo="eager", stream=stream)
        with pytest.raises(CollectiveError, match=r"^all_to_all_v: rank 0 sends rank "
                                                  rf"{n - 1} more bytes .* than "
                                                  r"algo='eager' lands in one slot"):
            cm.synchronize(stream)
        assert bool(torch.all(out == 7.0))     # no element moved
        m = _matrix("random", count // n, n)
        sends = torch.tensor(m[me], device=f"cuda:{device}")
        cm.all_to_all_v(out, source[:count // n], received, sends, algo="eager",
                        stream=stream)
        cm.synchronize(stream)
        part = [d[:count // n * 4] for d in data]
        want = _expected(m, part, me, 4)
        assert np.array_equal(_host_bytes(out)[:want.nbytes], want)


@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("algo", ["ll", "ll128", "copy-engine", "push"])
def test_calls_made_out_of_step_are_found_on_every_rank(setup, comm, algo, in_place):
    """Both shapes agreed at first sight, then the ranks make different ones: every rank
    finds that the digests differ and synchronize() raises on every rank (a communicator
    of its own: the error word stays set), naming what each rank called. No algorithm
    writes the output then (in place, the input too): ll and push find it before they
    store anything, copy-engine's guard before its copies into the output."""
    if comm.size < 2:
        pytest.skip("needs 2 ranks")
    n = comm.size
    with torch_communicator("cuda-vmm", 1 << 20) as (group, cm, stream):
        device = f"cuda:{group.backend.device}"
        shapes = [torch.ones(n * 250, device=device), torch.ones(n * 251, device=device)]
        for tensor in shapes:  # every rank makes both calls, in the same order
            cm.all_to_all(tensor if in_place else torch.zeros_like(tensor), tensor,
                          algo=algo, stream=stream)
        cm.synchronize(stream)
        mine = shapes[comm.rank % 2]
        mine.copy_(torch.arange(mine.numel(), device=device) + 1000.0 * comm.rank)
        out = mine if in_place else torch.full_like(mine, 7.0)
        source_before, out_before = mine.clone(), out.clone()
        cm.all_to_all(out, mine, algo=algo, stream=stream)
        with pytest.raises(CollectiveError, match=r"ranks disagree on a collective call: "
                           r"ranks? 0.* call.? all_to_all of \d+ float32 .*, ranks? 1.* "
                           r"all_to_all of \d+ float32 .*\(found on the GPU at call"):
            cm.synchronize(stream)
        assert torch.equal(out, out_before)        # nothing stored
        assert torch.equal(mine, source_before)


# -- copy-engine: the whole staging area, other algorithms' calls around it ----------

def test_copy_engine_takes_an_input_of_the_communicators_whole_max_bytes(comm):
    """Blocks of 3 MiB (copies large enough to run on side streams at once): an input of
    exactly max_bytes lands in the inboxes whole, out of place, in place and in a graph
    replayed with new data; one more element is refused on the calling rank."""
    block = 3 << 20                     # a multiple of 64 KiB: max_bytes is n blocks
    with torch_communicator("cuda-vmm", 0, per_rank_bytes=block) as (group, cm, stream):
        n, me, device = cm.size, cm.rank, group.backend.device
        assert cm.max_bytes == n * block
        if group.time_sliced_gpus:
            pytest.skip("ranks here take turns on a GPU: all-to-all is refused there")
        inputs = [_bytes(11, r, n * block) for r in range(n)]
        source = _tensor(inputs[me], "int64", device)
        out = torch.zeros_like(source)
        cm.all_to_all(out, source, algo="copy-engine", stream=stream)
        cm.all_to_all(source, source, algo="copy-engine", stream=stream)   # in place
        cm.synchronize(stream)
        assert np.array_equal(_host_bytes(out), _even_want(inputs, me, block))
        assert np.array_equal(_host_bytes(source), _even_want(inputs, me, block))
        bound = cm.bind("all_to_all", out, source, stream=stream, algo="copy-engine")
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            bound()
        for replay in range(4):
            data = [_bytes(20 + replay, r, n * block) for r in range(n)]
            source.copy_(_tensor(data[me], "int64", device))
            stream.synchronize()
            graph.replay()
            cm.synchronize(stream)
            assert np.array_equal(_host_bytes(out), _even_want(data, me, block)), replay
        larger = torch.zeros(n * block // 8 + n, dtype=torch.int64, device=f"cuda:{device}")
        assert_refused(lambda: cm.all_to_all(torch.zeros_like(larger), larger,
                                             algo="copy-engine"),
                       "more than this communicator's max_bytes")


# (collective, algorithm) of calls that read staging areas: a one-shot's staged input and
# a push call's inbox (parity 0 every other call), the copy-engine all-reduce's inbox
# (staging area 0 always), pull's and balanced's staged inputs.
_NEIGHBOURS = [("all_reduce", "one-shot"), ("all_reduce", "push"),
               ("all_reduce", "copy-engine"), ("all_to_all", "pull"),
               ("all_to_all", "balanced")]


@pytest.mark.parametrize(("op", "before"), _NEIGHBOURS)
def test_copy_engine_calls_after_and_before_calls_that_read_staging_areas(comm, op, before):
    """The copy-engine all-to-all copies into its peers' staging area 0 before any barrier,
    where a slower peer may still read the call before (of parity 0, or the copy-engine
    all-reduce's inbox). Rounds of five calls, the third and fourth copy-engine all-to-alls
    and the others of ``before``, 8 MiB a rank; every output of every round checked."""
    with torch_communicator("cuda-vmm", 12 << 20) as (group, cm, stream):
        if group.time_sliced_gpus:
            pytest.skip("ranks here take turns on a GPU: all-to-all is refused there")
        n, me, device = cm.size, cm.rank, f"cuda:{group.backend.device}"
        count = (2 << 20) // n * n             # int32 elements, 8 MiB or a little less
        source = torch.zeros(count, dtype=torch.int32, device=device)
        outs = [torch.zeros_like(source) for _ in range(5)]
        ours = ("all_to_all", "copy-engine")
        order = ((op, before), (op, before), ours, ours, (op, before))
        for round_ in range(8):
            # Small values: every sum is exact, whatever the order.
            data = [np.random.default_rng([round_, r]).integers(-1000, 1000, count,
                                                                dtype=np.int32)
                    for r in range(n)]
            source.copy_(torch.from_numpy(data[me]))
            for out, (collective, algo) in zip(outs, order, strict=True):
                if collective == "all_reduce":
                    cm.all_reduce(source, output=out, algo=algo, stream=stream)
                else:
                    cm.all_to_all(out, source, algo=algo, stream=stream)
            cm.synchronize(stream)
            want = {"all_to_all": _even_want([d.view(np.uint8) for d in data], me,
                                             count // n * 4),
                    "all_reduce": np.sum(np.stack(data).astype(np.int64), axis=0)
                    .astype(np.int32).view(np.uint8)}
            for place, (out, (collective, algo)) in enumerate(zip(outs, order, strict=True)):
                assert np.array_equal(_host_bytes(out), want[collective]), (round_, place, algo)



# -- ll all-to-all-v: the slot's bound, found on the GPU, and graphs of new device splits ---

def _v_slot_capacity(low: str, layout: ScratchLayout) -> int:
    if low == "ll":
        return all_to_all_v_block_capacity(layout.ll_slot_bytes, layout.world_size)
    return all_to_all_v_ll128_capacity(layout.ll128_slot_bytes)


@pytest.mark.parametrize("low", ["ll", "ll128"])
def test_ll_all_to_all_v_takes_blocks_up_to_its_slots_and_stops_every_rank_one_byte_past(low):
    """Rank 0 sends the last rank a block that fills the slot to its last byte (it
    arrives whole), then one byte more: every rank finds it in the split rows, raises the
    same one-line error naming the pair and what to use, and moves nothing (outputs and
    received counts untouched); then the algorithm runs a small call and balanced the
    large one."""
    limit = SLOT_LIMIT[low]
    with torch_communicator("cuda-vmm", 2 * limit) as (group, cm, stream):
        n, me, ordinal = cm.size, cm.rank, group.backend.device
        device = f"cuda:{ordinal}"  # _tensor takes the ordinal
        if n < 2:
            pytest.skip("needs 2 ranks: a rank's block to itself never enters a slot")
        if group.time_sliced_gpus:  # the refusal is tested above
            pytest.skip("ranks here take turns on a GPU (no MPS): the all-to-all kernels spin "
                        "on their peers and are refused")
        capacity = _v_slot_capacity(low, ScratchLayout(cm.max_bytes, 0, n, gpu=True))
        assert limit <= capacity < limit + 256 + 120

        def run(big: int, algo: str):
            m = np.full((n, n), 16, np.int64)
            m[0, n - 1] = big
            inputs = [_bytes(big, r, int(m[r].sum())) for r in range(n)]
            source = _tensor(inputs[me], "uint8", ordinal)
            out = torch.full((int(m[:, me].sum()),), 0xA5, dtype=torch.uint8, device=device)
            sends = torch.tensor(m[me], dtype=torch.int64, device=device)
            received = torch.full((n,), -1, dtype=torch.int64, device=device)
            cm.all_to_all_v(out, source, received, sends, algo=algo, stream=stream)
            return m, inputs, out, received

        m, inputs, out, received = run(capacity, low)
        cm.synchronize(stream)
        assert received.cpu().tolist() == m[:, me].tolist()
        assert np.array_equal(_host_bytes(out), _expected(m, inputs, me, 1))
        m, inputs, out, received = run(capacity + 1, low)
        with pytest.raises(CollectiveError, match=(
                rf"^all_to_all_v: rank 0 sends rank {n - 1} more bytes \(its input_splits"
                rf"\[{n - 1}\]\) than algo='{low}' carries .* no element moved\): use "
                r"algo='balanced' or 'auto' for blocks this large$")):
            cm.synchronize(stream)
        assert bool(torch.all(out == 0xA5))              # no byte moved
        assert received.cpu().tolist() == [-1] * n       # no count filled
        small = torch.arange(4 * n, dtype=torch.int32, device=device) + 100 * me
        small_out = torch.zeros_like(small)
        cm.all_to_all_v(small_out, small, [4] * n, [4] * n, algo=low, stream=stream)
        m, inputs, out, received = run(capacity + 1, "balanced")
        cm.synchronize(stream)
        assert small_out.cpu().tolist() == [100 * q + 4 * me + k for q in range(n)
                                            for k in range(4)]
        assert np.array_equal(_host_bytes(out), _expected(m, inputs, me, 1))
        assert received.cpu().tolist() == m[:, me].tolist()


@pytest.mark.parametrize("low", ["ll", "ll128"])
def test_ll_all_to_all_v_graphs_take_new_device_splits_every_replay(setup, low):
    """Three LL (or LL128) calls per replay (so each call's parity changes from replay to
    replay):
    an all-to-all-v of int32, an even all-to-all of bytes and an all-to-all-v of
    bfloat16, both with device splits rewritten before every replay; 200 replays, every
    output and every received count checked."""
    group, comm, stream = setup
    n, me, ordinal = comm.size, comm.rank, group.backend.device
    device = f"cuda:{ordinal}"  # _tensor takes the ordinal
    kinds = ("random", "skewed", "all-but-one-zero", "even", "all-to-one")
    counts = (300, 1_001)               # elements of each rank's inputs (int32, bfloat16)
    sources = [torch.zeros(counts[0], dtype=torch.int32, device=device),
               torch.zeros(counts[1], dtype=torch.bfloat16, device=device)]
    outs = [torch.zeros(count * n, dtype=tensor.dtype, device=device)
            for count, tensor in zip(counts, sources, strict=True)]
    sends = [torch.zeros(n, dtype=torch.int64, device=device),
             torch.zeros(n, dtype=torch.int32, device=device)]
    received = [torch.zeros(n, dtype=torch.int64, device=device),
                torch.zeros(n, dtype=torch.int32, device=device)]
    even_in = torch.zeros(n * 37, dtype=torch.uint8, device=device)
    even_out = torch.zeros_like(even_in)
    calls = [comm.bind("all_to_all_v", outs[0], sources[0], received[0], sends[0],
                       stream=stream, algo=low),
             comm.bind("all_to_all", even_out, even_in, stream=stream, algo=low),
             comm.bind("all_to_all_v", outs[1], sources[1], received[1], sends[1],
                       stream=stream, algo=low)]
    graph = _captured(calls, stream)
    for replay in range(200):
        matrices, wants = [], []
        for k, (count, dtype, item) in enumerate(zip(counts, ("int32", "bfloat16"), (4, 2),
                                                     strict=True)):
            m = _matrix(kinds[(replay + k) % len(kinds)], count - replay % 7, n)
            inputs = [_bytes(7000 + 10 * replay + k, r, count * item) for r in range(n)]
            sources[k].copy_(_tensor(inputs[me], dtype, ordinal))
            sends[k].copy_(torch.tensor(m[me], dtype=sends[k].dtype))
            matrices.append(m)
            wants.append(_expected(m, inputs, me, item))
        evens = [_bytes(9000 + replay, r, n * 37) for r in range(n)]
        even_in.copy_(_tensor(evens[me], "uint8", ordinal))
        stream.synchronize()
        graph.replay()
        comm.synchronize(stream)
        for k in range(2):
            assert received[k].cpu().tolist() == matrices[k][:, me].tolist(), (replay, k)
            got = _host_bytes(outs[k])[:wants[k].nbytes]
            assert np.array_equal(got, wants[k]), (replay, k)
        assert np.array_equal(_host_bytes(even_out), _even_want(evens, me, 37)), replay
