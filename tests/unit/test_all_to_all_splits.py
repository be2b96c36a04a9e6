"""All-to-all-v's split checks without MPI: ``check_splits`` on one rank's splits, and
``split_mismatches`` / ``splits_disagreement`` on every rank's rows (properties with
hypothesis); the refusal on GPU memory and across nodes."""

from __future__ import annotations

import re
import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ipcshare.collectives.across_nodes.communicator import NodesCommunicator
from ipcshare.collectives.algorithms.host_all_to_all import (
    check_splits,
    split_mismatches,
    splits_disagreement,
)
from ipcshare.collectives.call_guard import CallGuard
from ipcshare.collectives.call_marks import ArgumentProblem
from ipcshare.collectives.communicator import Communicator
from ipcshare.runtime.errors import CollectiveError

from ..hypothesis_profiles import examples

counts = st.integers(0, 1 << 20)


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(counts, min_size=1, max_size=9), st.integers(0, 9 << 20),
       st.sampled_from(["list", "tuple", "int32", "int64", "uint16", "numpy ints"]))
def test_valid_splits_come_back_as_ints_and_others_name_the_sum(values, count, form):
    if form == "uint16":
        values = [v % (1 << 16) for v in values]
    given_splits = {"list": lambda: list(values), "tuple": lambda: tuple(values),
                    "int32": lambda: np.array(values, np.int32),
                    "int64": lambda: np.array(values, np.int64),
                    "uint16": lambda: np.array(values, np.uint16),
                    "numpy ints": lambda: [np.int64(v) for v in values]}[form]()
    total = sum(values)
    if total <= count:
        got = check_splits(given_splits, "input_splits", ranks=len(values), count=count,
                           array="input")
        assert got == tuple(values) and all(type(v) is int for v in got)
    else:
        with pytest.raises(CollectiveError, match=rf"^all_to_all_v: input_splits add up to "
                                                  rf"{total} elements, more than input's "
                                                  rf"{count}$"):
            check_splits(given_splits, "input_splits", ranks=len(values), count=count,
                         array="input")


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.integers(-(1 << 40), 1 << 40), min_size=1, max_size=9),
       st.integers(1, 9))
def test_wrong_lengths_and_negative_counts_are_named(values, ranks):
    if len(values) != ranks:
        with pytest.raises(CollectiveError, match=rf"output_splits has {len(values)} counts, "
                                                  rf"expected one per rank \({ranks}\)"):
            check_splits(values, "output_splits", ranks=ranks, count=1 << 62, array="output")
        return
    negative = [i for i, v in enumerate(values) if v < 0]
    if negative:
        first = negative[0]
        with pytest.raises(CollectiveError, match=rf"output_splits\[{first}\]="
                                                  rf"{values[first]}: counts are elements"):
            check_splits(values, "output_splits", ranks=ranks, count=1 << 62, array="output")
    else:
        assert check_splits(values, "output_splits", ranks=ranks, count=1 << 62,
                            array="output") == tuple(values)


@pytest.mark.parametrize(("splits", "message"), [
    ([1, 2.0], r"input_splits\[1\]=2.0: expected an int"),
    ([True, 1], r"input_splits\[0\]=True: expected an int"),
    ([1, None], r"input_splits\[1\]=None: expected an int"),
    ("12", r"input_splits is a str: pass a sequence of one int per rank$"),
    (b"\x01\x02", r"input_splits is a bytes"),
    ({0: 1, 1: 2}, r"input_splits is a dict"),
    (7, r"input_splits is a int"),
    (np.array([1.0, 2.0]), r"numpy array of dtype float64 and shape \(2,\)"),
    (np.array([[1, 2]]), r"numpy array of dtype int64 and shape \(1, 2\)"),
    (np.array([True, False]), r"numpy array of dtype bool"),
])
def test_splits_that_are_not_counts_are_refused(splits, message):
    with pytest.raises(CollectiveError, match=message):
        check_splits(splits, "input_splits", ranks=2, count=100, array="input")


def test_splits_in_device_memory_on_host_memory_say_what_to_pass():
    class DeviceSplits:
        __cuda_array_interface__ = {"shape": (2,), "typestr": "<i4", "data": (0, False),
                                    "version": 3}

    with pytest.raises(CollectiveError, match=r"splits in device memory are read by the GPU "
                                              r"kernels: a communicator on host memory takes "
                                              r"host counts"):
        check_splits(DeviceSplits(), "input_splits", ranks=2, count=100, array="input")


def _table(sends: np.ndarray, expects: np.ndarray) -> np.ndarray:
    """Every rank's published rows: rank r's input_splits are ``sends[r]``, its
    output_splits ``expects[r]``."""
    return np.stack([sends, expects], axis=1).astype(np.int64)


@settings(max_examples=examples(200), deadline=None)
@given(st.integers(1, 8).flatmap(lambda n: st.tuples(
    st.just(n), st.lists(st.integers(0, 50), min_size=n * n, max_size=n * n),
    st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1), st.integers(1, 5)),
             max_size=6))))
