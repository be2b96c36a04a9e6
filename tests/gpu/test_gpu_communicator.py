"""Communicator on GPUs: every collective, algorithm, dtype and op on torch tensors,
against the reference computed on the host from every rank's seeded input; zero-copy
arrays from empty(); user streams; CUDA graphs replayed with new data; disagreement on
every rank. Run under mpiexec with one GPU per rank (or shared GPUs)."""

from __future__ import annotations

import numpy as np
import pytest

import ipcshare
from ipcshare.collectives.scratch import LL_MAX_BYTES
from ipcshare.runtime.errors import CollectiveError
from tests.reduction_reference import NUMPY_DTYPES, mismatches, reference, seeded_values
from tests.sizing import max_bytes_for

from .refusals import assert_refused
from .silent_peer import assert_rank_zero_is_named_when_silent
from .torch_communicator import torch_communicator

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu, pytest.mark.mpi]

_TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "int32": torch.int32}
_BITS = {4: np.int32, 2: np.int16}
ALGOS = {"all_reduce": ("one-shot", "two-shot", "ll", "ll-two-shot", "ll128", "ll128-two-shot",
                        "stepped", "copy-engine", "push", "auto"),
         "reduce_scatter": ("one-shot", "ll", "stepped", "push", "auto"),
         "all_gather": ("pull", "ll", "stepped", "push", "auto")}
# Bytes of one rank's all-gather input: the largest array of the shared communicator's
# calls is the output, the ranks times the last of these (8,000,024 bytes at 8 ranks).
GATHER_NBYTES = (1, 15, 4096, 1_000_003)
# The algorithms of the low-latency protocol: inputs up to its buffers' LL_MAX_BYTES.
LOW_LATENCY = ("ll", "ll-two-shot")


def _to_device(values: np.ndarray, dtype: str, device: int) -> torch.Tensor:
    """The exact bits of ``values`` as a CUDA tensor of ``dtype``."""
    bits = values.view(_BITS[values.itemsize])
    return torch.from_numpy(bits.copy()).to(f"cuda:{device}").view(_TORCH[dtype])


def _to_host(tensor: torch.Tensor, dtype: str) -> np.ndarray:
    bits = tensor.view(torch.int32 if tensor.element_size() == 4 else torch.int16)
    return bits.cpu().numpy().view(NUMPY_DTYPES[dtype])


class _OnStream:
    """The communicator with every call on one torch stream, which is also torch's
    current stream while the tests run: the tensors' copies and the collectives are
    ordered on it, as they are in an application."""

    def __init__(self, communicator, stream):
        self.cm, self.stream = communicator, stream

    def __getattr__(self, name):
        return getattr(self.cm, name)

    def all_reduce(self, *args, **kwargs):
        return self.cm.all_reduce(*args, stream=kwargs.pop("stream", self.stream), **kwargs)

    def reduce_scatter(self, *args, **kwargs):
        return self.cm.reduce_scatter(*args, stream=kwargs.pop("stream", self.stream), **kwargs)

    def all_gather(self, *args, **kwargs):
        return self.cm.all_gather(*args, stream=kwargs.pop("stream", self.stream), **kwargs)

    def synchronize(self, stream=None):
        self.cm.synchronize(self.stream if stream is None else stream)


@pytest.fixture(scope="module", params=["cuda-vmm", "cuda-ipc"])
def setup(request):
    with torch_communicator(request.param, 4 << 20,
                            per_rank_bytes=max(GATHER_NBYTES)) as (group, communicator, stream):
        yield group, _OnStream(communicator, stream)


def _inputs(dtype, count, seed, size, specials):
    return [seeded_values(dtype, count, seed, r, specials=specials) for r in range(size)]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int32"])
