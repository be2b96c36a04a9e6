"""The low-latency protocol on GPUs (algo="ll", "ll-two-shot" for all-reduce, and "ll128",
its 128-byte lines, "ll128-two-shot" for all-reduce):
all-gather stays bit-exact whatever the bytes (including every pattern that looks like a
flag), all-reduce keeps -0.0, NaN and +-inf, inputs and outputs at any byte alignment,
1,000 graph replays with new data each time, the periodic re-flagging of the buffers, and
a silent peer named by a timeout. Run under mpiexec with one GPU per rank (or shared
GPUs)."""

from __future__ import annotations

import numpy as np
import pytest

import ipcshare
from ipcshare.collectives import gpu_path
from ipcshare.collectives.scratch import LL128_MAX_BYTES, LL_MAX_BYTES
from ipcshare.runtime.errors import CollectiveError
from tests.reduction_reference import NUMPY_DTYPES, mismatches, reference, seeded_values

from .silent_peer import assert_rank_zero_is_named_when_silent
from .torch_communicator import torch_communicator

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu, pytest.mark.mpi]

_TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "int32": torch.int32}
_BITS = {4: np.int32, 2: np.int16}
# The all-reduces of the protocol: one round of lines, or two (reduce-scatter, all-gather),
# by 16-byte lines or by 128-byte ones.
ALL_REDUCE_ALGOS = ("ll", "ll-two-shot", "ll128", "ll128-two-shot")
# The all-gathers and reduce-scatters: by 16-byte lines, or by 128-byte ones (ll128.cuh).
LINE_ALGOS = ("ll", "ll128")


def _to_device(values: np.ndarray, device: int) -> torch.Tensor:
    bits = values.view(_BITS[values.itemsize]) if values.dtype != np.uint8 else values
    tensor = torch.from_numpy(bits.copy()).to(f"cuda:{device}")
    return tensor


def _host_bits(tensor: torch.Tensor, dtype: str) -> np.ndarray:
    bits = tensor.view(torch.int32 if tensor.element_size() == 4 else torch.int16)
    return bits.cpu().numpy().view(NUMPY_DTYPES[dtype])


@pytest.fixture(scope="module", params=["cuda-vmm", "cuda-ipc"])
def setup(request):
    # The largest call: an all-gather of LL_MAX_BYTES from every rank (16 MiB at 8 ranks).
    with torch_communicator(request.param, 4 << 20, per_rank_bytes=LL_MAX_BYTES) as found:
        yield found