def test_mismatches_are_exactly_the_pairs_that_differ(drawn):
    n, flat, changes = drawn
    sends = np.array(flat, np.int64).reshape(n, n)    # sends[r, q]: rank r to rank q
    expects = sends.T.copy()                          # expects[q, r]: q's output_splits[r]
    assert split_mismatches(_table(sends, expects)) == []
    assert splits_disagreement(_table(sends, expects)) is None
    changed = set()
    for q, r, extra in changes:
        expects[q, r] += extra
        changed.add((q, r))
    wrong = {(q, r) for q in range(n) for r in range(n) if expects[q, r] != sends[r, q]}
    pairs = split_mismatches(_table(sends, expects))
    assert {(q, r) for q, r, _, _ in pairs} == wrong == changed
    assert pairs == sorted(pairs)   # receiver, then sender order: the same on every rank
    for q, r, want, got in pairs:
        assert (want, got) == (expects[q, r], sends[r, q])
    message = splits_disagreement(_table(sends, expects))
    assert (message is None) == (not wrong)
    if message is not None:
        assert "\n" not in message
        q, r, want, got = pairs[0]
        assert message.startswith(
            f"ranks disagree on all_to_all_v's splits: rank {q} expects {want} elements "
            f"from rank {r} (output_splits[{r}]={want}), which sends it {got} "
            f"(input_splits[{q}]={got})")
        assert message.count("expects") == min(len(pairs), 4)
        assert ("more pair" in message) == (len(pairs) > 4)


def _fake(cls: type, memory: str, nodes: int = 1) -> Communicator:
    """Enough of an open communicator to reach the all-to-all refusal, without a group."""
    comm = cls.__new__(cls)
    comm._closed = False
    comm._time_sliced = memory == "cuda"
    comm._guard = CallGuard()
    comm._path = types.SimpleNamespace(memory=memory, window=types.SimpleNamespace(closed=False))
    comm.group = types.SimpleNamespace(world=types.SimpleNamespace(node_count=nodes))
    if cls is NodesCommunicator:
        comm._node = types.SimpleNamespace(closed=False)
    return comm


@pytest.mark.parametrize(("cls", "memory", "nodes", "message"), [
    (Communicator, "cuda", 1, r"ranks of this group take turns on a GPU .* start the MPS "
                              r"control daemon"),
    (NodesCommunicator, "host", 2, r"^all_to_all_v on a communicator spanning nodes is not "
                                   r"built: .*across these 2 nodes"),
    (NodesCommunicator, "cuda", 3, r"^all_to_all_v on a communicator spanning nodes is not "
                                   r"built"),
])
def test_all_to_all_is_refused_where_it_cannot_run(cls, memory, nodes, message):
    comm = _fake(cls, memory, nodes)
    array = np.zeros(4, np.float32)
    if cls is NodesCommunicator:
        # The check refuses the collective as an argument: the call still takes part in
        # the group's agreement, so every rank raises (tests/mpi/test_all_to_all.py,
        # test_refused_calls_across_nodes.py); across nodes all_to_all runs.
        with pytest.raises(ArgumentProblem, match=message) as caught:
            comm._refuse_all_to_all("all_to_all_v")
        assert caught.value.argument == "collective"
        return
    calls = [lambda: comm.all_to_all_v(array, array, [1, 1], [1, 1]),
             lambda: comm.bind("all_to_all_v", array, array, [1, 1], [1, 1]),
             lambda: comm.all_to_all(array, array),
             lambda: comm.bind("all_to_all", array, array)]
    for call in calls:
        with pytest.raises(CollectiveError, match=message):
            call()


def test_an_unspellable_cuda_array_as_host_splits_gets_the_one_line_error():
    class Bfloat16Tensor:   # what torch's bfloat16 CUDA tensors do when asked the interface
        @property
        def __cuda_array_interface__(self):
            raise TypeError("Got unsupported ScalarType BFloat16")

    with pytest.raises(CollectiveError, match=r"input_splits is a Bfloat16Tensor: .*read by "
                                              r"the GPU kernels"):
        check_splits(Bfloat16Tensor(), "input_splits", ranks=2, count=100, array="input")


def test_on_gpus_all_to_all_v_in_place_and_device_input_splits_past_max_bytes_are_refused():
    """Checked on the calling rank before anything runs (fake CUDA arrays, never touched):
    the call is refused, blaming the argument, and this rank still takes part in it with
    the kernels of the call its peers make (the guess), marked."""
    class Cuda:
        def __init__(self, count, typestr="<f4", ptr=0x10000):
            self.__cuda_array_interface__ = {"shape": (count,), "typestr": typestr,
                                             "data": (ptr, False), "version": 3}

    comm = _fake(Communicator, "cuda")
    comm._time_sliced = False
    comm._path.device = 0
    comm.group.size = 2
    comm.max_bytes = 64
    comm._signatures = {}
    comm._path.agreed = lambda signature: False   # no call made before
    array = Cuda(8)
    refused = comm._checked("all_to_all_v", array, array, [4, 4], [4, 4])
    assert refused.problem.argument == "output"
    assert re.search(r"all_to_all_v in place \(output is input\) is not run on GPUs: .*pass "
                     r"an output distinct", refused.problem.detail)
    signature, _ = refused.guess
    assert (signature.op, signature.count, signature.dtype) == ("all_to_all_v", 0, "float32")
    splits = Cuda(2, "<i4", ptr=0x90000)
    refused = comm._checked("all_to_all_v", Cuda(20, ptr=0x20000), Cuda(20, ptr=0x30000),
                            [1, 1], splits)
    assert refused.problem.argument == "input"
    assert re.search(r"input \(its splits are on the device\) has 80 bytes.*max_bytes=64",
                     refused.problem.detail)