@pytest.mark.parametrize("op", ["sum", "max", "min"])
@pytest.mark.parametrize("algo", ALGOS["all_reduce"])
@pytest.mark.parametrize("count", [1, 7, 4099, 300_001])
def test_all_reduce_matches_the_reference(setup, dtype, op, algo, count):
    group, cm = setup
    device = group.backend.device
    inputs = _inputs(dtype, count, 11 + count, cm.size, specials=op != "sum")
    want = reference(dtype, op, inputs)
    tensor = _to_device(inputs[cm.rank], dtype, device)
    out = torch.full_like(tensor, 0)
    if algo in LOW_LATENCY and tensor.nbytes > LL_MAX_BYTES:
        with pytest.raises(CollectiveError, match="its buffers take inputs of up to"):
            cm.all_reduce(tensor, op=op, output=out, algo=algo)
        return
    cm.all_reduce(tensor, op=op, output=out, algo=algo)
    cm.all_reduce(tensor, op=op, algo=algo)  # in place
    cm.synchronize()
    assert mismatches(dtype, op, _to_host(out, dtype), want) == 0
    assert mismatches(dtype, op, _to_host(tensor, dtype), want) == 0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32"])
@pytest.mark.parametrize("op", ["sum", "max"])
@pytest.mark.parametrize("count", [1, 1000, 65_539])
@pytest.mark.parametrize("algo", ALGOS["reduce_scatter"])
def test_reduce_scatter_matches_the_reference(setup, dtype, op, count, algo):
    group, cm = setup
    device = group.backend.device
    inputs = _inputs(dtype, count * cm.size, 5 + count, cm.size, specials=op != "sum")
    want = reference(dtype, op, inputs)[cm.rank * count:(cm.rank + 1) * count]
    source = _to_device(inputs[cm.rank], dtype, device)
    out = torch.zeros(count, dtype=_TORCH[dtype], device=f"cuda:{device}")
    cm.reduce_scatter(out, source, op=op, algo=algo)
    cm.synchronize()
    assert mismatches(dtype, op, _to_host(out, dtype), want) == 0
    # In place: the output is this rank's block of the input.
    cm.reduce_scatter(source[cm.rank * count:(cm.rank + 1) * count], source, op=op, algo=algo)
    cm.synchronize()
    block = _to_host(source, dtype)[cm.rank * count:(cm.rank + 1) * count]
    assert mismatches(dtype, op, block, want) == 0


@pytest.mark.parametrize("algo", ALGOS["all_gather"])
@pytest.mark.parametrize("nbytes", GATHER_NBYTES)
def test_all_gather_moves_every_byte(setup, nbytes, algo):
    group, cm = setup
    if algo in LOW_LATENCY and nbytes > LL_MAX_BYTES:
        pytest.skip("beyond the LL buffers (refusal tested with all_reduce)")
    device = group.backend.device
    blocks = [np.random.default_rng([nbytes, r]).integers(0, 256, nbytes, dtype=np.uint8)
              for r in range(cm.size)]
    source = torch.from_numpy(blocks[cm.rank]).to(f"cuda:{device}")
    out = torch.zeros(nbytes * cm.size, dtype=torch.uint8, device=f"cuda:{device}")
    cm.all_gather(out, source, algo=algo)
    cm.synchronize()
    assert np.array_equal(out.cpu().numpy(), np.concatenate(blocks))
    # In place: the input is this rank's block of the output.
    out2 = torch.zeros_like(out)
    out2[cm.rank * nbytes:(cm.rank + 1) * nbytes] = source
    cm.all_gather(out2, out2[cm.rank * nbytes:(cm.rank + 1) * nbytes], algo=algo)
    cm.synchronize()
    assert np.array_equal(out2.cpu().numpy(), np.concatenate(blocks))


