"""``ipcshare alltoall``: the nccl-tests case of Communicator.all_to_all / all_to_all_v on
the host backend, under mpiexec, with good and bad input."""

from __future__ import annotations

import json

import pytest

from ipcshare.cli.main import EXIT_ERROR, EXIT_OK

from .test_cli import needs_mpiexec, run, without_gpu, without_nccl4py, without_torch


@pytest.fixture
def socket_dir(socket_base, monkeypatch):
    monkeypatch.setenv("IPCSHARE_SOCKET_DIR", str(socket_base))
    return socket_base


@needs_mpiexec
@pytest.mark.parametrize(("splits", "n"), [("random", 2), ("skewed", 3), ("even", 3)])
def test_alltoall_verifies_and_reports_nccl_tests_figures(tmp_path, socket_dir, splits, n):
    path = tmp_path / "a.json"
    out = run(["alltoall", "--backend", "host", "-b", "1K", "-e", "64K", "-f", "4",
               "--splits", splits, "--baseline", "mpi", "-n", "3", "-w", "1", "-c", "2",
               "--json", str(path)], n=n)
    assert out.returncode == EXIT_OK, out.stderr
    assert "op: alltoall  backend: host" in out.stdout and f"splits: {splits}" in out.stdout
    assert "# Out of bounds values : 0 OK" in out.stdout
    doc = json.loads(path.read_text())
    assert set(doc) >= {"ipcshare", "op", "backend", "exchange", "world_size", "nodes",
                        "timing", "devices", "rows", "baseline", "wrong_total"}
    assert doc["op"] == "alltoall" and doc["backend"] == "host" and doc["splits"] == splits
    assert doc["world_size"] == n and doc["timing"] == "eager" and doc["wrong_total"] == 0
    # size: each rank's input, n blocks of float32 (the default datatype)
    per_rank = [size // (4 * n) * 4 * n for size in (1024, 4096, 16384, 65536)]
    assert [row["size"] for row in doc["rows"]] == per_rank
    for row in doc["rows"]:
        assert row["count"] * 4 == row["size"] and row["wrong"] == 0
        assert row["busbw"] == pytest.approx(row["algbw"] * (n - 1) / n, rel=1e-2, abs=2e-3)
        assert row["in_place"]["wrong"] == 0
    baseline = doc["baseline"]
    assert baseline["name"] == "mpi" and baseline["version"]
    assert [row["size"] for row in baseline["rows"]] == per_rank
    assert [row["wrong"] for row in baseline["rows"]] == [0] * len(per_rank)
    assert all(row["time_us"] > 0 for row in baseline["rows"])


def _errors(out) -> list[str]:
    return [line for line in out.stderr.splitlines() if line.startswith("ipcshare: error:")]


@needs_mpiexec
@pytest.mark.parametrize(("args", "message"), [
    (["alltoall", "--backend", "host", "--splits", "bogus"],
     "--splits bogus: unknown splits; choose one of: even, random, skewed"),
    (["alltoall", "--backend", "host", "--algo", "one-shot"],
     "the alltoall op has no 'one-shot' algorithm; choose one of: auto, pull, balanced, ll, "
     "copy-engine, push, ll128, eager"),
    # ll with uneven splits: the name is known (it runs even splits), so the refusal says
    # what stops it here, not that no such algorithm exists.
    (["alltoall", "--backend", "host", "--algo", "ll", "--splits", "random"],
     "--algo ll does not run alltoall on host memory (backend host); choose one of: "
     "auto, pull"),
    # A GPU kernel's name on host memory: refused before the table, naming what runs here.
    (["alltoall", "--backend", "host", "--algo", "balanced", "--splits", "random"],
     "--algo balanced does not run alltoall on host memory (backend host); choose one of: "
     "auto, pull"),
    # The copy-engine all-to-all runs even splits on GPUs only: named here for any splits,
    # refused before the table with what runs on this memory.
    (["alltoall", "--backend", "host", "--algo", "copy-engine", "--splits", "random"],
     "--algo copy-engine does not run alltoall on host memory (backend host); choose one "
     "of: auto, pull"),
    # The GPU baselines time all-to-all now: what stops them here is what they lack.
    pytest.param(["alltoall", "--backend", "host", "--baseline", "nccl"],
                 "--baseline nccl calls NCCL through nccl4py, which is not importable here",
                 marks=without_nccl4py),
    pytest.param(["alltoall", "--backend", "host", "--baseline", "torch"],
                 "--baseline torch keeps its buffers in PyTorch tensors, and torch is not "
                 "importable", marks=without_torch),
    pytest.param(["alltoall", "--backend", "host", "--baseline", "torch-symm"],
                 "--baseline torch-symm keeps its buffers in PyTorch tensors, and torch is "
                 "not importable", marks=without_torch),
    (["alltoall", "--backend", "host", "--graph"],
     "--graph captures CUDA graphs: it needs a GPU backend"),
])
def test_bad_alltoall_input_fails_on_every_rank_in_one_line(socket_dir, args, message):
    n = 2
    out = run(args, n=n, timeout=90)
    assert out.returncode == EXIT_ERROR, out.stderr
    errors = _errors(out)
    assert len(errors) == n and len(set(errors)) == 1, out.stderr
    assert message in errors[0]
    assert "Traceback" not in out.stderr


@needs_mpiexec
@pytest.mark.parametrize("splits", ["even", "random"])
def test_registered_arrays_verify_and_say_so(tmp_path, socket_dir, splits):
    out = run(["alltoall", "--backend", "host", "-R", "1", "--splits", splits, "-b", "4K",
               "-e", "64K", "-f", "4", "-n", "2", "-w", "1", "-c", "2",
               "--json", str(tmp_path / "r.json")], n=2)
    assert out.returncode == EXIT_OK, out.stderr
    assert "arrays: registered with the communicator (-R 1)" in out.stdout
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["registered"] is True and doc["wrong_total"] == 0


@needs_mpiexec
def test_splits_belong_to_alltoall(socket_dir):
    out = run(["allgather", "--splits", "random"], n=2, timeout=90)
    assert out.returncode != EXIT_OK
    assert "unrecognized arguments: --splits random" in out.stderr


@needs_mpiexec
@without_gpu
def test_a_gpu_backend_is_refused_before_the_table(socket_dir):
    # No GPU here: the GPU backend itself is refused, on every rank, in one line.
    out = run(["alltoall", "--backend", "cuda-vmm"], n=2, timeout=90)
    assert out.returncode == EXIT_ERROR
    assert len(_errors(out)) == 2 and "Traceback" not in out.stderr


def test_the_command_checks_gpu_memory_before_the_table():
    """The check the command makes before the table, on every rank alike (a collective
    step): ranks taking turns on a GPU are refused in words of what to do; all-to-all-v
    on GPUs keeps its out-of-place rows only (the library refuses it in place there);
    host memory and even splits keep both modes."""
    from types import SimpleNamespace

    from ipcshare.cli.run_pattern import _check_all_to_all_memory
    from ipcshare.patterns.alltoall import AllToAll
    from ipcshare.runtime.errors import ConfigError

    def group(device_memory, time_sliced=None, nodes=1):
        return SimpleNamespace(backend=SimpleNamespace(device_memory=device_memory),
                               backend_name="cuda-vmm" if device_memory else "host",
                               time_sliced_gpus=time_sliced or {},
                               world=SimpleNamespace(node_count=nodes))

    # ll runs all_to_all and all_to_all_v on GPUs, not on host memory.
    _check_all_to_all_memory(group(True), AllToAll("ll"))
    _check_all_to_all_memory(group(True), AllToAll("ll", splits="random"))
    _check_all_to_all_memory(group(True), AllToAll("ll", splits="skewed"))
    with pytest.raises(ConfigError, match=r"^--algo ll does not run alltoall on host memory "
                       r"\(backend host\); choose one of: auto, pull$"):
        _check_all_to_all_memory(group(False), AllToAll("ll"))
    # copy-engine alike (even splits, GPUs).
    _check_all_to_all_memory(group(True), AllToAll("copy-engine"))
    with pytest.raises(ConfigError, match=r"^--algo copy-engine runs alltoall with --splits "
                       r"even only \(all_to_all\); --splits skewed calls all_to_all_v, which "
                       r"it does not run on GPU memory; choose one of: auto, pull, balanced, "
                       r"ll, push, eager, ll128$"):
        _check_all_to_all_memory(group(True), AllToAll("copy-engine", splits="skewed"))

    with pytest.raises(ConfigError, match=r"^--splits skewed: all_to_all_v does not span "
                       r"nodes \(this job spans 2\): use --splits even"):
        _check_all_to_all_memory(group(False, nodes=2), AllToAll(splits="skewed"))
    _check_all_to_all_memory(group(True, nodes=2), AllToAll())   # even: hierarchical

    with pytest.raises(ConfigError, match=r"^all-to-all: ranks of this job take turns on a "
                       r"GPU .* start MPS \(nvidia-cuda-mps-control -d\) first$"):
        _check_all_to_all_memory(group(True, {"GPU-0": [0, 1]}), AllToAll())
    for splits, memory, modes in (("even", True, ("out-of-place", "in-place")),
                                  ("random", True, ("out-of-place",)),
                                  ("skewed", True, ("out-of-place",)),
                                  ("random", False, ("out-of-place", "in-place"))):
        # The case drops the modes its memory cannot run (run_pattern asks it first).
        pattern = AllToAll(splits=splits)
        _check_all_to_all_memory(group(memory), pattern)
        pattern.fit_memory(memory)
        assert pattern.modes == modes


@needs_mpiexec
def test_plot_draws_the_run_and_a_bad_ending_is_refused_before_it(tmp_path, socket_dir):
    pytest.importorskip("matplotlib")
    path = tmp_path / "a.png"
    out = run(["alltoall", "--backend", "host", "-b", "1K", "-e", "16K", "-f", "4",
               "--splits", "random", "--baseline", "mpi", "-n", "2", "-w", "1",
               "--plot", str(path)], n=2)
    assert out.returncode == EXIT_OK, out.stderr
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    refused = run(["alltoall", "--backend", "host", "-b", "1K", "-e", "1K",
                   "--plot", str(tmp_path / "a.bmp")], n=2)
    assert refused.returncode == EXIT_ERROR
    errors = _errors(refused)
    assert len(errors) == 2 and all(".bmp" in line and "png" in line for line in errors)
    assert "op: alltoall" not in refused.stdout and not (tmp_path / "a.bmp").exists()


@needs_mpiexec
def test_across_virtual_nodes_even_splits_run_hierarchically_and_uneven_are_refused(
        tmp_path, socket_dir, monkeypatch):
    from ipcshare.topology.world import VIRTUAL_NODES_ENV

    monkeypatch.setenv(VIRTUAL_NODES_ENV, "2")
    path = tmp_path / "a.json"
    out = run(["alltoall", "--backend", "host", "-b", "1K", "-e", "64K", "-f", "8",
               "--baseline", "mpi", "-n", "2", "-w", "1", "-c", "2", "--json", str(path)],
              n=4)
    assert out.returncode == EXIT_OK, out.stderr
    doc = json.loads(path.read_text())
    assert doc["nodes"] == 2 and doc["wrong_total"] == 0
    assert all(row["wrong"] == 0 and row["in_place"]["wrong"] == 0 for row in doc["rows"])
    refused = run(["alltoall", "--backend", "host", "-b", "1K", "-e", "1K", "--splits",
                   "random"], n=4)
    assert refused.returncode == EXIT_ERROR
    errors = _errors(refused)
    assert len(errors) == 4 and all("all_to_all_v does not span nodes" in e for e in errors)