def _flag_like_blocks(nbytes: int, size: int, call: int) -> list[np.ndarray]:
    """Blocks whose 4-byte words are what a line's flag can be around now (the call
    counts near ``call``, 0, all ones) or random bytes, per rank."""
    blocks = []
    for rank in range(size):
        rng = np.random.default_rng([nbytes, rank, call])
        words = -(-nbytes // 4)
        candidates = np.array([0, 0xFFFFFFFF, call - 1, call, call + 1, call + 2, 1, 2],
                              dtype=np.int64).astype(np.uint32)
        picks = candidates[rng.integers(0, len(candidates), words)]
        noise = rng.integers(0, 1 << 32, words, dtype=np.uint64).astype(np.uint32)
        mixed = np.where(rng.random(words) < 0.5, picks, noise).astype("<u4")
        blocks.append(mixed.view(np.uint8)[:nbytes].copy())
    return blocks


@pytest.mark.parametrize("nbytes", [1, 3, 8, 9, 119, 121, 4095, 65_541, LL_MAX_BYTES])
@pytest.mark.parametrize("algo", LINE_ALGOS)
def test_all_gather_is_bit_exact_for_flag_like_bytes(setup, nbytes, algo):
    # (For ll128 the flag is a 64-bit call count: 4-byte words of call counts beside
    # zeros make 8-byte words that look like it.)
    group, cm, stream = setup
    device = group.backend.device
    for call in range(1, 6):
        blocks = _flag_like_blocks(nbytes, cm.size, call)
        source = _to_device(blocks[cm.rank], device)
        out = torch.zeros(nbytes * cm.size, dtype=torch.uint8, device=f"cuda:{device}")
        cm.all_gather(out, source, algo=algo, stream=stream)
        cm.synchronize(stream)
        assert np.array_equal(out.cpu().numpy(), np.concatenate(blocks)), call


@pytest.mark.parametrize("shift", [(1, 3), (3, 0), (5, 7)])
@pytest.mark.parametrize("algo", LINE_ALGOS)
def test_all_gather_inputs_and_outputs_at_any_byte_offset(setup, shift, algo):
    group, cm, stream = setup
    device = group.backend.device
    nbytes = 1001
    blocks = _flag_like_blocks(nbytes, cm.size, 7)
    backing = torch.zeros(nbytes + 8, dtype=torch.uint8, device=f"cuda:{device}")
    source = backing[shift[0]:shift[0] + nbytes]
    source.copy_(torch.from_numpy(blocks[cm.rank]))
    out_backing = torch.zeros(nbytes * cm.size + 8, dtype=torch.uint8, device=f"cuda:{device}")
    out = out_backing[shift[1]:shift[1] + nbytes * cm.size]
    cm.all_gather(out, source, algo=algo, stream=stream)
    cm.synchronize(stream)
    assert np.array_equal(out.cpu().numpy(), np.concatenate(blocks))
    assert not out_backing[:shift[1]].any() and not out_backing[shift[1] + out.numel():].any()
    # In place: our block of the output is the input.
    gathered = torch.from_numpy(np.zeros(nbytes * cm.size, np.uint8)).to(f"cuda:{device}")
    mine = gathered[cm.rank * nbytes:(cm.rank + 1) * nbytes]
    mine.copy_(torch.from_numpy(blocks[cm.rank]))
    cm.all_gather(gathered, mine, algo=algo, stream=stream)
    cm.synchronize(stream)
    assert np.array_equal(gathered.cpu().numpy(), np.concatenate(blocks))


@pytest.mark.parametrize("algo", ALL_REDUCE_ALGOS)
def test_an_all_reduce_in_place_at_an_odd_element_offset(setup, algo):
    # (The all-gathers' byte offsets: test_all_gather_inputs_and_outputs_at_any_byte_offset.)
    group, cm, stream = setup
    device = group.backend.device
    # float16 at an odd element offset: 2-byte aligned, not 8-byte aligned.
    count = 333
    inputs = [seeded_values("float16", count + 1, 9, r, specials=True) for r in range(cm.size)]
    tensor = _to_device(inputs[cm.rank], device).view(torch.float16)[1:]
    cm.all_reduce(tensor, op="max", algo=algo, stream=stream)  # in place
    cm.synchronize(stream)
    want = reference("float16", "max", [x[1:] for x in inputs])
    assert mismatches("float16", "max", _host_bits(tensor, "float16"), want) == 0


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("op", ["sum", "max", "min"])
@pytest.mark.parametrize("algo", ALL_REDUCE_ALGOS)
def test_all_reduce_keeps_signed_zeros_nans_and_infinities(setup, dtype, op, algo):
    group, cm, stream = setup
    device = group.backend.device
    count = 4099
    inputs = [seeded_values(dtype, count, 21, r, specials=True) for r in range(cm.size)]
    # Every rank -0.0 at element 40: the sum of negative zeros is -0.0.
    for values in inputs:
        values[40] = np.array(-0.0, np.float32).astype(values.dtype)
    want = reference(dtype, op, inputs)
    tensor = _to_device(inputs[cm.rank], device).view(_TORCH[dtype])
    out = torch.zeros_like(tensor)
    cm.all_reduce(tensor, op=op, output=out, algo=algo, stream=stream)
    cm.synchronize(stream)
    got = _host_bits(out, dtype)
    assert mismatches(dtype, op, got, want) == 0
    assert np.signbit(got[40].astype(np.float32))  # -0.0 whatever the op


@pytest.mark.parametrize("op", ["sum", "min"])
@pytest.mark.parametrize("algo", LINE_ALGOS)
def test_reduce_scatter_keeps_specials_at_odd_offsets(setup, op, algo):
    group, cm, stream = setup
    device = group.backend.device
    count = 1001  # per rank's block: odd, so blocks of float16 are not 8-byte aligned
    inputs = [seeded_values("float16", count * cm.size + 1, 33, r, specials=True)
              for r in range(cm.size)]
    tensor = _to_device(inputs[cm.rank], device).view(torch.float16)[1:]
    out = torch.zeros(count, dtype=torch.float16, device=f"cuda:{device}")
    cm.reduce_scatter(out, tensor, op=op, algo=algo, stream=stream)
    cm.synchronize(stream)
    want = reference("float16", op, [x[1:] for x in inputs])[cm.rank * count:][:count]
    assert mismatches("float16", op, _host_bits(out, "float16"), want) == 0


@pytest.mark.parametrize("world_bytes", [4, 4096, 256 << 10, (256 << 10) + 12])
@pytest.mark.parametrize(("algo", "gather_algo"), [("ll", "ll"), ("ll-two-shot", "ll"),
                                                   ("ll", "ll128"), ("ll128", "ll"),
                                                   ("ll128-two-shot", "ll128")])
def test_a_thousand_graph_replays_with_new_data(setup, world_bytes, algo, gather_algo):
    group, cm, stream = setup
    device = group.backend.device
    count = world_bytes // 4
    tensor = torch.zeros(count, dtype=torch.float32, device=f"cuda:{device}")
    out = torch.zeros_like(tensor)
    gathered_bytes = max(1, world_bytes // cm.size)
    source = torch.zeros(gathered_bytes, dtype=torch.uint8, device=f"cuda:{device}")
    gathered = torch.zeros(gathered_bytes * cm.size, dtype=torch.uint8, device=f"cuda:{device}")
    cm.all_reduce(tensor, output=out, algo=algo, stream=stream)  # bind outside capture
    cm.all_gather(gathered, source, algo=gather_algo, stream=stream)
    cm.all_reduce(tensor, algo=algo, stream=stream)
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        cm.all_reduce(tensor, output=out, algo=algo, stream=stream)
        cm.all_gather(gathered, source, algo=gather_algo, stream=stream)
        # In place, after an all-gather: three LL calls a replay, so a replay's calls take
        # each parity in turn, and consecutive replays start on different parities.
        cm.all_reduce(tensor, algo=algo, stream=stream)
    # Where ranks take turns on a GPU (no MPS) every spinning call waits out time slices:
    # 100 replays there keep the suite within a device call; 1,000 everywhere else.
    replays = 100 if group.time_sliced_gpus else 1000
    inputs_all = [[seeded_values("float32", count, replay, r) for r in range(cm.size)]
                  for replay in range(8)]
    blocks_all = [_flag_like_blocks(gathered_bytes, cm.size, replay) for replay in range(8)]
    wants = [reference("float32", "sum", inputs) for inputs in inputs_all]
    wrong = 0
    for replay in range(replays):
        which = replay % 8  # new data every replay (eight sets in turn)
        tensor.copy_(torch.from_numpy(inputs_all[which][cm.rank]))
        source.copy_(torch.from_numpy(blocks_all[which][cm.rank]))
        graph.replay()
        if replay % 10 == 9 or replay < 20:
            stream.synchronize()
            wrong += mismatches("float32", "sum", out.cpu().numpy(), wants[which])
            wrong += mismatches("float32", "sum", tensor.cpu().numpy(), wants[which])
            wrong += int(np.count_nonzero(gathered.cpu().numpy() !=
                                          np.concatenate(blocks_all[which])))
    stream.synchronize()
    cm.synchronize(stream)
    assert wrong == 0


@pytest.mark.parametrize("algos", [("ll",), ("ll-two-shot",), ("ll", "ll-two-shot", "ll"),
                                   ("ll128-two-shot",), ("ll", "ll128-two-shot", "ll128")])
def test_buffers_reflagged_every_few_calls_stay_correct(monkeypatch, algos):
    # Re-flag every 3 calls of a parity instead of every 2**30: large calls leave lines
    # that later small calls do not touch; correctness must not depend on them. (The
    # two-shots' second region starts after a chunk's lines, so it moves with the size.
    # LL128 buffers are never re-flagged: their lines keep older calls' 64-bit counts.)
    monkeypatch.setattr(gpu_path, "LL_CLEAN_EVERY", 3)
    with ipcshare.Group(backend="cuda-vmm") as group:
        device = group.backend.device
        torch.cuda.set_device(device)
        stream = torch.cuda.Stream(device=device)
        with group.communicator(max_bytes=256 << 10) as cm:
            for call, count in enumerate([65_536, 3, 1, 40_000, 7, 65_536, 2, 9, 1, 1, 30_000,
                                          5, 65_536, 1, 4, 8, 12_345, 2, 65_536, 3] * 2):
                inputs = [seeded_values("int32", count, call, r) for r in range(cm.size)]
                tensor = _to_device(inputs[cm.rank], device).view(torch.int32)
                cm.all_reduce(tensor, algo=algos[call % len(algos)], stream=stream)
                cm.synchronize(stream)
                got = tensor.cpu().numpy()
                assert mismatches("int32", "sum", got, reference("int32", "sum", inputs)) == 0


@pytest.mark.parametrize("algo", ALL_REDUCE_ALGOS)
def test_a_communicator_sized_for_its_call_runs_it(algo):
    # The command line sizes a communicator for each row; ll-two-shot's chunks of a tiny
    # input need more lines than the input (2 float32 at 4 ranks: 1 line whole, two
    # regions of 2): refused on 4 H200s, 2026-11-28, before the slots counted them.
    with ipcshare.Group(backend="cuda-vmm") as group:
        device = group.backend.device
        torch.cuda.set_device(device)
        stream = torch.cuda.Stream(device=device)
        for count in (1, 2, 3, 5, 2 * group.size + 1):
            with group.communicator(max_bytes=4 * count) as cm:
                inputs = [seeded_values("float32", count, count, r) for r in range(cm.size)]
                tensor = _to_device(inputs[cm.rank], device).view(torch.float32)
                cm.all_reduce(tensor, algo=algo, stream=stream)
                cm.synchronize(stream)
                got = tensor.cpu().numpy()
                assert mismatches("float32", "sum", got,
                                  reference("float32", "sum", inputs)) == 0, count


@pytest.mark.parametrize("algo", ["ll128", "ll128-two-shot"])
def test_ll128_all_reduces_take_inputs_up_to_their_buffers_and_refuse_one_element_more(algo):
    # A communicator for larger calls (8 MiB + 4 KiB): the LL128 buffers hold 8 MiB a
    # rank (LL128_MAX_BYTES), so the largest input runs whole, in place and out, and one
    # float32 more is refused on every rank before anything moves; auto then runs it.
    count = LL128_MAX_BYTES // 4
    with ipcshare.Group(backend="cuda-vmm") as group:
        device = group.backend.device
        torch.cuda.set_device(device)
        stream = torch.cuda.Stream(device=device)
        with group.communicator(max_bytes=LL128_MAX_BYTES + 4096) as cm:
            inputs = [seeded_values("float32", count + 1, 77, r) for r in range(cm.size)]
            tensor = _to_device(inputs[cm.rank], device).view(torch.float32)
            want = reference("float32", "sum", [x[:count] for x in inputs])
            out = torch.zeros(count, dtype=torch.float32, device=f"cuda:{device}")
            cm.all_reduce(tensor[:count], output=out, algo=algo, stream=stream)
            cm.synchronize(stream)
            assert mismatches("float32", "sum", out.cpu().numpy(), want) == 0
            whole = torch.zeros(count + 1, dtype=torch.float32, device=f"cuda:{device}")
            with pytest.raises(CollectiveError, match=f"its buffers take inputs of up to "
                                                      f"{LL128_MAX_BYTES} bytes"):
                cm.all_reduce(tensor, output=whole, algo=algo, stream=stream)
            cm.synchronize(stream)
            assert not whole.any()
            cm.all_reduce(tensor, output=whole, stream=stream)
            cm.all_reduce(tensor[:count], algo=algo, stream=stream)  # in place, after it
            cm.synchronize(stream)
            assert mismatches("float32", "sum", tensor[:count].cpu().numpy(), want) == 0
            assert mismatches("float32", "sum", whole.cpu().numpy(),
                              reference("float32", "sum", inputs)) == 0


@pytest.mark.parametrize(("op", "algo"), [("all_reduce", "ll"), ("all_reduce", "ll-two-shot"),
                                         ("all_gather", "ll128"),
                                         ("all_reduce", "ll128-two-shot")])
def test_a_silent_peer_is_named_by_the_timeout(comm, op, algo):
    if comm.size < 2:
        pytest.skip("needs 2 or more ranks")
    with ipcshare.Group(backend="cuda-vmm", timeout=2.0) as group:
        device = group.backend.device
        torch.cuda.set_device(device)
        with group.communicator(max_bytes=1 << 16) as cm:
            tensor = torch.ones(1024, device=f"cuda:{device}")
            gathered = torch.zeros(1024 * cm.size, device=f"cuda:{device}")
            if op == "all_reduce":
                def call():
                    cm.all_reduce(tensor, algo=algo)
            else:
                def call():
                    cm.all_gather(gathered, tensor, algo=algo)
            assert_rank_zero_is_named_when_silent(comm, group.rank, cm, call)