@pytest.mark.parametrize("algo", ["one-shot", "two-shot", "stepped", "copy-engine", "push"])
def test_arrays_from_empty_are_read_in_place(setup, algo):
    group, cm = setup
    count = 100_003
    inputs = _inputs("float32", count, 3, cm.size, specials=False)
    want = reference("float32", "sum", inputs)
    array = torch.from_dlpack(cm.empty((count,), "float32"))
    assert array.dtype == torch.float32 and array.shape == (count,)
    before = cm.copies_in
    for _ in range(3):  # the user rewrites the input between calls
        array.copy_(torch.from_numpy(inputs[cm.rank]))
        # In place: one-shot and stepped read every input whole, so they copy in;
        # copy-engine and push never stage (no peer reads an input: it is pushed).
        cm.all_reduce(array, algo=algo)
        cm.synchronize()
        assert mismatches("float32", "sum", array.cpu().numpy(), want) == 0
    assert cm.copies_in - before == (0 if algo in ("two-shot", "copy-engine", "push") else 3)
    out = torch.empty_like(array)
    array.copy_(torch.from_numpy(inputs[cm.rank]))
    before = cm.copies_in
    cm.all_reduce(array, output=out, algo=algo)
    cm.synchronize()
    assert mismatches("float32", "sum", out.cpu().numpy(), want) == 0
    assert cm.copies_in == before  # out of place: peers read the input where it lies
    bf = torch.from_dlpack(cm.empty(8, torch.bfloat16))
    assert bf.dtype == torch.bfloat16


def test_calls_on_a_user_stream_and_in_a_cuda_graph_replay_with_new_data(setup):
    group, cm = setup
    device = group.backend.device
    count = 8192
    stream = cm.stream
    tensor = torch.zeros(count, dtype=torch.float32, device=f"cuda:{device}")
    out = torch.zeros_like(tensor)
    gathered = torch.zeros(count * cm.size, dtype=torch.float32, device=f"cuda:{device}")
    thrice_out = torch.zeros_like(tensor)
    for algo in ("one-shot", "two-shot", "stepped", "copy-engine", "push"):  # warm: bind first
        cm.all_reduce(tensor, output=out, algo=algo)
    cm.all_gather(gathered, tensor)
    cm.all_gather(gathered, tensor, algo="stepped")
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        cm.all_reduce(tensor, output=out, algo="one-shot")
        cm.all_reduce(out, algo="two-shot")
        cm.all_gather(gathered, out)
        # Stepped calls between kernel calls, and one after another (the flag sets must
        # alternate whatever follows, on every replay).
        cm.all_reduce(out, output=thrice_out, algo="stepped")
        cm.all_reduce(thrice_out, algo="copy-engine")  # in place
        cm.all_reduce(thrice_out, algo="push")  # in place, after a fixed-place algorithm
        cm.all_gather(gathered, thrice_out, algo="stepped")
    for replay in range(50):
        inputs = [seeded_values("float32", count, replay, r) for r in range(cm.size)]
        once = reference("float32", "sum", inputs)
        twice = reference("float32", "sum", [once] * cm.size)
        thrice = reference("float32", "sum", [twice] * cm.size)
        fourfold = reference("float32", "sum", [thrice] * cm.size)
        fivefold = reference("float32", "sum", [fourfold] * cm.size)
        tensor.copy_(torch.from_numpy(inputs[cm.rank]))
        graph.replay()
        stream.synchronize()
        assert mismatches("float32", "sum", out.cpu().numpy(), twice) == 0, replay
        assert mismatches("float32", "sum", thrice_out.cpu().numpy(), fivefold) == 0, replay
        assert np.array_equal(gathered.cpu().numpy(), np.tile(fivefold, cm.size)), replay
    cm.synchronize()


