"""The GPU baselines without a GPU: which cases each accepts, the buffer layout and data
they verify against (checked by emulating the collectives' semantics on numpy), and
their label and path in the table and the JSON document."""

from __future__ import annotations

import types

import numpy as np
import pytest

from ipcshare.baselines import GPU_BASELINES, gpu_baseline_class
from ipcshare.baselines.gpu import GpuBaseline
from ipcshare.bench.stats import aggregate_runs
from ipcshare.patterns import make_pattern
from ipcshare.patterns.results import BaselineResult, Measurement, Row, RunResult
from ipcshare.patterns.table import Table
from ipcshare.runtime.config import merge_options
from ipcshare.runtime.errors import ConfigError


def test_every_gpu_baseline_is_named_and_labelled():
    assert GPU_BASELINES == ("nccl", "torch", "torch-symm")
    labels = {name: gpu_baseline_class(name).label for name in GPU_BASELINES}
    assert labels == {"nccl": "NCCL called directly (nccl4py)",
                      "torch": "NCCL through torch.distributed",
                      "torch-symm": "PyTorch symmetric memory"}
    assert all(gpu_baseline_class(name).name == name for name in GPU_BASELINES)
    assert all(merge_options({"baseline": name}).baseline == name for name in GPU_BASELINES)


@pytest.mark.parametrize("name", ["nccl", "torch"])
@pytest.mark.parametrize("op", ["allgather", "ring", "allreduce", "reducescatter"])
def test_nccl_baselines_accept_every_op(name, op):
    gpu_baseline_class(name).check_case(make_pattern(op))


@pytest.mark.parametrize(("op", "reduction", "datatype", "message"), [
    ("allgather", "sum", "float32", "times all-reduce only .* not allgather"),
    ("reducescatter", "sum", "float32", "times all-reduce only .* not reducescatter"),
    ("allreduce", "max", "float32", "reduces with -o sum on -d float32 or bfloat16 .* not -o "
                                    "max -d float32"),
    ("allreduce", "sum", "float16", "not -o sum -d float16"),
    ("allreduce", "sum", "int32", "not -o sum -d int32"),
])
def test_torch_symm_refuses_what_its_kernels_cannot_do(op, reduction, datatype, message):
    case = (make_pattern(op, op=reduction, datatype=datatype)
            if op != "allgather" else make_pattern(op))
    with pytest.raises(ConfigError, match=message):
        gpu_baseline_class("torch-symm").check_case(case)


def test_torch_symm_accepts_sum_on_float32_and_bfloat16():
    for datatype in ("float32", "bfloat16"):
        gpu_baseline_class("torch-symm").check_case(
            make_pattern("allreduce", op="sum", datatype=datatype))


def _stand_in(case, rank: int, size: int) -> GpuBaseline:
    """A baseline's layout and data, without torch or a GPU behind it."""
    baseline = object.__new__(GpuBaseline)
    baseline.world = types.SimpleNamespace(rank=rank, size=size)
    baseline.case, baseline.op = case, case.name
    return baseline


def _collective(op: str, inputs: list[np.ndarray], reduction: str, dtype: str,
                rank: int, size: int) -> np.ndarray:
    """What NCCL leaves in rank ``rank``'s output, from every rank's input bytes."""
    if op in ("allgather", "ring"):
        return np.concatenate(inputs)
    typed = np.stack([data.view(dtype).astype(np.float64) for data in inputs])
    reduced = {"sum": typed.sum, "max": typed.max, "min": typed.min}[reduction](axis=0)
    reduced = reduced.astype(dtype).view(np.uint8)
    if op == "allreduce":
        return reduced
    block = len(reduced) // size
    return reduced[rank * block:(rank + 1) * block]


def _address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


