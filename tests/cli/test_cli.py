"""The command line as users run it: under mpiexec, with good and bad input.

Every bad input must give one clear line per rank, a non-zero exit, no traceback, no
rank left waiting (each run has a timeout), and nothing left behind.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ipcshare.backends import gpu_count

from ..resources import idle_shm_entries

BIN = Path(sys.executable).parent
MPIEXEC = shutil.which("mpiexec", path=str(BIN)) or shutil.which("mpiexec")
IPCSHARE = [sys.executable, "-m", "ipcshare"]

without_gpu = pytest.mark.skipif(gpu_count()[0] > 0, reason="a GPU is present here")
without_nccl4py = pytest.mark.skipif(importlib.util.find_spec("nccl") is not None,
                                     reason="nccl4py is installed here")
without_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is not None,
                                   reason="torch is installed here")
needs_mpiexec = pytest.mark.skipif(MPIEXEC is None, reason="needs mpiexec (pip install mpich)")


@pytest.fixture
def socket_dir(socket_base, monkeypatch):
    monkeypatch.setenv("IPCSHARE_SOCKET_DIR", str(socket_base))
    return socket_base


def run(args, n=None, timeout=120, cwd=None):
    cmd = ([MPIEXEC, "-n", str(n)] if n else []) + IPCSHARE + args
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd)


def shm_entries():
    """/dev/shm entries that are not MPICH's own (those come and go with any MPI job
    running beside the tests) and that no running job uses: what a finished run left."""
    return idle_shm_entries()


def test_help_runs_without_mpi():
    out = subprocess.run(IPCSHARE + ["--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "ring" in out.stdout and "allgather" in out.stdout
    # Importing the package must not start MPI or CUDA.
    probe = subprocess.run([sys.executable, "-c", "import ipcshare, sys; "
                            "print('mpi4py.MPI' in sys.modules, 'cuda' in sys.modules)"],
                           capture_output=True, text=True, timeout=60)
    assert probe.stdout.split() == ["False", "False"]


def test_typed_errors_are_public_names_and_stay_light():
    # The errors live in runtime/errors.py; users name them through the package.
    probe = subprocess.run([sys.executable, "-c", "import sys; "
                            "from ipcshare import SignalTimeout, errors, IpcShareError; "
                            "from ipcshare.runtime.errors import SignalTimeout as S; "
                            "print(SignalTimeout is S is errors.SignalTimeout, "
                            "issubclass(SignalTimeout, IpcShareError), "
                            "'mpi4py' in sys.modules, 'cuda' in sys.modules)"],
                           capture_output=True, text=True, timeout=60)
    assert probe.stdout.split() == ["True", "True", "False", "False"], probe.stderr


def test_a_reader_that_leaves_stops_the_run_quietly(socket_dir):
    # `ipcshare allgather ... | head -3`: the pipe closes under a long run. Before, that
    # was "internal error ... BrokenPipeError"; now the run stops as a shell tool does.
    before = shm_entries()
    with subprocess.Popen(IPCSHARE + ["allgather", "-b", "1K", "-e", "1G", "-f", "2"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        first = proc.stdout.readline()
        proc.stdout.close()             # the reader leaves after one line
        _, stderr = proc.communicate(timeout=120)
    assert first.startswith(b"# ipcshare")
    assert proc.returncode == 141, stderr.decode()
    assert b"internal error" not in stderr and b"Traceback" not in stderr
    assert b"BrokenPipe" not in stderr, stderr.decode()
    assert shm_entries() == before and list(socket_dir.iterdir()) == []


def test_ranks_whose_reader_leaves_finish_together_and_say_so(socket_dir):
    # A rank of a job cannot stop alone: its peers wait for it in the next collective
    # (before, rank 0 unwound into a window's close and both waited out the 30 s exchange
    # timeout). A launcher that passes stdout through (gforker) shows it.
    from ..launchers import mpich_launcher

    gforker = mpich_launcher("mpiexec.gforker")
    if gforker is None:
        pytest.skip("needs mpiexec.gforker (mpich)")
    before = shm_entries()
    started = time.monotonic()
    with subprocess.Popen([gforker, "-n", "2", *IPCSHARE, "ring", "-b", "1K", "-e", "16M",
                           "-n", "5", "-w", "1"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        first = proc.stdout.readline()
        proc.stdout.close()
        _, stderr = proc.communicate(timeout=60)
    assert first.startswith(b"# ipcshare")
    assert time.monotonic() - started < 20, stderr.decode()
    assert proc.returncode == 141, stderr.decode()   # every rank verified, then said so
    assert b"error" not in stderr and b"Abort" not in stderr, stderr.decode()
    assert shm_entries() == before and list(socket_dir.iterdir()) == []


def test_a_world_of_one_runs_without_mpiexec(tmp_path):
    out = run(["allgather", "-b", "1K", "-e", "64K", "-f", "8", "--json", str(tmp_path / "r.json")])
    assert out.returncode == 0, out.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["world_size"] == 1 and doc["wrong_total"] == 0 and doc["op"] == "allgather"


@needs_mpiexec
@pytest.mark.parametrize("op", ["ring", "allgather"])
def test_json_has_the_design_shape(tmp_path, socket_dir, op):
    path = tmp_path / "out.json"
    out = run([op, "-b", "4K", "-e", "64K", "-f", "4", "-n", "3", "-w", "1",
               "--baseline", "mpi", "--json", str(path)], n=2)
    assert out.returncode == 0, out.stderr
    assert "# Out of bounds values : 0 OK" in out.stdout
    doc = json.loads(path.read_text())
    assert set(doc) == {"ipcshare", "op", "backend", "exchange", "world_size", "nodes",
                        "timing", "devices", "rows", "baseline", "wrong_total", "ceiling",
                        "measurement_errors"}
    assert doc["op"] == op and doc["backend"] == "host" and doc["world_size"] == 2
    assert doc["nodes"] == 1 and doc["exchange"] in ("pidfd", "socket")
    assert doc["measurement_errors"] == []
    assert doc["ceiling"]["gbps"] > 0 and doc["ceiling"]["source"].startswith("host memory")
    row = doc["rows"][0]
    assert {"size", "count", "time_us", "algbw", "busbw", "wrong", "wall_us",
            "ceiling"} <= set(row)
    # every row, ours and the baseline's, carries the ceiling it was held against
    assert all(r["ceiling"] == doc["ceiling"] for r in doc["rows"] + doc["baseline"]["rows"])
    assert all(r["busbw"] <= r["ceiling"]["gbps"] for r in doc["rows"])
    assert doc["baseline"]["name"] == "mpi" and "MPICH" in doc["baseline"]["version"] \
        or "Open MPI" in doc["baseline"]["version"]
    assert [r["size"] for r in doc["baseline"]["rows"]] == [r["size"] for r in doc["rows"]]
    assert list(socket_dir.iterdir()) == []


@needs_mpiexec
def test_latency_json_says_eager_launches_and_the_median(tmp_path, socket_dir):
    # "timing" keeps DESIGN's words (eager / graph); the statistic is a field of its own
    path = tmp_path / "out.json"
    out = run(["ring", "-b", "1K", "-e", "4K", "-f", "4", "-n", "5", "-w", "1",
               "--timing", "latency", "--baseline", "mpi", "--json", str(path)], n=2)
    assert out.returncode == 0, out.stderr
    assert "timing: latency (eager samples)" in out.stdout   # the words stay in the title
    doc = json.loads(path.read_text())
    assert (doc["timing"], doc["statistic"]) == ("eager", "median")
    for row in doc["rows"] + doc["baseline"]["rows"]:
        assert row["p5_us"] <= row["time_us"] == row["p50_us"] <= row["p95_us"]
    # one name for the MPI library, as info and doctor print it
    assert doc["baseline"]["version"].split()[0] in ("MPICH", "Open")
    assert "Version:" not in doc["baseline"]["version"]


@needs_mpiexec
def test_yaml_config_with_flag_override(tmp_path, socket_dir):
    config = tmp_path / "c.yaml"
    config.write_text("backend: host\nmin_bytes: 1K\nmax_bytes: 1M\nstep_factor: 4\niters: 2\n")
    out = run(["ring", "--config", str(config), "-e", "4K"], n=2)
    assert out.returncode == 0, out.stderr
    sizes = [line.split()[0] for line in out.stdout.splitlines()
             if line and not line.startswith("#")]
    assert sizes == ["1024", "4096"]


BAD_INPUTS = [
    # A value is named by the flag the user typed, with the value as typed (every flag:
    # tests/unit/test_option_origins.py).
    (["ring", "--backend", "warp-drive"], "--backend warp-drive: unknown backend; choose one"),
    (["ring", "--exchange", "telepathy"], "--exchange telepathy: unknown exchange"),
    (["ring", "-b", "0"], "-b/--minbytes 0: must be at least 1 byte"),
    (["ring", "-b", "-5"], "-b/--minbytes -5: must be at least 1 byte"),
    (["ring", "-b", "lots"], "-b/--minbytes lots is not a size"),
    (["ring", "-b", "1M", "-e", "1K"], "-e/--maxbytes 1K is smaller than -b/--minbytes 1M: the "
                                       "largest size must be at least the smallest"),
    (["ring", "-b", "4M"], "-e/--maxbytes 1M \\(the default\\) is smaller than -b/--minbytes 4M"),
    (["ring", "-b", "1K", "-e", "4K", "-f", "1"],
     "-f/--stepfactor 1: must be >= 2 to sweep sizes from -b/--minbytes 1K to -e/--maxbytes 4K"),
    (["ring", "-n", "0"], "-n/--iters 0: must be >= 1 \\(reported"),
    # A negative size reaches the size rule (argparse took -4K for a flag).
    (["ring", "-b", "-4K"], "-b/--minbytes -4K: must be at least 1 byte"),
    # The window a sweep needs is sized by its largest size: say which flag that is.
    (["allgather", "-b", "1T", "-e", "1T"], "-e/--maxbytes 1T is too large here: allocate "
     "failed on rank 0@.*: a window of 1.5T on each of the node's 2 ranks needs 3.0T in all, "
     "more than the [0-9.]+[KMG] available: choose a smaller size"),
    (["ring", "--config", "/nonexistent/run.yaml"], "does not exist"),
    pytest.param(["allgather", "--baseline", "nccl"],
                 "nccl baseline setup failed on rank 0@.*: --baseline nccl calls NCCL through "
                 r"nccl4py, which is not importable here \(No module named 'nccl'\); install "
                 "nccl4py .* or use --baseline torch .*\\(reported by ranks 0-1\\)$",
                 marks=without_nccl4py),
    pytest.param(["ring", "--baseline", "torch"], "--baseline torch keeps its buffers in "
                 "PyTorch tensors, and torch is not importable", marks=without_torch),
    (["allgather", "--baseline", "torch-symm"],
     "--baseline torch-symm times all-reduce only .* not allgather; use --baseline nccl or "
     "torch"),
    (["ring", "--baseline", "pytorch"], "--baseline pytorch: unknown baseline"),
    (["allgather", "--graph"], "--graph captures CUDA graphs: it needs a GPU backend"),
    (["ring", "--graph", "--backend", "host"], "--graph captures CUDA graphs"),
    (["allgather", "--after-kernel", "--backend", "host"],
     "--after-kernel launches an empty kernel before every operation: it needs a GPU backend"),
    pytest.param(["ring", "--backend", "cuda-vmm"], "backend 'cuda-vmm' needs a GPU, but ",
                 marks=without_gpu),
    pytest.param(["allgather", "--backend", "cuda-ipc"], "backend 'cuda-ipc' needs a GPU, but ",
                 marks=without_gpu),
    (["ring", "--handle", "carrier-pigeon"], "--handle carrier-pigeon: unknown handle"),
    # It used to be ignored: the host backend shares memfd descriptors, whatever was asked.
    (["ring", "--handle", "fabric", "--backend", "host"], "reading options failed on rank "
     "0@.*: --handle fabric: fabric handles export cuMem allocations of GPU memory: they "
     "need a GPU backend, cuda-vmm, and the backend is host \\(reported by ranks 0-1\\)$"),
    pytest.param(["allgather", "--handle", "fabric"], "--handle fabric: .* they need a GPU "
                 "backend, cuda-vmm, and the backend is host \\(auto's choice here\\)",
                 marks=without_gpu),
    (["allgather", "--algo", "warp"], "--algo warp: unknown algo"),
    (["ring", "--algo", "push"], "the ring op has no 'push' algorithm"),
    pytest.param(["allgather", "--algo", "pull"], "--algo pull runs GPU kernels",
                 marks=without_gpu),
    (["ring", "--json", "/nonexistent-dir/out.json", "-b", "4K", "-e", "4K"], "cannot write"),
]


@needs_mpiexec
@pytest.mark.parametrize("args,message", BAD_INPUTS)
def test_bad_input_fails_cleanly_on_every_rank(args, message, socket_dir):
    import re

    shm = shm_entries()
    n = 2
    out = run(args, n=n, timeout=90)
    assert out.returncode != 0
    errors = [line for line in out.stderr.splitlines() if line.startswith("ipcshare: error:")]
    assert len(errors) == n, out.stderr  # one line per rank
    assert all(re.search(message, line) for line in errors), out.stderr
    assert "Traceback" not in out.stderr and "Traceback" not in out.stdout
    assert list(socket_dir.iterdir()) == []
    assert shm_entries() == shm


@needs_mpiexec
@pytest.mark.parametrize("target", ["folder", "missing/out.json"])
def test_an_unwritable_json_is_refused_before_the_run(tmp_path, socket_dir, target):
    # It used to be found only after the whole sweep had run (and been thrown away).
    (tmp_path / "folder").mkdir()
    out = run(["allgather", "-b", "4K", "-e", "4K", "--json", str(tmp_path / target)], n=2,
              timeout=90)
    errors = [line for line in out.stderr.splitlines() if line.startswith("ipcshare: error:")]
    assert out.returncode == 1 and len(errors) == 2, out.stderr
    assert all(line.startswith("ipcshare: error: reading options failed on rank 0@")
               and f"cannot write {str(tmp_path / target)!r}" in line
               for line in errors), out.stderr
    assert "Out of bounds" not in out.stdout and "Traceback" not in out.stderr


@needs_mpiexec
@pytest.mark.parametrize(("args", "message"), [
    # An unwritable --json was an internal error and an MPI abort, on rank 0 only.
    (["--json", "{tmp}"], "reading options failed on rank 0@.*: cannot write '{tmp}': it is "
                          "a directory$"),
    (["--json", "{tmp}/missing/info.json"], "cannot write '{tmp}/missing/info.json': no "
                                            "directory"),
    # An unknown --inter was taken for auto without a word.
    (["--inter", "rail"], "unknown inter 'rail'; choose one of: auto, nccl, mpi"),
])
def test_bad_info_input_fails_cleanly_on_every_rank(tmp_path, socket_dir, args, message):
    import re

    out = run(["info", *(arg.format(tmp=tmp_path) for arg in args)], n=2, timeout=90)
    errors = [line for line in out.stderr.splitlines() if line.startswith("ipcshare: error:")]
    assert out.returncode == 1 and len(errors) == 2, out.stderr
    assert all(re.search(message.format(tmp=tmp_path), line) for line in errors), out.stderr
    assert "Traceback" not in out.stderr and "internal error" not in out.stderr


@needs_mpiexec
@pytest.mark.parametrize("text,flags,message", [
    ("- 1\n- 2\n", [], "must be a mapping"),
    ("backend: host\nwarp: 9\n", [], "config file '{path}': unknown option 'warp'"),
    # A value from the file is named by its key and the file, not by a flag.
    ("iters: many\n", [], "iters: many in '{path}': expected an integer"),
    ("min_bytes: 0\n", [], "min_bytes: 0 in '{path}': must be at least 1 byte"),
    ("max-bytes: 1K\nmin_bytes: 4K\n", [],
     "max-bytes: 1K in '{path}' is smaller than min_bytes: 4K in '{path}'"),
    ("min_bytes: 4K\n", ["-e", "2K"],
     "-e/--maxbytes 2K is smaller than min_bytes: 4K in '{path}'"),
    ("step_factor: 1\n", ["-b", "1K", "-e", "2K"], "step_factor: 1 in '{path}': must be >= 2"),
])
def test_bad_yaml_fails_cleanly(tmp_path, socket_dir, text, flags, message):
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    out = run(["allgather", "--config", str(config), *flags], n=2, timeout=90)
    errors = [line for line in out.stderr.splitlines() if line.startswith("ipcshare: error:")]
    message = message.format(path=config)
    assert out.returncode != 0 and len(errors) == 2 and all(message in e for e in errors), \
        out.stderr
    assert "Traceback" not in out.stderr


def run_mpmd(*programs: tuple[int, list[str]], timeout=90):
    """One job of several programs (mpiexec's ``:``): ``(ranks, ipcshare arguments)``."""
    cmd = [MPIEXEC]
    for index, (n, args) in enumerate(programs):
        cmd += ([":"] if index else []) + ["-n", str(n), *IPCSHARE, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@needs_mpiexec
@pytest.mark.parametrize(("per_program", "expected"), [
    (1, "ranks disagree on the sizes to run: rank 0 asks for -b 1M -e 1M, rank 1 for "
        "-b 2M -e 2M (reported by ranks 0-1)"),
    (2, "ranks disagree on the sizes to run: ranks 0-1 ask for -b 1M -e 1M, ranks 2-3 for "
        "-b 2M -e 2M (reported by ranks 0-3)"),
])
def test_ranks_disagreeing_on_the_size_are_named_with_the_sizes_they_gave(
        socket_dir, per_program, expected):
    out = run_mpmd((per_program, ["ring", "-b", "1M", "-e", "1M"]),
                   (per_program, ["ring", "-b", "2M", "-e", "2M"]))
    errors = [line for line in out.stderr.splitlines() if line.startswith("ipcshare: error:")]
    assert out.returncode == 1
    assert len(errors) == 2 * per_program, out.stderr
    assert all(line.endswith(expected) for line in errors), out.stderr
    assert "window" not in out.stderr and "more rank" not in out.stderr
    assert "Traceback" not in out.stderr
    assert list(socket_dir.iterdir()) == []


@needs_mpiexec
def test_ranks_disagreeing_on_the_operation_and_iterations_are_named(socket_dir):
    out = run_mpmd((1, ["ring", "-b", "4K", "-e", "4K", "-n", "3"]),
                   (1, ["allgather", "-b", "4K", "-e", "4K"]))
    errors = [line for line in out.stderr.splitlines() if line.startswith("ipcshare: error:")]
    assert out.returncode == 1 and len(errors) == 2, out.stderr
    assert all(line.endswith(
        "ranks disagree on the operation and the iterations: rank 0 asks for ring -n 3, "
        "rank 1 for allgather -n 20 (reported by ranks 0-1)") for line in errors), out.stderr


@needs_mpiexec
def test_sizes_spelled_differently_run_together(socket_dir):
    out = run_mpmd((1, ["ring", "-b", "4K", "-e", "4K", "-n", "2"]),
                   (1, ["ring", "-b", "4096", "-e", "4K", "-n", "2"]))
    assert out.returncode == 0, out.stderr


@needs_mpiexec
def test_a_usage_error_on_one_rank_stops_every_rank(socket_dir):
    # The rank with the bad line used to exit before MPI started, leaving rank 0 waiting
    # in its first collective for ever.
    out = run_mpmd((1, ["allreduce", "-b", "1K", "-e", "1K", "-o", "max"]),
                   (1, ["allreduce", "-b", "1K", "-e", "1K", "-o", "avg"]), timeout=60)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 2 and "Traceback" not in out.stderr, out.stderr
    invalid = "argument -o/--op: invalid choice: 'avg'"
    assert any(line.startswith(f"ipcshare allreduce: error: {invalid}")
               for line in lines), out.stderr  # rank 1's own
    assert any(line.startswith("ipcshare: error: the command line of rank 1@") and invalid
               in line and line.endswith("(see ipcshare allreduce --help)")
               for line in lines), out.stderr  # rank 0's, naming rank 1
    assert list(socket_dir.iterdir()) == []


@needs_mpiexec
@pytest.mark.parametrize(("line", "asked"), [(["allgather", "--help"], "--help"),
                                              (["--version"], "--version")])
def test_help_asked_on_one_rank_only_stops_every_rank(socket_dir, line, asked):
    # The rank printing its help used to leave the job before MPI started, and the others
    # spun in their first collective for ever.
    out = run_mpmd((1, ["allgather", "-b", "4K", "-e", "4K"]), (1, line), timeout=60)
    errors = [line for line in out.stderr.splitlines() if line.startswith("ipcshare: error:")]
    assert out.returncode == 1 and len(errors) == 2, out.stderr
    assert all(line == "ipcshare: error: ranks disagree on the command: rank 0 asks for "
               f"allgather, rank 1 for {asked}" for line in errors), out.stderr
    assert ("usage: ipcshare allgather" in out.stdout) == (asked == "--help")
    assert list(socket_dir.iterdir()) == []


@needs_mpiexec
def test_help_asked_on_every_rank_is_printed_and_exits_zero(socket_dir):
    out = run_mpmd((2, ["allgather", "--help"]), timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("usage: ipcshare allgather") == 2 and not out.stderr


@needs_mpiexec
def test_a_bad_exit_grace_on_one_rank_stops_every_rank(socket_dir):
    # Read after the ranks' first agreement, a bad value used to stop only its own rank,
    # and the other spun until the job was killed.
    cmd = [MPIEXEC, "-n", "1", *IPCSHARE, "allgather", "-b", "4K", "-e", "4K", ":",
           "-n", "1", "-env", "IPCSHARE_PEER_EXIT_GRACE", "soon", *IPCSHARE, "allgather",
           "-b", "4K", "-e", "4K"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    errors = [line for line in out.stderr.splitlines() if line.startswith("ipcshare: error:")]
    assert out.returncode == 1 and len(errors) == 2 and "Traceback" not in out.stderr, \
        out.stderr
    assert any("IPCSHARE_PEER_EXIT_GRACE='soon'" in line for line in errors), out.stderr
    assert any("rank 1" in line for line in errors), out.stderr
    assert list(socket_dir.iterdir()) == []


@needs_mpiexec
@pytest.mark.parametrize("name,value", [
    ("IPCSHARE_EXCHANGE_TIMEOUT", "1e308"), ("IPCSHARE_EXCHANGE_TIMEOUT", "inf"),
    ("IPCSHARE_SIGNAL_TIMEOUT", "1e-9"), ("IPCSHARE_PEER_EXIT_GRACE", "inf"),
])
def test_an_out_of_range_duration_on_one_rank_stops_every_rank_at_once(socket_dir, name,
                                                                       value):
    # Accepted before: 1e308 or inf failed 30 s later with "timestamp out of range for
    # platform time_t", an infinite grace printed OverflowError tracebacks when a peer
    # died, and 1 ns turned every wait into a timeout.
    cmd = [MPIEXEC, "-n", "1", *IPCSHARE, "ring", "-b", "1K", "-e", "1K", ":",
           "-n", "1", "-env", name, value, *IPCSHARE, "ring", "-b", "1K", "-e", "1K"]
    started = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    errors = [line for line in out.stderr.splitlines() if line.startswith("ipcshare: error:")]
    assert out.returncode == 1 and len(errors) == 2 and "Traceback" not in out.stderr, \
        out.stderr
    assert all(f"{name}={value!r} is out of range" in line for line in errors), out.stderr
    assert time.monotonic() - started < 20, out.stderr
    assert list(socket_dir.iterdir()) == []


@needs_mpiexec
@pytest.mark.parametrize("name,value,said", [
    ("IPCSHARE_P2P_FALLBACK", "sideways", "is not a fallback"),
    ("IPCSHARE_P2P_CHUNK", "lots", "is not a size"),
    ("IPCSHARE_DISABLE_P2P", "0-x", "is not a pair of device numbers"),
    ("IPCSHARE_MAX_RANKS_PER_GPU", "0", "must be at least 1"),
    ("IPCSHARE_SHARED_GPU_BARRIER", "maybe", "choose one of: host, stream"),
    ("IPCSHARE_MPI_CUDA_AWARE", "yes", "use 1 (CUDA-aware MPI) or 0"),
])
def test_a_malformed_gpu_setting_is_refused_on_the_host_backend_too(socket_dir, name, value,
                                                                    said):
    # Only GPU paths read these; on host memory they used to be ignored (exit 0), so a
    # typo surfaced only on the GPU node. Set on one rank, every rank stops.
    cmd = [MPIEXEC, "-n", "1", *IPCSHARE, "ring", "--backend", "host", "-b", "1K", "-e", "1K",
           ":", "-n", "1", "-env", name, value, *IPCSHARE, "ring", "--backend", "host",
           "-b", "1K", "-e", "1K"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    errors = [line for line in out.stderr.splitlines() if line.startswith("ipcshare: error:")]
    assert out.returncode == 1 and len(errors) == 2 and "Traceback" not in out.stderr, \
        out.stderr
    assert all(name in line and said in line and "rank 1" in line for line in errors), \
        out.stderr
    assert list(socket_dir.iterdir()) == []


@needs_mpiexec
def test_checks_turned_off_are_reported_as_not_checked_not_as_zero_wrong(tmp_path,
                                                                         socket_dir):
    # -c 0 used to print "#wrong 0" and "Out of bounds values : 0 OK" and write "wrong": 0,
    # as if every element had been verified.
    out = run(["allgather", "-b", "1K", "-e", "4K", "-n", "2", "-w", "1", "-c", "0",
               "--baseline", "mpi", "--json", str(tmp_path / "r.json")], n=2)
    assert out.returncode == 0, out.stderr
    assert "# Out of bounds values : N/A (not checked: -c 0)" in out.stdout
    rows = [line for line in out.stdout.splitlines() if line and not line.startswith("#")]
    assert len(rows) == 3 and all(line.split().count("N/A") == 3 for line in rows), rows
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["checked"] is False and doc["wrong_total"] is None
    assert all(row["wrong"] is None and row["in_place"]["wrong"] is None
               for row in doc["rows"] + doc["baseline"]["rows"])
    checked = run(["allgather", "-b", "1K", "-e", "1K", "-n", "2", "-w", "1",
                   "--json", str(tmp_path / "c.json")], n=2)
    assert checked.returncode == 0, checked.stderr
    doc = json.loads((tmp_path / "c.json").read_text())
    assert "checked" not in doc and doc["wrong_total"] == 0  # the design's keys, unchanged


@needs_mpiexec
def test_a_socket_dir_that_is_not_a_directory_fails_every_rank_at_once(tmp_path, monkeypatch):
    missing = tmp_path / "not-mounted"
    monkeypatch.setenv("IPCSHARE_SOCKET_DIR", str(missing))
    # refused at group setup whatever the exchange (pidfd would never read it)
    out = run(["allgather", "-b", "1K", "-e", "1K", "--exchange", "pidfd"], n=2, timeout=60)
    errors = [line for line in out.stderr.splitlines() if line.startswith("ipcshare: error:")]
    assert out.returncode == 1 and len(errors) == 2 and "Traceback" not in out.stderr
    assert all(line == "ipcshare: error: group setup failed on rank 0@"
               f"{socket.gethostname()}: IPCSHARE_SOCKET_DIR='{missing}' is not a directory "
               "here: create it (one directory mounted in every container of a node), or "
               "unset it (reported by ranks 0-1)" for line in errors), out.stderr
    assert not missing.exists()


@needs_mpiexec
def test_an_exchange_the_backend_cannot_use_is_named_beside_the_one_used(socket_dir):
    # Host memory travels as descriptors, which MPI cannot carry: the header said
    # "exchange: socket" with no word on why the asked-for mpi did not run.
    out = run(["allgather", "-b", "1K", "-e", "1K", "-n", "1", "--exchange", "mpi"], n=2)
    assert out.returncode == 0, out.stderr
    assert "exchange: socket (asked: mpi; descriptors travel by socket)" in out.stdout


@needs_mpiexec
def test_ranks_asking_for_different_commands_are_named(socket_dir):
    out = run_mpmd((1, ["info"]), (2, ["allgather", "-b", "4K", "-e", "4K"]), timeout=60)
    errors = [line for line in out.stderr.splitlines() if line.startswith("ipcshare: error:")]
    assert out.returncode == 1 and len(errors) == 3, out.stderr
    assert all(line == "ipcshare: error: ranks disagree on the command: rank 0 asks for "
               "info, ranks 1-2 for allgather" for line in errors), out.stderr


@needs_mpiexec
@pytest.mark.parametrize("json_on", [0, 1])
def test_json_asked_for_by_one_rank_only(tmp_path, socket_dir, json_on):
    # Only rank 0 writes: its --json decides, and the other ranks' is not a reason for
    # either side to wait for the other in the writing step (it used to hang).
    target = tmp_path / "out.json"
    sweep = ["allgather", "-b", "4K", "-e", "4K", "-n", "2"]
    with_json = (1, [*sweep, "--json", str(target)])
    out = run_mpmd(*((with_json, (1, sweep)) if json_on == 0 else ((1, sweep), with_json)),
                   timeout=60)
    assert out.returncode == 0, out.stderr
    assert target.exists() == (json_on == 0)


@needs_mpiexec
def test_a_flag_the_command_lacks_points_at_the_commands_help(socket_dir):
    # It pointed at `ipcshare --help`, which does not list the command's flags.
    out = run(["ring", "-o", "max"], n=2, timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.splitlines() == ["ipcshare ring: error: unrecognized arguments: -o max "
                                       "(see ipcshare ring --help)"] * 2, out.stderr


def test_usage_errors_are_one_line():
    out = subprocess.run(IPCSHARE + ["ring", "--iters", "x"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "invalid int value" in out.stderr


@needs_mpiexec
def test_a_measurement_error_exits_5_on_every_rank(tmp_path, socket_dir):
    # The ceiling is replaced by one no copy can stay under: every row is a measurement
    # error, printed under its row, listed in the JSON, and the command exits 5.
    program = ("import sys; from ipcshare.patterns import driver; "
               "from ipcshare.topology.link_speed import Ceiling; "
               "driver.run_ceiling = lambda group: Ceiling(1e-6, 'a test ceiling'); "
               "from ipcshare.cli.main import main; sys.exit(main(sys.argv[1:]))")
    path = tmp_path / "out.json"
    out = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "-c", program, "allgather",
                          "-b", "64K", "-e", "64K", "-n", "3", "-w", "1", "--json", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 5, out.stderr
    errors = [line for line in out.stderr.splitlines() if "measurement error" in line]
    assert len(errors) == 2 and all("above the ceiling" in line for line in errors)
    assert "#  ^ measurement error, out-of-place" in out.stdout
    assert "# Measurement errors   : " in out.stdout and "FAILED" in out.stdout
    document = json.loads(path.read_text())
    assert document["measurement_errors"] and document["rows"][0]["errors"]