def test_a_first_call_on_a_user_stream_may_be_made_inside_a_capture(setup):
    """No warm-up outside the graph: the call's first sight (agreement, binding, the
    stream's engine) happens while the user's stream is capturing, which must neither
    fail nor invalidate the capture (asking a capturing stream for its device would)."""
    group, cm = setup
    device = group.backend.device
    count = 3 * 1024 + 7   # a shape no other test uses: first seen inside the capture
    tensor = torch.zeros(count, dtype=torch.float32, device=f"cuda:{device}")
    stream = torch.cuda.Stream(device=device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        cm.all_reduce(tensor, algo="one-shot", stream=stream)
    for replay in range(5):
        tensor.fill_(float(cm.rank + replay))
        torch.cuda.synchronize()
        graph.replay()
        stream.synchronize()
        want = float(cm.size * replay + cm.size * (cm.size - 1) // 2)
        assert bool(torch.all(tensor == want)), replay
    cm.synchronize(stream)


@pytest.mark.parametrize("algo", ["ll", "ll-two-shot", "one-shot", "two-shot", "stepped",
                                  "copy-engine", "push"])
def test_bound_calls_launch_again_on_new_data_and_in_graphs(setup, algo):
    group, cm = setup
    device = group.backend.device
    count = 5003
    tensor = torch.zeros(count, dtype=torch.float32, device=f"cuda:{device}")
    out = torch.zeros_like(tensor)
    block = torch.zeros(17, dtype=torch.int32, device=f"cuda:{device}")
    gathered = torch.zeros(17 * cm.size, dtype=torch.int32, device=f"cuda:{device}")
    all_reduce = cm.bind("all_reduce", tensor, output=out, algo=algo, stream=cm.stream)
    all_gather = cm.bind("all_gather", gathered, block, stream=cm.stream,
                         algo=algo if algo in ("ll", "stepped") else "pull")
    calls_before = cm._path.calls
    for call in range(3):
        inputs = [seeded_values("float32", count, 70 + call, r) for r in range(cm.size)]
        tensor.copy_(torch.from_numpy(inputs[cm.rank]))
        block.fill_(cm.rank * 100 + call)
        assert all_reduce() is out
        all_gather()
        cm.synchronize()
        assert mismatches("float32", "sum", out.cpu().numpy(),
                          reference("float32", "sum", inputs)) == 0
        want = [r * 100 + call for r in range(cm.size) for _ in range(17)]
        assert gathered.cpu().tolist() == want
    assert cm._path.calls - calls_before == 6
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=cm.stream):
        all_reduce()
    for replay in range(5):
        inputs = [seeded_values("float32", count, 90 + replay, r) for r in range(cm.size)]
        tensor.copy_(torch.from_numpy(inputs[cm.rank]))
        graph.replay()
        cm.synchronize()
        assert mismatches("float32", "sum", out.cpu().numpy(),
                          reference("float32", "sum", inputs)) == 0, replay


def test_repeated_calls_on_the_same_tensors_skip_the_checks_and_stay_right(setup):
    group, cm = setup
    device = group.backend.device
    count = 3001
    tensor = torch.zeros(count, dtype=torch.float32, device=f"cuda:{device}")
    out = torch.zeros_like(tensor)
    recent = cm._recent
    hits = recent.hits
    for call in range(4):
        inputs = [seeded_values("float32", count, 300 + call, r) for r in range(cm.size)]
        tensor.copy_(torch.from_numpy(inputs[cm.rank]))
        assert cm.all_reduce(tensor, output=out) is out
        cm.synchronize()
        assert mismatches("float32", "sum", out.cpu().numpy(),
                          reference("float32", "sum", inputs)) == 0, call
    assert recent.hits - hits == 3  # the first call was checked, the next three replayed
    # Another tensor (another pointer) is checked afresh, and misuse still raises.
    other = torch.ones(count, dtype=torch.float32, device=f"cuda:{device}")
    cm.all_reduce(other)
    cm.synchronize()
    assert other.cpu().tolist() == [float(cm.size)] * count
    assert_refused(lambda: cm.all_reduce(other.double()), "float64")


def test_ranks_that_disagree_raise_on_every_rank(setup, comm):
    group, cm = setup
    device = group.backend.device
    count = 1000 + comm.rank if comm.size > 1 else 1000
    tensor = torch.ones(count, device=f"cuda:{device}")
    if comm.size == 1:
        cm.all_reduce(tensor)
        cm.synchronize()
        assert tensor.cpu().tolist() == [1.0] * count
        return
    with pytest.raises(CollectiveError, match="ranks disagree on a collective call"):
        cm.all_reduce(tensor)
    # The communicator still works for calls the ranks agree on.
    same = torch.ones(64, device=f"cuda:{device}")
    cm.all_reduce(same)
    cm.synchronize()
    assert same.cpu().tolist() == [float(comm.size)] * 64


@pytest.mark.parametrize("algo", ["one-shot", "two-shot", "ll", "ll-two-shot", "stepped",
                                  "copy-engine", "push"])
def test_known_calls_made_out_of_step_are_found_on_the_gpu(comm, algo):
    """Both shapes agreed at first sight, then the ranks make different ones: the kernels
    compare the headers' digests, skip the work (the copy-engine call's guard keeps its
    output), and synchronize() raises on every rank, naming what each rank called (a
    communicator of its own: the error word stays set)."""
    if comm.size < 2:
        pytest.skip("needs 2 ranks")
    with torch_communicator("cuda-vmm", 1 << 20) as (group, cm, stream):
        device = f"cuda:{group.backend.device}"
        shapes = [torch.ones(1000, device=device), torch.ones(1004, device=device)]
        for tensor in shapes:  # every rank makes both calls, in the same order
            cm.all_reduce(tensor, algo=algo, stream=stream)
        cm.synchronize(stream)
        assert shapes[1].cpu().tolist() == [float(comm.size)] * 1004
        mine = shapes[comm.rank % 2]
        before = mine.clone()
        cm.all_reduce(mine, algo=algo, stream=stream)
        with pytest.raises(CollectiveError) as raised:
            cm.synchronize(stream)
        assert str(raised.value) == _named_disagreement(comm.size, "all_reduce", (1000, 1004),
                                                        "float32", "sum", algo, raised)
        assert torch.equal(mine, before)  # the work was skipped


def test_an_ll_all_gather_made_out_of_step_writes_no_output(comm):
    """The all-gather of the LL protocol, as the all-reduces above: ranks that make
    different calls (of as many lines) are found on the GPU, and the output, the rank's
    own block included, keeps what it held."""
    if comm.size < 2:
        pytest.skip("needs 2 ranks")
    with torch_communicator("cuda-vmm", 1 << 20) as (group, cm, stream):
        device = f"cuda:{group.backend.device}"
        # 1,000 and 1,004 bytes: 125 and 126 lines, so neither rank waits for a line the
        # other never sends beyond what the digests already tell.
        sizes = (1000, 1004)
        for count in sizes:  # every rank makes both calls, in the same order
            out = torch.zeros(comm.size * count, dtype=torch.uint8, device=device)
            cm.all_gather(out, torch.full((count,), 7, dtype=torch.uint8, device=device),
                          algo="ll", stream=stream)
        cm.synchronize(stream)
        assert out.cpu().tolist() == [7] * (comm.size * sizes[1])
        count = sizes[comm.rank % 2]
        out = torch.full((comm.size * count,), 0xA5, dtype=torch.uint8, device=device)
        before = out.clone()
        cm.all_gather(out, torch.full((count,), 3, dtype=torch.uint8, device=device),
                      algo="ll", stream=stream)
        with pytest.raises(CollectiveError) as raised:
            cm.synchronize(stream)
        assert str(raised.value) == _named_disagreement(comm.size, "all_gather", sizes,
                                                        "uint8", None, "ll", raised)
        assert torch.equal(out, before)  # nothing written, our own block included


def _named_disagreement(size: int, op: str, counts: tuple[int, int], dtype: str,
                        redop: str | None, algo: str, raised) -> str:
    """The line every rank raises where even ranks call ``op`` of ``counts[0]`` elements
    and odd ranks of ``counts[1]`` (both agreed earlier), found on the GPU at the call
    ``raised`` names."""
    from ipcshare.collectives.agreement import Signature
    from ipcshare.topology.world import format_ranks

    itemsize = {"float32": 4, "uint8": 1}[dtype]
    what = [Signature(op, count, dtype, itemsize, redop, algo).describe() for count in counts]
    evens, odds = list(range(0, size, 2)), list(range(1, size, 2))
    verb = "call" if len(evens) > 1 else "calls"
    call = str(raised.value).rsplit("found on the GPU at call ", 1)[1].split()[0]
    return (f"ranks disagree on a collective call: {format_ranks(evens)} {verb} {what[0]}, "
            f"{format_ranks(odds)} {what[1]} (found on the GPU at call {call} of this "
            "communicator); every rank must make the same calls in the same order")


# Every algorithm of the barrier family, in an order that puts each after each other one.
_FAMILY = ("push", "one-shot", "push", "two-shot", "push", "copy-engine", "one-shot",
           "two-shot", "copy-engine", "push", "push")


@pytest.mark.parametrize("backend", ["cuda-vmm", "cuda-ipc"])
def test_algorithms_that_follow_one_another_meet_only_their_own_call(comm, backend,
                                                                      monkeypatch):
    """Calls of several algorithms in turn on one communicator, with push tiles of 16 KiB
    so that every push block signals several of them: the push kernels' step signals are
    larger than any earlier call's, and the next call of any algorithm must still wait for
    its own. Had a later call's wait been met by an earlier call's signal, it would read
    inputs not yet written and give wrong sums."""
    from ipcshare.collectives.algorithms import gpu_push

    monkeypatch.setattr(gpu_push._Push, "tile_bytes", 16 << 10)  # the same on every rank
    with torch_communicator(backend, 24 << 20) as (group, cm, stream):
        device = f"cuda:{group.backend.device}"
        count = (5 << 20) + 3  # 20 MiB of float32: chunks of 10 MiB or less, 80+ KiB a block
        tensor = torch.zeros(count, dtype=torch.float32, device=device)
        out = torch.zeros_like(tensor)
        scattered = torch.zeros(count // cm.size, dtype=torch.float32, device=device)
        gathered = torch.zeros(count // cm.size * cm.size, dtype=torch.float32, device=device)
        for round_, algo in enumerate(_FAMILY):
            inputs = _inputs("float32", count, 500 + round_, cm.size, specials=False)
            want = reference("float32", "sum", inputs)
            tensor.copy_(torch.from_numpy(inputs[cm.rank]))
            cm.all_reduce(tensor, output=out, algo=algo, stream=stream)
            if algo in ALGOS["reduce_scatter"]:
                block = count // cm.size
                rs_inputs = [values[:block * cm.size] for values in inputs]
                rs_want = reference("float32", "sum", rs_inputs)[cm.rank * block:
                                                                   (cm.rank + 1) * block]
                cm.reduce_scatter(scattered, tensor[:block * cm.size], algo=algo, stream=stream)
            if algo in ALGOS["all_gather"]:
                cm.all_gather(gathered, tensor[:count // cm.size], algo=algo, stream=stream)
            cm.all_reduce(tensor, algo=algo, stream=stream)  # in place
            cm.synchronize(stream)
            if algo in ALGOS["all_gather"]:
                part = count // cm.size
                assert np.array_equal(gathered.cpu().numpy(), np.concatenate(
                    [values[:part] for values in inputs])), (round_, algo)
            assert mismatches("float32", "sum", out.cpu().numpy(), want) == 0, (round_, algo)
            assert mismatches("float32", "sum", tensor.cpu().numpy(), want) == 0, (round_, algo)
            if algo in ALGOS["reduce_scatter"]:
                assert mismatches("float32", "sum", scattered.cpu().numpy(), rs_want) == 0, \
                    (round_, algo)


@pytest.mark.parametrize("before", ["one-shot", "push"])
def test_a_copy_engine_call_waits_for_peers_still_reading_their_staging_area(comm, before):
    """The copy-engine all-reduce copies into its peers' staging area 0 before any barrier.
    A call of parity 0 just before it (a one-shot's staged input, a push call's inbox) may
    still be read there by a slower peer, so the call must first wait until every peer has
    finished its previous call. In each round of four calls the second has parity 0 (a
    fresh communicator counts calls from 1) and the third is a copy-engine call."""
    with torch_communicator("cuda-vmm", 12 << 20) as (group, cm, stream):
        device = f"cuda:{group.backend.device}"
        count = (2 << 20) + 5  # 8 MiB of float32
        tensor = torch.zeros(count, dtype=torch.float32, device=device)
        outs = [torch.zeros_like(tensor) for _ in range(4)]
        for round_ in range(12):
            inputs = _inputs("float32", count, 900 + round_, cm.size, specials=False)
            want = reference("float32", "sum", inputs)
            tensor.copy_(torch.from_numpy(inputs[cm.rank]))
            for out, algo in zip(outs, (before, before, "copy-engine", "copy-engine"),
                                 strict=True):
                cm.all_reduce(tensor, output=out, algo=algo, stream=stream)
            cm.synchronize(stream)
            for place, out in enumerate(outs):
                assert mismatches("float32", "sum", out.cpu().numpy(), want) == 0, \
                    (round_, place)


@pytest.mark.parametrize(("op", "algo"), [("all_reduce", "push"), ("reduce_scatter", "push"),
                                          ("all_gather", "push"), ("all_reduce", "two-shot"),
                                          ("all_to_all", "ll")])
def test_a_silent_peer_of_a_kernel_call_is_named_by_the_timeout(comm, op, algo):
    """Rank 0 never makes a call the others make: their blocks give up waiting at the
    first tile (push), barrier (two-shot) or digest line (ll), synchronize() names rank 0
    on every other rank, and every rank closes."""
    if comm.size < 2:
        pytest.skip("needs 2 or more ranks")
    with ipcshare.Group(backend="cuda-vmm", timeout=2.0) as group:
        if op == "all_to_all" and group.time_sliced_gpus:
            pytest.skip("ranks here take turns on a GPU: all-to-all is refused there")
        device = group.backend.device
        torch.cuda.set_device(device)
        with group.communicator(max_bytes=max_bytes_for(group.size, 4096 * 4,
                                                        at_least=1 << 20)) as cm:
            block = torch.ones(4096, device=f"cuda:{device}")
            whole = torch.ones(4096 * cm.size, device=f"cuda:{device}")
            out = torch.zeros_like(whole)
            if op == "all_reduce":
                def make_call():
                    cm.all_reduce(whole, output=out, algo=algo)
            else:  # a block is the output of reduce-scatter and the input of all-gather
                output, source = {"reduce_scatter": (out[:4096], whole),
                                  "all_gather": (out, block), "all_to_all": (out, whole)}[op]

                def make_call():
                    getattr(cm, op)(output, source, algo=algo)
            assert_rank_zero_is_named_when_silent(comm, group.rank, cm, make_call)


def test_misuse_raises_in_the_call(setup):
    """Every rank misuses the call alike: each raises in it (a refused call,
    collectives/call_marks.py; tests/gpu/test_gpu_refused_calls.py has one rank alone)."""
    group, cm = setup
    device = group.backend.device
    tensor = torch.ones(16, device=f"cuda:{device}")
    assert_refused(lambda: cm.all_reduce(torch.ones(16)),  # host tensor
                   "rank 0's tensor failed its check .*(on this rank's GPU|cuda memory)")
    assert_refused(lambda: cm.all_reduce(torch.ones(16, 2, device=f"cuda:{device}").t()),
                   "not contiguous")
    # One element too many, at any size (no call of the peers to guess: refused alone).
    assert_refused(lambda: cm.all_reduce(torch.ones(cm.max_bytes // 4 + 1,
                                                    device=f"cuda:{device}")), "max_bytes")
    assert_refused(lambda: cm.all_reduce(tensor, algo="ring"), "rank 0's algo .*algo='ring'")
    assert_refused(lambda: cm.all_reduce(tensor.double()), "float64")
    cm.all_reduce(tensor)   # still in step
    cm.synchronize()
    assert tensor.cpu().tolist() == [float(cm.size)] * 16