def _in_place_offset(op: str, rank: int, plan, size: int) -> int:
    """Input address minus output address that NCCL reads as in place."""
    if op in ("allgather", "ring"):
        return rank * plan.block_bytes
    if op == "reducescatter":
        return -rank * (plan.size // size)
    return 0


@pytest.mark.parametrize("size", [1, 2, 3, 4])
@pytest.mark.parametrize(("op", "reduction", "dtype"), [
    ("allgather", None, "uint8"), ("ring", None, "uint8"), ("allreduce", "sum", "float32"),
    ("allreduce", "min", "int32"), ("reducescatter", "max", "float16"),
    ("reducescatter", "sum", "int32")])
def test_layout_and_expected_bytes_agree_with_the_collectives(op, reduction, dtype, size):
    """Every mode: inputs written where the baseline writes them, the collective applied
    with NCCL's in-place conventions, and the output read where the baseline reads it,
    match the expected bytes exactly; a wrong block is caught."""
    case = make_pattern(op) if reduction is None else make_pattern(op, op=reduction,
                                                                   datatype=dtype)
    element = np.dtype(dtype).itemsize
    plan = case.plan(4096 + 3 * element, size, element)
    for mode in case.modes:
        ranks = [_stand_in(case, rank, size) for rank in range(size)]
        views = []
        for baseline in ranks:
            send_bytes, receive_bytes = baseline._buffer_bytes(plan)
            send = np.full(send_bytes, 0x5A, np.uint8)
            receive = np.full(receive_bytes, 0x5A, np.uint8)
            inputs, output = baseline._views(send, receive, plan, mode)
            if mode == "in-place" or op == "ring":
                assert _address(inputs) - _address(output) == _in_place_offset(
                    op, baseline.world.rank, plan, size)
            else:
                assert not np.shares_memory(inputs, output)
            inputs[:] = baseline._input_bytes(plan, 7)
            views.append((inputs, output))
        sent = [inputs.copy() for inputs, _output in views]
        for rank, (_inputs, output) in enumerate(views):
            output[:] = _collective(op, sent, reduction, dtype, rank, size)
        for rank, (baseline, (_inputs, output)) in enumerate(zip(ranks, views, strict=True)):
            expected = baseline._expected_bytes(plan, 7)
            assert np.array_equal(output, expected), (mode, rank)
            if size > 1 and op in ("allgather", "ring"):
                assert not np.array_equal(expected, np.concatenate(sent[::-1]))


def _measurement(time_us: float, path: str | None) -> Measurement:
    return Measurement(time_us, 1.0, 1.0, 0, path=path)


def _run(paths: list[str]) -> RunResult:
    ours = [Row(1024, 256, {"out-of-place": _measurement(10.0, None)})]
    theirs = [Row(1024, 256, {"out-of-place": _measurement(20.0, paths[0])})]
    return RunResult(version="0", op="allreduce", backend="cuda-vmm", exchange="pidfd",
                     world_size=2, nodes=1, timing="nccl-tests", devices=[], rows=ours,
                     baseline=BaselineResult("nccl", "NCCL 2.28.9", theirs,
                                             "NCCL called directly (nccl4py)"))


def test_the_json_names_the_baseline_and_its_fastest_path():
    document = _run(["symmetric"]).to_dict()
    assert document["baseline"]["name"] == "nccl"
    assert document["baseline"]["label"] == "NCCL called directly (nccl4py)"
    assert document["baseline"]["rows"][0]["path"] == "symmetric"
    assert "path" not in document["rows"][0]  # ours has one path


def test_repetitions_keep_the_label_and_every_fastest_path_seen():
    runs = [_run(["symmetric"]), _run(["plain"]), _run(["symmetric"])]
    runs[1].baseline.rows[0].modes["out-of-place"].time_us = 30.0
    folded = aggregate_runs(runs)
    assert folded.baseline.label == "NCCL called directly (nccl4py)"
    assert folded.baseline.rows[0].primary.path == "plain+symmetric"
    assert aggregate_runs([_run(["plain"])] * 2).baseline.rows[0].primary.path == "plain"


def test_the_table_shows_the_label_and_the_path_column_when_asked():
    result = _run(["symmetric"])
    with_paths = Table(("out-of-place",), "float32", "NCCL called directly (nccl4py)",
                       path_column=True)
    header = "\n".join(with_paths.header("title", []))
    assert "NCCL called directly (nccl4py)" in header and "path" in header
    line = with_paths.row(result.rows[0], result.baseline.rows[0])
    assert line.split()[-1] == "symmetric" and "2.00" in line  # speedup 20 / 10
    plain = Table(("out-of-place",), "float32", "NCCL through torch.distributed")
    assert "path" not in "\n".join(plain.header("title", []))
    assert plain.row(result.rows[0], result.baseline.rows[0]).split()[-1] == "2.00"
