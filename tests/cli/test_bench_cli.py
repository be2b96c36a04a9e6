"""``ipcshare bench`` as users run it: the shipped CPU suite with every output, and bad
input failing cleanly (one line per rank, non-zero exit, no traceback)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from ipcshare.bench.suite import BASELINE_NAMES
from ipcshare.runtime.result_document import load as load_result

from .test_cli import IPCSHARE, MPIEXEC, needs_mpiexec, run, shm_entries, socket_dir  # noqa: F401

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

TINY = """\
ops: [allgather, ring]
backends: [host]
timing: [nccl-tests, latency]
min_bytes: 1K
max_bytes: 64K
step_factor: 8
iters: 3
warmup: 1
"""


def _errors(out: subprocess.CompletedProcess) -> list[str]:
    return [line for line in out.stderr.splitlines() if line.startswith("ipcshare: error:")]


def test_bench_help_runs_without_mpi():
    # Wide enough that argparse wraps no help text (it breaks lines at hyphens).
    out = subprocess.run(IPCSHARE + ["bench", "--help"], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "COLUMNS": "400"})
    assert out.returncode == 0
    for flag in ("--config", "--json", "--plot", "--markdown", "--result", "--repeat", "--min-bw",
                 "--baseline", "--no-progress"):
        assert flag in out.stdout
    # --baseline's text names every baseline a suite accepts (it once named two of four).
    (baseline_help,) = [line for line in out.stdout.splitlines()
                        if line.strip().startswith("--baseline NAMES")]
    for name in BASELINE_NAMES:
        assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", baseline_help), name


def _cpu_suite_cut_short(tmp_path: Path) -> Path:
    """configs/bench-cpu.yaml with every case as shipped, but sizes up to 16 KiB and 3
    iterations (the shipped suite, up to 64 MiB, takes 35 s at 2 ranks on 2 cores)."""
    suite = yaml.safe_load((CONFIGS / "bench-cpu.yaml").read_text())
    suite.update(max_bytes="16K", iters=3, warmup=1)
    for case in suite["cases"]:
        case.pop("max_bytes", None)
        case.pop("iters", None)
    path = tmp_path / "bench-cpu-short.yaml"
    path.write_text(yaml.safe_dump(suite))
    return path


# make test runs the shipped suite's cases at small sizes; make test-slow runs it whole.
@needs_mpiexec
@pytest.mark.parametrize("sizes", ["cut-short", pytest.param("shipped", marks=pytest.mark.slow)])
def test_the_cpu_suite_writes_json_plot_and_report(tmp_path, socket_dir, sizes):  # noqa: F811
    pytest.importorskip("matplotlib")
    files = {name: tmp_path / f"bench.{name}" for name in ("json", "png", "md")}
    result = tmp_path / "bench-result.json"
    config = CONFIGS / "bench-cpu.yaml" if sizes == "shipped" else _cpu_suite_cut_short(tmp_path)
    # One repetition instead of the suite's three keeps the test short.
    out = run(["bench", "--config", str(config), "--repeat", "1",
               "--json", str(files["json"]), "--plot", str(files["png"]),
               "--markdown", str(files["md"]), "--result", str(result)], n=2, timeout=240)
    assert out.returncode == 0, out.stderr
    assert "# Out of bounds values : 0 OK" in out.stdout
    assert "# Summary: speedup = baseline time / our time per size band" in out.stdout
    assert "wrong elements: 0 OK" in out.stdout
    # Runs past 2 s show a progress line on rank 0's stderr, rewritten with \r (which
    # text mode reads as a line end): the shipped suite's always do.
    progress = [part for part in out.stderr.splitlines()
                if part.startswith("ipcshare bench: case")]
    assert progress or sizes != "shipped"
    assert all(re.search(r"case \d+/8 .*, size \w+, \d+ s elapsed", part) for part in progress)
    docs = json.loads(files["json"].read_text())
    assert isinstance(docs, list) and len(docs) == 8
    # how operations were launched, and the statistic where it is not the mean
    assert {doc["timing"] for doc in docs} == {"eager"}
    assert [doc.get("statistic") for doc in docs] == [None, "median"] * 2 + [None] * 4
    for doc in docs:
        assert doc["world_size"] == 2 and doc["wrong_total"] == 0 and doc["backend"] == "host"
        assert doc["baseline"]["name"] == "mpi"
        assert doc["rows"] and all(row["wrong"] == 0 for row in doc["rows"])
    assert [(doc["op"], doc.get("reduction")) for doc in docs] == [
        ("allgather", None), ("allgather", None), ("ring", None), ("ring", None),
        ("allreduce", "sum"), ("reducescatter", "sum"), ("alltoall", None),
        ("alltoall", None)]
    assert [doc.get("splits") for doc in docs[-2:]] == ["even", "skewed"]
    assert files["png"].read_bytes()[:8] == PNG_SIGNATURE
    report = files["md"].read_text()
    assert "](bench.png)" in report and "## Summary" in report and "## Machine" in report
    assert "## Cases: all-reduce" in report and "## Cases: reduce-scatter" in report
    assert "## Cases: all-to-all" in report
    # The result document: every case's rows, one launch, the suite's exit status.
    document = load_result(result)
    assert document["tool"] == "ipcshare bench" and document["exit_status"] == 0
    assert len({row["launch"] for row in document["rows"]}) == 1
    assert {row["details"]["case"] for row in document["rows"]} == {doc["case"] for doc in docs}
    assert {row["mode"] for row in document["rows"]} == {"eager", "latency"}
    assert sum(row["placement"] == "out-of-place" for row in document["rows"]) == \
        sum(len(doc["rows"]) for doc in docs)
    assert list(socket_dir.iterdir()) == []


@needs_mpiexec
def test_nccl_on_host_memory_is_noted_and_skipped(tmp_path, socket_dir):  # noqa: F811
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY)
    path = tmp_path / "out.json"
    out = run(["bench", "--config", str(config), "--baseline", "nccl", "--json", str(path),
               "--repeat", "2"], n=2, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "# nccl baseline skipped: NCCL runs on GPU memory only" in out.stdout
    assert "(repetition 2/2)" in out.stdout
    docs = json.loads(path.read_text())
    assert all(doc["baseline"] is None and doc["skipped_baselines"][0]["name"] == "nccl"
               for doc in docs)
    assert all(doc["repeats"] == 2 for doc in docs)


@needs_mpiexec
def test_a_baseline_that_cannot_time_the_op_is_noted_and_skipped(tmp_path, socket_dir):  # noqa: F811
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY)
    path = tmp_path / "out.json"
    out = run(["bench", "--config", str(config), "--baseline", "torch-symm,mpi", "--json",
               str(path)], n=2, timeout=120)
    assert out.returncode == 0, out.stderr
    assert ("# torch-symm baseline skipped: --baseline torch-symm times all-reduce only"
            in out.stdout)
    docs = json.loads(path.read_text())
    assert all(doc["baseline"]["name"] == "mpi" and doc["baseline"]["label"] ==
               "MPI through mpi4py" for doc in docs)
    assert all(doc["skipped_baselines"][0]["name"] == "torch-symm" for doc in docs)


@needs_mpiexec
def test_min_bw_miss_exits_4_on_every_rank(tmp_path, socket_dir):  # noqa: F811
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY)
    out = run(["bench", "--config", str(config), "--min-bw", "1e9"], n=2, timeout=120)
    assert out.returncode == 4
    errors = _errors(out)
    assert len(errors) == 2 and all("below --min-bw 1e+09 GB/s" in e for e in errors)


BAD_SUITES = [
    ("ops: [broadcast]\n", "unknown op 'broadcast'"),
    ("ops: [ring]\nbackends: [warp-drive]\n", "unknown backend 'warp-drive'"),
    ("ops: [ring]\nalgorithms: [butterfly]\n", "unknown algorithm 'butterfly'"),
    ("ops: [ring]\nbackends: [host]\nalgorithms: [copy-engine]\n",
     "backend 'host' runs none of the algorithms copy-engine"),
    ("ops: [ring]\nmin_bytes: 1M\nmax_bytes: 1K\n",
     "bad.yaml: max_bytes 1K is smaller than min_bytes 1M"),
    ("ops: [ring]\ntiming: [graph]\n", "timing 'graph' captures GPU allgather, allreduce, "
     "reducescatter, alltoall in CUDA graphs; it cannot time ring"),
    ("ops: [allreduce]\nreductions: [sum, prod]\n",
     "unknown reduction 'prod'; choose one of: sum, max, min"),
    ("ops: [allgather]\ntiming: [warp]\n", "unknown timing mode 'warp'"),
    ("ops: ring\niters: many\n", "bad.yaml: iters many: expected an integer"),
    ("- ring\n", "must be a mapping"),
]


@needs_mpiexec
@pytest.mark.parametrize("text,message", BAD_SUITES)
def test_bad_suites_fail_cleanly_on_every_rank(tmp_path, socket_dir, text, message):  # noqa: F811
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    shm = shm_entries()
    out = run(["bench", "--config", str(config)], n=2, timeout=90)
    errors = _errors(out)
    assert out.returncode == 1 and len(errors) == 2, out.stderr
    assert all(re.search(message, line) for line in errors), out.stderr
    assert "Traceback" not in out.stderr + out.stdout
    assert list(socket_dir.iterdir()) == [] and shm_entries() == shm


@needs_mpiexec
@pytest.mark.parametrize("extra,message", [
    ([], "does not exist"),
    (["--json", "/nonexistent-dir/out.json"], "folder '/nonexistent-dir' does not exist"),
    (["--repeat", "0"], "repeat must be >= 1"),
    (["--baseline", "gloo"], "unknown baseline 'gloo'"),
])
def test_bad_flags_fail_cleanly_on_every_rank(tmp_path, socket_dir, extra, message):  # noqa: F811
    config = tmp_path / "suite.yaml"
    if extra:
        config.write_text(TINY)
    out = run(["bench", "--config", str(config), *extra], n=2, timeout=90)
    errors = _errors(out)
    assert out.returncode == 1 and len(errors) == 2, out.stderr
    assert all(message in line for line in errors), out.stderr
    assert "Traceback" not in out.stderr + out.stdout


@needs_mpiexec
def test_plot_without_matplotlib_names_the_extra(tmp_path, socket_dir):  # noqa: F811
    # A matplotlib that cannot be imported shadows the real one.
    fake = tmp_path / "shadow" / "matplotlib"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('matplotlib hidden by the test')\n")
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY)
    cmd = [MPIEXEC, "-n", "2", *IPCSHARE, "bench", "--config", str(config), "--plot",
           str(tmp_path / "x.png")]
    env = dict(os.environ, PYTHONPATH=str(fake.parent))
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=90, env=env)
    errors = _errors(out)
    assert out.returncode == 1 and len(errors) == 2, out.stderr
    assert all("pip install 'ipcshare[plot]'" in line for line in errors)
    assert not (tmp_path / "x.png").exists()


@needs_mpiexec
def test_a_plot_name_that_says_no_format_is_refused_before_the_run(tmp_path,
                                                                  socket_dir):  # noqa: F811
    # Before, `--plot bench.txt` ran the whole suite and wrote PNG bytes under that name.
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY)
    out = run(["bench", "--config", str(config), "--plot", str(tmp_path / "bench.txt")], n=2)
    errors = _errors(out)
    assert out.returncode == 1 and len(errors) == 2, out.stderr
    assert all(".png, .svg, .pdf" in line and "bench.txt" in line for line in errors)
    assert "[case" not in out.stdout and not (tmp_path / "bench.txt").exists()


@needs_mpiexec
def test_ranks_reading_other_suites_are_named_with_their_flags(tmp_path, socket_dir):  # noqa: F811
    small, large = tmp_path / "small.yaml", tmp_path / "large.yaml"
    small.write_text(TINY)
    large.write_text(TINY.replace("max_bytes: 64K", "max_bytes: 512K"))
    cmd = [MPIEXEC, "-n", "1", *IPCSHARE, "bench", "--config", str(small), ":",
           "-n", "1", *IPCSHARE, "bench", "--config", str(large), "--repeat", "1"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    errors = _errors(out)
    assert out.returncode == 1 and len(errors) == 2, out.stderr
    assert all(line.endswith(
        f"ranks disagree on the suite: rank 0 asks for --config {small}, rank 1 for "
        f"--config {large} --repeat 1 (reported by ranks 0-1)") for line in errors), out.stderr
    assert "window" not in out.stderr and "Traceback" not in out.stderr


@needs_mpiexec
def test_ranks_reading_other_suites_from_the_same_flags_are_told_so(tmp_path, socket_dir):  # noqa: F811
    for name, largest in (("a", "64K"), ("b", "512K")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "suite.yaml").write_text(TINY.replace("max_bytes: 64K",
                                                                 f"max_bytes: {largest}"))
    cmd = [MPIEXEC, "-n", "1", "-wdir", str(tmp_path / "a"), *IPCSHARE, "bench", "--config",
           "suite.yaml", ":", "-n", "1", "-wdir", str(tmp_path / "b"), *IPCSHARE, "bench",
           "--config", "suite.yaml"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    errors = _errors(out)
    assert out.returncode == 1 and len(errors) == 2, out.stderr
    assert all("ranks read different suites from the same flags (--config suite.yaml): "
               "rank 0 reads suite 1, rank 1 suite 2: " in line for line in errors), out.stderr
    assert "Traceback" not in out.stderr
