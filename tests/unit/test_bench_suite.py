"""The bench suite loader: matrices expand into frozen cases, and every bad input, of
any shape, is a clear ConfigError and nothing else."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ipcshare.bench.suite import ALGORITHMS, BenchCase, algorithms_of, load_suite, parse_suite
from ipcshare.runtime.errors import ConfigError

from ..hypothesis_profiles import examples

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def on_cpu(name: str) -> str:
    """What ``auto`` resolves to on a machine without a GPU."""
    return "host" if name == "auto" else name


def parse(data, **kwargs):
    return parse_suite(data, source="s.yaml", resolve_backend=on_cpu, **kwargs)


def test_a_matrix_expands_into_frozen_cases():
    suite = parse({"ops": ["allgather", "ring"], "backends": ["host"],
                   "timing": ["nccl-tests", "latency"], "min_bytes": "1K", "max_bytes": "64K",
                   "step_factor": 8, "iters": 7})
    assert [case.label for case in suite.cases] == [
        "allgather host single-copy nccl-tests", "allgather host single-copy latency",
        "ring host single-copy nccl-tests", "ring host single-copy latency"]
    case = suite.cases[0]
    assert case.options.sizes() == [1024, 8192, 65536] and case.options.iters == 7
    assert case.baselines == ("mpi",) and case.options.backend == "host"
    assert suite.name == "s" and suite.repeat == 1 and suite.rotate_buffers == 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        case.op = "ring"  # type: ignore[misc]


def test_defaults_auto_and_duplicates():
    suite = parse({"backends": ["auto", "host"], "algorithms": ["auto", "single-copy"]})
    # auto is host here and auto's algorithm is single-copy: one case, not four.
    assert [case.label for case in suite.cases] == ["allgather host single-copy nccl-tests"]
    assert suite.backends == ("host",)


def test_cases_override_the_top_level_and_overrides_win():
    suite = parse({"ops": "allgather, ring", "backends": "host", "min_bytes": "1K",
                   "max_bytes": "1M", "baselines": ["mpi"], "repeat": 2,
                   "cases": [{"timing": ["nccl-tests"]},
                             {"ops": ["ring"], "timing": "latency", "max_bytes": "4K"}]},
                  overrides={"repeat": 3, "min_bw": 2.5, "baselines": "nccl"})
    assert [(case.op, case.timing, case.options.max_bytes) for case in suite.cases] == [
        ("allgather", "nccl-tests", 1 << 20), ("ring", "nccl-tests", 1 << 20),
        ("ring", "latency", 4096)]
    assert all(case.baselines == ("nccl",) for case in suite.cases)
    assert suite.repeat == 3 and suite.min_bw == 2.5


def test_gpu_algorithms_resolve_per_backend():
    suite = parse({"backends": ["cuda-ipc", "cuda-vmm", "host"],
                   "algorithms": ["copy-engine", "single-copy"], "baselines": "none"})
    assert [(c.backend, c.algorithm) for c in suite.cases] == [
        ("cuda-ipc", "copy-engine"), ("cuda-vmm", "copy-engine"), ("host", "single-copy")]
    assert suite.cases[0].baselines == ()


@pytest.mark.parametrize("data,message", [
    ({"ops": ["broadcast"]},
     "unknown op 'broadcast'; choose one of: ring, allgather, allreduce, reducescatter, "
     "alltoall, p2p"),
    ({"ops": ["alltoall"], "splits": ["uneven"]},
     "unknown splits 'uneven'; choose one of: even, random, skewed"),
    ({"backends": ["warp-drive"]}, "unknown backend 'warp-drive'"),
    ({"algorithms": ["tree"]},
     "unknown algorithm 'tree'; choose one of: single-copy, auto, copy-engine, push, pull, "
     "ring, ll, ll128, one-shot, two-shot"),
    ({"backends": ["host"], "algorithms": ["copy-engine"]},
     "backend 'host' runs none of the algorithms copy-engine for allgather; it runs "
     "single-copy"),
    ({"timing": ["warp"]}, "unknown timing mode 'warp'"),
    ({"timing": ["graph"], "backends": ["host"]},
     "timing 'graph' captures GPU allgather, allreduce, reducescatter, alltoall in CUDA graphs; it "
     "cannot time allgather on host"),
    ({"ops": ["ring"], "backends": ["cuda-vmm"], "timing": ["graph"]},
     "it cannot time ring on cuda-vmm"),
    ({"timing": ["after-kernel"], "backends": ["host"]},
     "timing 'after-kernel' launches a GPU kernel before each operation; it cannot time "
     "allgather on host"),
    ({"ops": ["ring"], "backends": ["cuda-ipc"], "algorithms": ["push"]},
     "backend 'cuda-ipc' runs none of the algorithms push for ring; it runs auto, "
     "copy-engine"),
    ({"ops": ["allreduce"], "backends": ["host"], "algorithms": ["single-copy", "ll"]},
     "backend 'host' runs none of the algorithms single-copy, ll for allreduce; it runs "
     "auto, one-shot, two-shot"),
    ({"ops": ["reducescatter"], "backends": ["host"], "algorithms": ["two-shot"]},
     "runs none of the algorithms two-shot for reducescatter; it runs auto, one-shot"),
    ({"ops": ["allreduce"], "reductions": ["prod"]},
     "unknown reduction 'prod'; choose one of: sum, max, min"),
    ({"ops": ["allreduce"], "reductions": []}, "reductions: give at least one"),
    ({"ops": ["allgather", "reducescatter"], "datatype": "uint8"},
     "the reducescatter op reduces float32, float16, bfloat16, int32, not datatype uint8"),
    ({"ops": ["allreduce"], "backends": ["cuda-vmm"], "algorithms": ["auto", "ll"],
      "max_bytes": "4M"},
     "algorithm 'll' takes sizes up to 2M .*, not max_bytes 4M: give ll a case of its own"),
    ({"ops": ["allreduce"], "backends": ["cuda-vmm"], "algorithms": ["ll-two-shot"],
      "max_bytes": "4M"},
     "algorithm 'll-two-shot' takes sizes up to 2M .*, not max_bytes 4M: give ll-two-shot a "
     "case of its own"),
    ({"ops": ["allreduce"], "backends": ["cuda-vmm"], "algorithms": ["ll128-two-shot"],
      "max_bytes": "16M"},
     "algorithm 'll128-two-shot' takes sizes up to 8M .*, not max_bytes 16M: give "
     "ll128-two-shot a case of its own with max_bytes <= 8M"),
    ({"baselines": ["gloo"]}, "unknown baseline 'gloo'"),
    ({"baselines": ["none", "mpi"]}, "'none' cannot be combined"),
    ({"min_bytes": "1M", "max_bytes": "1K"},
     "s.yaml: max_bytes 1K is smaller than min_bytes 1M: the largest size must be at "
     "least the smallest"),
    ({"cases": [{"min_bytes": "4M"}]},
     r"s.yaml: cases\[0\]: max_bytes 1M is smaller than min_bytes 4M"),
    ({"min_bytes": "lots"}, "s.yaml: min_bytes lots is not a size"),
    ({"ops": 5}, "ops: expected a list of names, got 5"),
    ({"ops": [["ring"]]}, "ops: expected names"),
    ({"ops": []}, "ops: give at least one"),
    ({"iters": "ten"}, "s.yaml: iters ten: expected an integer"),
    ({"iters": 0}, "s.yaml: iters 0: must be >= 1"),
    ({"datatype": "complex256"}, "unknown datatype"),
    ({"repeat": True}, "repeat: expected an integer"),
    ({"repeat": 0}, "repeat must be >= 1"),
    ({"rotate_buffers": 0}, r"rotate_buffers must be within \[1, 64\]"),
    ({"min_bw": -1}, "min_bw must be a non-negative"),
    ({"min_bw": "fast"}, "min_bw: expected a number"),
    ({"exchange": "fax"}, "s.yaml: exchange fax: unknown exchange"),
    ({"op": "ring"}, "unknown key 'op' \\(did you mean 'ops'\\?\\)"),
    ({"name": 3}, "name: expected a non-empty string"),
    ({"cases": "all"}, "cases: expected a non-empty list"),
    ({"cases": [3]}, r"cases\[0\]: expected a mapping"),
    ({"cases": [{"repeat": 2}]}, r"cases\[0\]: unknown key 'repeat'"),
    ({1: "x"}, "keys must be strings"),
    (["ops"], "a suite is a mapping"),
])
def test_bad_suites_are_clear_config_errors(data, message):
    with pytest.raises(ConfigError, match=message):
        parse(data)


def test_bad_overrides_are_config_errors():
    with pytest.raises(ConfigError, match="repeat must be >= 1"):
        parse({"ops": ["ring"]}, overrides={"repeat": 0})
    with pytest.raises(ConfigError, match="unknown baseline 'gloo'"):
        parse({"ops": ["ring"]}, overrides={"baselines": "mpi,gloo"})


def test_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_suite(tmp_path / "missing.yaml")
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing\n")
    with pytest.raises(ConfigError, match="is empty"):
        load_suite(empty)
    broken = tmp_path / "broken.yaml"
    broken.write_text("ops: [ring\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_suite(broken)


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("bench-*.yaml")), ids=lambda p: p.name)
def test_shipped_suites_are_valid(path):
    suite = load_suite(path, resolve_backend=lambda name: name)
    assert suite.cases and all(isinstance(case, BenchCase) for case in suite.cases)
    if "cpu" in path.name:
        assert suite.backends == ("host",)
        assert {case.timing for case in suite.cases} == {"nccl-tests", "latency"}
    else:
        assert set(suite.backends) == {"cuda-ipc", "cuda-vmm"}
        assert all(case.baselines[0] == "nccl" for case in suite.cases if case.op != "p2p")
        # Small p2p cases: P2P direct against IPC, ring and all-gather; and the ring with
        # peer access left off (host-staged copies).
        p2p = [case for case in suite.cases if case.op == "p2p"]
        assert [case.label for case in p2p] == ["p2p ring cuda-vmm auto nccl-tests",
                                                "p2p allgather cuda-vmm auto nccl-tests",
                                                "p2p ring host-staged cuda-vmm auto nccl-tests"]
        assert any("mpi" in case.baselines for case in suite.cases)
        assert {case.timing for case in suite.cases} == {
            "nccl-tests", "graph", "latency", "after-kernel"}
        assert {case.algorithm for case in suite.cases} == {
            "auto", "copy-engine", "push", "pull", "ring", "one-shot", "two-shot", "ll",
            "ll-two-shot"}
        assert max(case.options.max_bytes for case in suite.cases) == 1 << 30
        assert min(case.options.min_bytes for case in suite.cases) == 1 << 10
        # ll on the three collectives; PyTorch symmetric memory beside every all-reduce
        # that is not ll's (it is skipped, saying so, for the other ops).
        assert {c.op for c in suite.cases if c.algorithm == "ll"} == {
            "allgather", "allreduce", "reducescatter"}
        assert {c.op for c in suite.cases if c.algorithm == "ll-two-shot"} == {"allreduce"}
        assert all("torch-symm" in c.baselines for c in suite.cases if c.op == "allreduce")
        # The copy-engine all-reduce, eager and in graphs, from 1 MiB.
        assert {c.timing for c in suite.cases
                if c.op == "allreduce" and c.algorithm == "copy-engine"} == {"nccl-tests", "graph"}
        # The push kernels for both reductions, eager and in graphs, on copied and on
        # registered arrays.
        assert {(c.op, c.timing, c.options.register) for c in suite.cases
                if c.algorithm == "push" and c.reduction is not None} == {
            (op, timing, register) for op in ("allreduce", "reducescatter")
            for timing in ("nccl-tests", "graph") for register in (False, True)}
        # Registered arrays (-R 1) for both reductions, eager and in graphs.
        assert {(c.op, c.timing) for c in suite.cases if c.options.register} == {
            (op, timing) for op in ("allreduce", "reducescatter")
            for timing in ("nccl-tests", "graph")}
    # Every shipped suite, CPU and GPU, times both reductions beside a baseline.
    reductions = {(c.op, c.reduction) for c in suite.cases if c.reduction is not None}
    assert {("allreduce", "sum"), ("reducescatter", "sum")} <= reductions
    assert all(c.baselines for c in suite.cases if c.reduction is not None)


def test_cpu_suite_is_named_for_cpu_machines():
    assert any("cpu" in path.name for path in CONFIGS.glob("bench-*.yaml"))


# -- fuzzing: whatever the mapping holds, the loader raises ConfigError or succeeds ---------

_KEYS = ["name", "exchange", "handle", "repeat", "rotate_buffers", "min_bw", "cases", "ops",
         "reductions", "p2p_ops", "backends", "algorithms", "timing", "baselines", "min_bytes",
         "max_bytes", "step_factor", "iters", "warmup", "checks", "datatype"]
_WORDS = ["allgather", "ring", "allreduce", "reducescatter", "p2p", "sum", "max", "min", "host",
          "auto", "cuda-ipc", "cuda-vmm", "single-copy", "copy-engine", "one-shot", "two-shot",
          "ll", "nccl-tests", "latency", "graph", "mpi", "nccl", "none", "1K", "64K", "1M",
          "4M", "float32", "bfloat16", "uint8", "pidfd", "socket", "posix-fd", "fabric",
          "mpi,nccl"]
_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(1 << 70), max_value=1 << 70),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(_WORDS),
    st.text(max_size=6))
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.one_of(st.sampled_from(_KEYS), st.text(max_size=4),
                                                      st.integers()), inner, max_size=4)),
    max_leaves=12)
_mappings = st.dictionaries(st.one_of(st.sampled_from(_KEYS), st.text(max_size=6),
                                      st.integers()), _values, max_size=8)


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mappings)
def test_fuzzed_mappings_raise_only_config_errors(data):
    try:
        suite = parse(data)
    except ConfigError:
        return
    for case in suite.cases:  # what got through is complete and consistent
        assert case.options.min_bytes <= case.options.max_bytes
        assert case.backend in ("host", "cuda-ipc", "cuda-vmm")
        assert case.algorithm in algorithms_of(case.pattern_op, case.backend)
        assert (case.reduction is None) == (case.op not in ("allreduce", "reducescatter"))
        assert (case.p2p_op is not None) == (case.op == "p2p")
        if case.op == "p2p":
            assert case.baselines == () and case.timing == "nccl-tests"
            assert case.options.datatype == "float32"


@settings(max_examples=examples(150), deadline=None)
@given(_values)
def test_fuzzed_documents_of_any_shape_raise_only_config_errors(data):
    try:
        parse(data)
    except ConfigError:
        pass


def test_kernel_algorithms_pair_only_with_allgather_and_graph_timing_with_gpus():
    suite = parse({"ops": ["allgather", "ring"], "backends": ["cuda-vmm"],
                   "algorithms": ["auto", "push", "pull"], "timing": ["nccl-tests"]})
    assert [case.label for case in suite.cases] == [
        "allgather cuda-vmm auto nccl-tests", "allgather cuda-vmm push nccl-tests",
        "allgather cuda-vmm pull nccl-tests", "ring cuda-vmm auto nccl-tests"]
    graphed = parse({"backends": ["cuda-ipc"], "algorithms": ["ring"], "timing": ["graph"]})
    assert [case.label for case in graphed.cases] == ["allgather cuda-ipc ring graph"]


def test_bench_timing_of_each_case():
    from ipcshare.bench.runner import driver_timing, timing_label

    suite = parse({"ops": ["allgather", "ring"], "backends": ["cuda-ipc", "host"],
                   "algorithms": ["auto", "single-copy"], "timing": ["nccl-tests", "latency"]})
    got = {case.label: (driver_timing(case), timing_label(case.timing, case))
           for case in suite.cases}
    # GPU all-gather latency samples replay graphs; the ring and host memory stay eager.
    assert got["allgather cuda-ipc auto latency"] == (
        ("latency", True), "latency (graph replay samples)")
    assert got["ring cuda-ipc auto latency"] == (("latency", False), "latency (eager samples)")
    assert got["allgather host single-copy latency"] == (
        ("latency", False), "latency (eager samples)")
    assert got["allgather cuda-ipc auto nccl-tests"] == (("nccl-tests", False), "nccl-tests")


def test_after_kernel_cases_time_like_nccl_tests_under_their_own_label():
    from ipcshare.bench.runner import driver_timing, timing_label

    suite = parse({"ops": ["allgather", "ring"], "backends": ["cuda-vmm"],
                   "algorithms": ["auto"], "timing": ["nccl-tests", "after-kernel"]})
    got = {case.label: (driver_timing(case), timing_label(case.timing, case))
           for case in suite.cases}
    assert got["allgather cuda-vmm auto after-kernel"] == (
        ("nccl-tests", False), "after-kernel")
    assert got["ring cuda-vmm auto after-kernel"] == (("nccl-tests", False), "after-kernel")


def test_reductions_expand_per_reduction_with_the_library_s_algorithms():
    suite = parse({"ops": ["allreduce", "reducescatter", "ring"], "reductions": ["sum", "max"],
                   "backends": ["host", "cuda-vmm"], "datatype": "bfloat16",
                   "algorithms": ["auto", "two-shot", "ll"], "max_bytes": "2M",
                   "timing": ["nccl-tests"]})
    assert [case.label for case in suite.cases] == [
        "allreduce sum bfloat16 host auto nccl-tests",
        "allreduce sum bfloat16 host two-shot nccl-tests",
        "allreduce sum bfloat16 cuda-vmm auto nccl-tests",
        "allreduce sum bfloat16 cuda-vmm two-shot nccl-tests",
        "allreduce sum bfloat16 cuda-vmm ll nccl-tests",
        "allreduce max bfloat16 host auto nccl-tests",
        "allreduce max bfloat16 host two-shot nccl-tests",
        "allreduce max bfloat16 cuda-vmm auto nccl-tests",
        "allreduce max bfloat16 cuda-vmm two-shot nccl-tests",
        "allreduce max bfloat16 cuda-vmm ll nccl-tests",
        # reduce-scatter has no two-shot; ll runs on GPUs only.
        "reducescatter sum bfloat16 host auto nccl-tests",
        "reducescatter sum bfloat16 cuda-vmm auto nccl-tests",
        "reducescatter sum bfloat16 cuda-vmm ll nccl-tests",
        "reducescatter max bfloat16 host auto nccl-tests",
        "reducescatter max bfloat16 cuda-vmm auto nccl-tests",
        "reducescatter max bfloat16 cuda-vmm ll nccl-tests",
        # The ring takes no reduction: one case per algorithm, whatever reductions says.
        "ring host single-copy nccl-tests", "ring cuda-vmm auto nccl-tests"]
    first = suite.cases[0]
    assert (first.reduction, first.options.op, first.options.datatype) == (
        "sum", "sum", "bfloat16")
    assert suite.cases[5].options.op == "max" and suite.cases[-1].reduction is None
    # reductions default to sum alone.
    default = parse({"ops": ["allreduce"], "backends": ["host"]})
    assert [case.label for case in default.cases] == ["allreduce sum float32 host auto nccl-tests"]


def test_the_algorithm_table_is_the_collectives_layer_s():
    from ipcshare.collectives.algorithms import algorithm_names

    for op, collective in (("allreduce", "all_reduce"), ("reducescatter", "reduce_scatter")):
        assert algorithms_of(op, "host") == ("auto", *algorithm_names("host", collective))
        for backend in ("cuda-ipc", "cuda-vmm"):
            assert set(algorithms_of(op, backend)) == {"auto",
                                                       *algorithm_names("cuda", collective)}
    assert algorithms_of("allgather", "host") == ("single-copy",)
    assert algorithms_of("allgather", "cuda-vmm") == (
        "auto", "copy-engine", "push", "pull", "ring", "ll", "ll128")
    assert algorithms_of("ring", "cuda-ipc") == ("auto", "copy-engine")
    assert set(ALGORITHMS["ll"]) == {"allgather", "allreduce", "reducescatter", "alltoall"}
    assert all(backends and "host" not in backends for backends in ALGORITHMS["ll"].values())
    assert ALGORITHMS["ll-two-shot"] == {"allreduce": ("cuda-ipc", "cuda-vmm")}
    assert ALGORITHMS["ll128-two-shot"] == {"allreduce": ("cuda-ipc", "cuda-vmm")}
    assert set(ALGORITHMS["ll128"]) == {"allgather", "allreduce", "reducescatter", "alltoall"}


def test_reductions_are_graphed_and_sampled_by_graphs_on_gpus():
    from ipcshare.bench.runner import driver_timing, timing_label

    suite = parse({"ops": ["allreduce", "reducescatter"], "backends": ["cuda-ipc"],
                   "timing": ["graph", "latency", "after-kernel"]})
    got = {case.label: (driver_timing(case), timing_label(case.timing, case))
           for case in suite.cases}
    for op in ("allreduce", "reducescatter"):
        assert got[f"{op} sum float32 cuda-ipc auto graph"] == (("nccl-tests", True), "graph")
        assert got[f"{op} sum float32 cuda-ipc auto latency"] == (
            ("latency", True), "latency (graph replay samples)")
        assert got[f"{op} sum float32 cuda-ipc auto after-kernel"] == (
            ("nccl-tests", False), "after-kernel")
    host = parse({"ops": ["allreduce"], "backends": ["host"], "timing": ["latency"]})
    assert driver_timing(host.cases[0]) == ("latency", False)


# -- the p2p op: P2P direct against IPC windows -----------------------------------------


def test_p2p_expands_per_pattern_on_gpu_backends_without_baselines():
    suite = parse({"ops": ["allgather", "p2p"], "backends": ["host", "cuda-vmm", "cuda-ipc"],
                   "baselines": ["nccl"], "min_bytes": "4K", "max_bytes": "64M",
                   "step_factor": 16, "iters": 9})
    assert [case.label for case in suite.cases] == [
        "allgather host single-copy nccl-tests", "allgather cuda-vmm auto nccl-tests",
        "allgather cuda-ipc auto nccl-tests",
        # host memory has no part in P2P direct: the p2p cases pair with the GPU backends
        "p2p ring cuda-vmm auto nccl-tests", "p2p ring cuda-ipc auto nccl-tests",
        "p2p allgather cuda-vmm auto nccl-tests", "p2p allgather cuda-ipc auto nccl-tests"]
    ring = suite.cases[3]
    assert (ring.op, ring.p2p_op, ring.pattern_op, ring.what) == ("p2p", "ring", "ring",
                                                                  "p2p ring")
    assert ring.baselines == () and ring.reduction is None
    assert ring.options.sizes() == [4096, 65536, 1 << 20, 16 << 20]
    assert ring.options.iters == 9 and ring.options.datatype == "float32"
    assert suite.cases[0].baselines == ("nccl",) and suite.cases[0].p2p_op is None
    # --baseline overrides every case's baselines, but P2P direct stays the p2p case's own
    overridden = parse({"ops": ["p2p"], "backends": ["cuda-vmm"]},
                       overrides={"baselines": "mpi"})
    assert all(case.baselines == () for case in overridden.cases)


def test_p2p_ops_choose_the_patterns_and_algorithms_the_ipc_side():
    suite = parse({"ops": ["p2p"], "p2p_ops": "allgather", "backends": ["cuda-vmm"],
                   "algorithms": ["copy-engine", "push"]})
    assert [case.label for case in suite.cases] == [
        "p2p allgather cuda-vmm copy-engine nccl-tests",
        "p2p allgather cuda-vmm push nccl-tests"]
    # an algorithm that does not run a pattern leaves that pairing out, as for other ops
    kernels = parse({"ops": ["p2p"], "backends": ["cuda-vmm"], "algorithms": ["push"]})
    assert [case.label for case in kernels.cases] == ["p2p allgather cuda-vmm push nccl-tests"]
    # the ops and their cases: p2p_ops means nothing to other ops
    mixed = parse({"ops": ["ring", "p2p"], "p2p_ops": ["ring"], "backends": ["cuda-ipc"]})
    assert [case.label for case in mixed.cases] == ["ring cuda-ipc auto nccl-tests",
                                                    "p2p ring cuda-ipc auto nccl-tests"]


def test_p2p_with_auto_on_a_machine_without_gpus_is_kept_for_the_runner_to_skip():
    suite = parse({"ops": ["allgather", "p2p"], "backends": ["auto"]})
    assert [case.label for case in suite.cases] == [
        "allgather host single-copy nccl-tests", "p2p ring host single-copy nccl-tests",
        "p2p allgather host single-copy nccl-tests"]


@pytest.mark.parametrize("data,message", [
    ({"ops": ["p2p"], "backends": ["host"]},
     r"s.yaml: the p2p op sets P2P direct against IPC windows between GPUs, and backend "
     r"'host' has no GPU memory: give the p2p case backends \[cuda-vmm\], \[cuda-ipc\] or "
     r"\[auto\]"),
    ({"backends": ["host"], "cases": [{"ops": ["allgather"]}, {"ops": ["p2p"]}]},
     r"s.yaml: cases\[1\]: the p2p op sets P2P direct against IPC windows between GPUs"),
    ({"ops": ["p2p"], "p2p_ops": ["alltoall"]},
     "unknown p2p op 'alltoall'; choose one of: ring, allgather"),
    ({"ops": ["p2p"], "p2p_ops": []}, "p2p_ops: give at least one of: ring, allgather"),
    ({"ops": ["p2p"], "p2p_ops": {"ring": 1}}, "p2p_ops: expected a list of names"),
    ({"ops": ["p2p"], "p2p_op": ["ring"]}, r"unknown key 'p2p_op' \(did you mean 'p2p_ops'\?\)"),
    ({"ops": ["p2p"], "backends": ["cuda-vmm"], "timing": ["nccl-tests", "latency"]},
     "the p2p op times P2P direct and IPC back to back, as nccl-tests does; it cannot time "
     "'latency': give it a case of its own with timing \\[nccl-tests\\]"),
    ({"ops": ["p2p"], "backends": ["cuda-vmm"], "timing": ["graph"]}, "cannot time 'graph'"),
    ({"ops": ["p2p"], "backends": ["cuda-vmm"], "timing": ["after-kernel"]},
     "cannot time 'after-kernel'"),
    ({"ops": ["allreduce", "p2p"], "backends": ["cuda-vmm"], "datatype": "bfloat16"},
     "the p2p op moves float32 \\(as ipcshare p2p does\\), not datatype bfloat16: give it a "
     "case of its own without datatype"),
    ({"ops": ["p2p"], "backends": ["cuda-vmm"], "algorithms": ["one-shot"]},
     "backend 'cuda-vmm' runs none of the algorithms one-shot for ring, allgather"),
    ({"ops": ["p2p"], "backends": ["cuda-vmm"], "algorithms": ["ll"], "max_bytes": "4M"},
     "algorithm 'll' takes sizes up to 2M"),
])
def test_bad_p2p_suites_are_clear_config_errors(data, message):
    with pytest.raises(ConfigError, match=message):
        parse(data)


def test_the_p2p_constants_are_ipcshare_p2p_s():
    pytest.importorskip("cuda.bindings")  # p2p.direct is GPU code
    from ipcshare.bench.suite import P2P_DATATYPE, P2P_OPS
    from ipcshare.p2p import direct
    from ipcshare.runtime.config import PatternOptions

    assert P2P_OPS == direct.OPS
    assert PatternOptions(datatype=P2P_DATATYPE).element_size == direct.ELEMENT_SIZE


def test_p2p_peer_access_disabled_adds_a_host_staged_case_per_pattern():
    from ipcshare.bench.p2p_case import direct_half_arguments

    suite = parse(yaml.safe_load(
        "ops: [p2p]\np2p_ops: [ring]\np2p_peer_access: [enabled, disabled]\n"
        "backends: [cuda-vmm]\nmin_bytes: 1K\nmax_bytes: 4K\n"))
    assert [case.label for case in suite.cases] == [
        "p2p ring cuda-vmm auto nccl-tests", "p2p ring host-staged cuda-vmm auto nccl-tests"]
    enabled, disabled = (direct_half_arguments(case) for case in suite.cases)
    assert "--peer-access" not in enabled
    assert disabled[-2:] == ["--peer-access", "off"] and disabled[:5] == enabled[:5]
    # YAML's own booleans are not settings of this key: the names are spelled out.
    with pytest.raises(ConfigError, match="p2p_peer_access: expected names"):
        parse(yaml.safe_load("ops: [p2p]\nbackends: [cuda-vmm]\np2p_peer_access: [off]\n"))
    with pytest.raises(ConfigError, match="unknown p2p peer access setting 'sometimes'"):
        parse({"ops": ["p2p"], "backends": ["cuda-vmm"], "p2p_peer_access": ["sometimes"]})


def test_arrays_registered_add_a_case_per_reduction_case_only():
    suite = parse({"ops": ["allreduce", "reducescatter", "allgather"], "backends": ["host"],
                   "reductions": ["sum", "max"], "arrays": ["copied", "registered"]})
    reductions = [c for c in suite.cases if c.reduction is not None]
    assert len(reductions) == 2 * 2 * 2
    assert {c.options.register for c in reductions} == {0, 1}
    assert {c.what for c in reductions if c.options.register} == {
        "allreduce sum float32 registered", "allreduce max float32 registered",
        "reducescatter sum float32 registered", "reducescatter max float32 registered"}
    gathers = [c for c in suite.cases if c.op == "allgather"]
    assert len(gathers) == 1 and gathers[0].options.register == 0
    assert all(c.options.register == 0 for c in parse({"ops": ["allreduce"]}).cases)
    with pytest.raises(ConfigError, match="unknown array placement 'pinned'; choose one of: "
                                          "copied, registered"):
        parse({"ops": ["allreduce"], "arrays": ["pinned"]})


def test_all_to_all_expands_per_splits_graphed_on_gpus_with_the_library_s_algorithms():
    from ipcshare.bench.runner import driver_timing
    from ipcshare.collectives.algorithms import algorithm_names

    suite = parse({"ops": ["alltoall", "allgather"], "splits": ["even", "skewed"],
                   "backends": ["host", "cuda-vmm"], "datatype": "bfloat16",
                   "timing": ["nccl-tests"]})
    assert [case.label for case in suite.cases] == [
        "alltoall even bfloat16 host auto nccl-tests",
        "alltoall even bfloat16 cuda-vmm auto nccl-tests",
        "alltoall skewed bfloat16 host auto nccl-tests",
        "alltoall skewed bfloat16 cuda-vmm auto nccl-tests",
        # splits apply to all-to-all alone
        "allgather host single-copy nccl-tests", "allgather cuda-vmm auto nccl-tests"]
    assert [case.options.splits for case in suite.cases] == [
        "even", "even", "skewed", "skewed", "even", "even"]
    assert parse({"ops": ["alltoall"]}).cases[0].options.splits == "even"
    # In ALGORITHMS' order, where all-gather's ll comes before balanced.
    for backend, memory in (("host", "host"), ("cuda-vmm", "cuda")):
        assert set(algorithms_of("alltoall", backend)) == {"auto",
                                                           *algorithm_names(memory, "all_to_all")}
    graphed = parse({"ops": ["alltoall"], "backends": ["cuda-ipc"], "splits": ["random"],
                     "timing": ["graph", "latency"]})
    assert [driver_timing(case) for case in graphed.cases] == [("nccl-tests", True),
                                                               ("latency", True)]
    with pytest.raises(ConfigError, match="timing 'graph' captures GPU .*alltoall"):
        parse({"ops": ["alltoall"], "backends": ["host"], "timing": ["graph"]})


def test_a_baseline_name_with_a_class_of_its_own_for_all_to_all_is_opened_apart(monkeypatch):
    """torch-symm times all-to-all with another class than all-reduce (another backend of
    symmetric memory): the bench must open each class once, never hand the all-reduce
    baseline an all-to-all case, and keep each class's refusal to itself."""
    import types

    from ipcshare.bench import runner

    class ForReductions:
        @staticmethod
        def check_case(pattern):
            return None

    class ForAllToAll(ForReductions):
        pass

    opened = []

    def fake_class(name, op=None):
        return ForAllToAll if op == "alltoall" else ForReductions

    def fake_open(name, group, pattern):
        cls = fake_class(name, pattern.name)
        opened.append((name, cls))
        if cls is ForAllToAll:
            raise ConfigError("no NVSHMEM here")
        return types.SimpleNamespace(for_pattern=lambda p: ("timed", cls, p.name))

    monkeypatch.setattr(runner, "gpu_baseline_class", fake_class)
    monkeypatch.setattr(runner, "open_gpu_baseline", fake_open)
    suite = parse({"ops": ["allreduce", "alltoall", "reducescatter"], "backends": ["cuda-vmm"],
                   "baselines": ["torch-symm"], "timing": ["nccl-tests"]})
    baselines = runner._Baselines(types.SimpleNamespace(backend_name="cuda-vmm"))
    got = []
    for case in suite.cases:
        pattern = types.SimpleNamespace(name=case.op)
        got.append(baselines.for_case(case, pattern))
    assert opened == [("torch-symm", ForReductions), ("torch-symm", ForAllToAll)]
    (reduce_timed, reduce_skipped), (a2a_timed, a2a_skipped), (rs_timed, _) = got
    assert reduce_timed == [("timed", ForReductions, "allreduce")] and not reduce_skipped
    assert a2a_timed == [] and [s.reason for s in a2a_skipped] == ["no NVSHMEM here"]
    assert rs_timed == [("timed", ForReductions, "reducescatter")]
