"""The phases of tools/gpu_check.py as data: each a name, one line on what it checks, the
fewest GPUs it needs, and a function listing its steps for a machine of G GPUs.

Knobs are environment variables (``Context.knob``), as the phases read them:
TESTS_PARTS, TESTS_FILES, TESTS_MPS, STEP_TIMEOUT_TESTS, STEP_TIMEOUT_BENCH, BENCH_MIN,
BENCH_MAX, BENCH_ITERS, BENCH_BASELINE, QUICK_MAX, QUICK_ITERS, CSWEEP_RANKS, CSWEEP_MAX,
CSWEEP_SLICED, CSWEEP_SLICED_MAX, STEP_TIMEOUT_CSWEEP, COLLECTIVE_TESTS, COLLECTIVE_SWEEPS,
COLLECTIVE_VS_NCCL, COLLECTIVE_RANKS, COLLECTIVE_BASELINES, COLLECTIVE_MIN, COLLECTIVE_MAX,
COLLECTIVE_ITERS, COLLECTIVE_PUSH_MAX, SHARED_MPS, SHARED_QUICK, SHARED_MPS_TESTS,
FALLBACK_MAX, P2P_MAX, TIMER_MIN, TIMER_MAX, TORCH_USER_MIN, TORCH_USER_MAX,
TORCH_USER_FACTOR, STEP_TIMEOUT_TORCH_USER, INTER_MIN, INTER_MAX, STEP_TIMEOUT_INTER,
TRACE_BYTES, TRACE_ALGOS, TRACE_GRAPH, AB_TREE, AB_CASES, AB_MIN, AB_BACKEND, AB_BASELINE,
ALLTOALL_RANKS, ALLTOALL_MIN, ALLTOALL_MAX, ALLTOALL_ITERS, ALLTOALL_ALGOS,
ALLTOALL_SPLITS, ALLTOALL_BASELINES, ALLTOALL_SYMM_SPLITS, ALLTOALL_GRAPH,
ALLTOALL_REGISTER, ALLTOALL_TESTS, ALLTOALL_NCCL_TESTS, STEP_TIMEOUT_ALLTOALL,
NCCL_TESTS_MAX, STEP_TIMEOUT_SUITE, REFUSED_RANKS, REFUSED_ALGOS, FIRST_CALL_WHEEL,
STEP_TIMEOUT_FIRST_CALL, ATTACK_JOBS.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path

from gpu_check_steps import Context, Note, Phase, Step

__all__ = ["PHASES", "DEFAULT_PHASES", "base_environment", "test_files_half", "mpirun",
           "timed_step", "probe_step"]

DEFAULT_PHASES = ("tests", "bench")
# A rank's banner line per rank: the log keeps the table, not one line per rank.
RANK_LINES = r"^#  Rank"
MPS_VARIABLES = ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")
GPU_TESTS = "tests/gpu"


def base_environment() -> dict[str, str]:
    """What every step runs with: no NVLink multicast (it can take shared GPUs out of
    service), Open MPI allowed as root and oversubscribed, unbuffered Python."""
    return {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "OMPI_MCA_rmaps_base_oversubscribe": "1", "PYTHONUNBUFFERED": "1"}


def mpirun(ctx: Context, n: int, *argv: str, forward: Sequence[str] = (),
           mps: bool = False) -> list[str]:
    """``mpiexec -n N --bind-to none`` with ``-x`` for each variable in ``forward`` (and
    MPS's under MPS): Open MPI passes a variable to every rank only when told."""
    names = [*forward, *(MPS_VARIABLES if mps else ())]
    flags = [flag for name in names for flag in ("-x", name)]
    return [ctx.mpiexec, "-n", str(n), "--bind-to", "none", *flags, *argv]


def ipcshare(ctx: Context, *args: str) -> list[str]:
    return [ctx.python, "-m", "ipcshare", *args]


def timed_step(ctx: Context, name: str, n: int, op: str, flags: Sequence[str], *,
               tags: dict[str, str] | None = None, limit_s: int,
               env: dict[str, str] | None = None, forward: Sequence[str] = (),
               mps: bool = False, cwd: str | None = None,
               python_path: str | None = None) -> Step:
    """One timed ``ipcshare OP`` launch at ``n`` ranks writing its --json document
    (into results.jsonl with ``tags``) and its result document (the step's verdict
    reads it)."""
    plain = ctx.scratch_file(name)
    result = ctx.scratch_file(name, ".result.json")
    command = mpirun(ctx, n, *ipcshare(ctx, op, *flags, "--json", plain, "--result", result),
                     forward=forward, mps=mps)
    return Step.of(name, command, limit_s=limit_s, env=env, results=[result],
                   json_tags={plain: tags or {}}, mps=mps, drop=RANK_LINES, cwd=cwd)


def probe_step(ctx: Context, name: str, n: int, script: str, *args: str, limit_s: int,
               mps: bool = False) -> Step:
    """A probe that writes a result document (``--result``) at ``n`` ranks."""
    result = ctx.scratch_file(name, ".result.json")
    return Step.of(name, mpirun(ctx, n, ctx.python, script, *args, "--result", result, mps=mps),
                   limit_s=limit_s, results=[result], mps=mps)


def pytest_mpi(ctx: Context, n: int, paths: Sequence[str], *, extra: Sequence[str] = (),
               forward: Sequence[str] = (), mps: bool = False, marker: str = "gpu") -> list[str]:
    """The GPU (or MPI) tests of ``paths`` at ``n`` ranks."""
    return mpirun(ctx, n, ctx.python, "-m", "pytest", "-q", "-rs", "--with-mpi", "-m", marker,
                  "-p", "no:cacheprovider", *extra, *paths, forward=forward, mps=mps)


def _limit(ctx: Context, name: str, default: int) -> int:
    return int(ctx.knob(name, str(default)))


def _words(ctx: Context, name: str, default: str) -> list[str]:
    return ctx.knob(name, default).split()


def test_files_half(number: int, entries: Sequence[str], root: Path) -> list[str]:
    """Every other test file of ``entries`` (folders expanded to their sorted
    ``test_*.py``), from the first (``number`` 1) or the second (2): two runs of about
    equal length that together take every file once."""
    files: list[str] = []
    for entry in entries:
        path = root / entry
        if path.is_dir():
            files += sorted(str(p.relative_to(root)) for p in path.rglob("test_*.py"))
        else:
            files.append(entry)
    return files[number - 1::2]


# -- tests ----------------------------------------------------------------------------
def tests_steps(ctx: Context) -> list[Step | Note]:
    """The GPU test suite at 2 ranks (under MPS where they outnumber the GPUs), the
    examples, 4 and 2xG ranks, 2 ranks taking turns on GPU 0, and tests/mpi under the
    node's MPI."""
    g = ctx.gpus
    parts = set(_words(ctx, "TESTS_PARTS", "2 examples 4 2G shared mpi"))
    files = _words(ctx, "TESTS_FILES", GPU_TESTS)
    limit = _limit(ctx, "STEP_TIMEOUT_TESTS", 420)
    # The slowest tests listed: they say where a long run's time goes.
    durations = ["--durations=25"]
    steps: list[Step | Note] = []
    if "2" in parts:
        mps = g < 2 and ctx.knob("TESTS_MPS", "1") != "0"
        where = "under MPS on one GPU" if mps else ("taking turns on one GPU" if g < 2 else "")
        steps.append(Step.of(f"pytest {' '.join(files)}, 2 ranks {where}".rstrip(),
                             pytest_mpi(ctx, 2, files, extra=durations, mps=mps),
                             limit_s=limit, mps=mps))
    if "examples" in parts and g >= 2:
        # They launch mpiexec themselves (2 ranks on 2 GPUs), or drive both GPUs.
        steps.append(Step.of(
            "pytest the examples and the line probe",
            [ctx.python, "-m", "pytest", "-q", "-rs", "-s", "-m", "gpu and not mpi", "-p",
             "no:cacheprovider", "tests/gpu/test_examples.py",
             "tests/gpu/test_triton_examples.py", "tests/gpu/test_line_probe_gpu.py"],
            limit_s=limit))
    if "4" in parts and g >= 4:
        steps.append(Step.of(f"pytest {' '.join(files)}, 4 ranks",
                             pytest_mpi(ctx, 4, files, extra=durations), limit_s=limit))
    if g >= 2:
        # Two ranks a GPU: every GPU shared, contexts taking turns.
        if "2G" in parts:
            steps.append(Step.of(f"pytest {' '.join(files)}, {2 * g} ranks on {g} GPUs",
                                 pytest_mpi(ctx, 2 * g, files, extra=durations),
                                 limit_s=limit))
        for half in (1, 2):
            if f"2G-{half}" in parts:
                chosen = test_files_half(half, files, ctx.repo)
                steps.append(Step.of(f"pytest tests/gpu, {2 * g} ranks on {g} GPUs, files "
                                     f"half {half}", pytest_mpi(ctx, 2 * g, chosen,
                                                                extra=durations),
                                     limit_s=limit))
    if "shared" in parts:
        steps.append(Step.of(f"pytest {' '.join(files)}, 2 ranks taking turns on GPU 0",
                             pytest_mpi(ctx, 2, files, extra=durations,
                                        forward=["CUDA_VISIBLE_DEVICES"]),
                             limit_s=limit, env={"CUDA_VISIBLE_DEVICES": "0"}))
    if "mpi" in parts:
        # The MPI suite under the node's own MPI, not only the MPICH wheel CI uses.
        for n in (2, 3):
            steps.append(Step.of(f"pytest tests/mpi, {n} ranks (node MPI)",
                                 pytest_mpi(ctx, n, ["tests/mpi"], marker="mpi"),
                                 limit_s=limit))
    return steps


# -- a short timing phase that runs on any node ------------------------------------------
def quick_steps(ctx: Context) -> list[Step | Note]:
    """All-reduce (graphs and eager) and all-to-all (graphs), 8 B to QUICK_MAX, at
    max(2, G) ranks: against NCCL where every rank has a GPU of its own; under MPS and
    without a baseline where ranks share one (NCCL refuses two ranks on one GPU)."""
    g = ctx.gpus
    n = max(2, g)
    mps = n > g
    maximum = ctx.knob("QUICK_MAX", "1M")
    common = ["--backend", "cuda-vmm", "-b", "8", "-e", maximum, "-f", "4", "-n",
              ctx.knob("QUICK_ITERS", "50"), "-w", "5", "-c", "1"]
    baseline = ["--baseline", "none"] if mps else ["--baseline", "nccl"]
    steps: list[Step | Note] = []
    if mps:
        steps.append(Note(f"{n} ranks on {g} GPU: under MPS, no NCCL baseline (NCCL runs one "
                          "rank per GPU); the figures are checks, not speed"))
    limit = _limit(ctx, "STEP_TIMEOUT_BENCH", 150)
    for op, extra, label in (("allreduce", ["--graph"], "graph"),
                             ("allreduce", [], "eager"),
                             ("alltoall", ["--splits", "even", "--graph"], "graph")):
        steps.append(timed_step(ctx, f"{op} auto n={n} {label}{' under MPS' if mps else ''}",
                                n, op, [*common, *baseline, *extra],
                                tags={"quick_case": f"{op}-{label}"}, limit_s=limit, mps=mps))
    return steps


# -- bench ----------------------------------------------------------------------------
def _window_setup(ctx: Context, backend: str, n: int) -> Step:
    result = ctx.scratch_file(f"window-setup-{backend}", ".result.json")
    return Step.of(f"window setup {backend} n={n}",
                   mpirun(ctx, n, *ipcshare(ctx, "allgather", "--backend", backend, "-b", "1M",
                                            "-e", "1M", "-n", "5", "-w", "1", "-c", "1",
                                            "--result", result)),
                   limit_s=120, results=[result],
                   drop=r"^(?!.*(window setup|Out of bounds))")


def bench_steps(ctx: Context) -> list[Step | Note]:
    """Window setup time, ring and all-gather sweeps of both GPU backends against
    BENCH_BASELINE, one all-gather after an empty kernel, and on 4 GPUs the all-gather
    over 2 virtual nodes."""
    g = ctx.gpus
    limit = _limit(ctx, "STEP_TIMEOUT_BENCH", 150)
    baseline = ctx.knob("BENCH_BASELINE", "nccl")

    def bench(op: str, backend: str, n: int, *extra: str, name: str | None = None,
              env: dict[str, str] | None = None) -> Step:
        flags = ["--backend", backend, "-b", ctx.knob("BENCH_MIN", "1M"), "-e",
                 ctx.knob("BENCH_MAX", "1G"), "-f", "4", "-n", ctx.knob("BENCH_ITERS", "20"),
                 "-w", "5", "-c", "1", "--baseline", baseline, *extra]
        return timed_step(ctx, name or f"bench {op} {backend} n={n}", n, op, flags,
                          limit_s=limit, env=env, forward=list(env or {}))

    steps: list[Step | Note] = [_window_setup(ctx, b, g) for b in ("cuda-ipc", "cuda-vmm")]
    for backend in ("cuda-ipc", "cuda-vmm"):
        for n in [2] + ([4] if g >= 4 else []):
            steps += [bench(op, backend, n) for op in ("allgather", "ring")]
    if baseline != "mpi":
        steps.append(bench("allgather", "cuda-vmm", g, "--after-kernel",
                           name=f"bench allgather cuda-vmm n={g} after a kernel"))
    if g >= 4:
        steps.append(bench("allgather", "cuda-vmm", 4, name="bench allgather cuda-vmm n=4 as "
                           "2 virtual nodes x 2", env={"IPCSHARE_VIRTUAL_NODES": "2"}))
    return steps


def suite_steps(ctx: Context) -> list[Step | Note]:
    """``ipcshare bench`` with configs/bench-h200-x$G.yaml: JSON, plot and report under
    bench/, its result document in result-documents.jsonl."""
    g = ctx.gpus
    config = f"configs/bench-h200-x{g}.yaml"
    if not (ctx.repo / config).exists():
        return [Note(f"no {config} for {g} GPUs; skipped")]
    folder = ctx.out / "bench"
    folder.mkdir(parents=True, exist_ok=True)
    stem = str(folder / f"bench-h200-x{g}-n{g}")
    result = ctx.scratch_file("suite", ".result.json")
    return [Step.of(f"bench suite {config} n={g}",
                    mpirun(ctx, g, *ipcshare(ctx, "bench", "--config", config, "--json",
                                             f"{stem}.json", "--plot", f"{stem}.png",
                                             "--markdown", f"{stem}.md", "--result", result)),
                    limit_s=_limit(ctx, "STEP_TIMEOUT_SUITE", 540), results=[result])]


def sweep_steps(ctx: Context) -> list[Step | Note]:
    """Every all-gather algorithm at 3 and 2xG ranks, 1 byte to 387 MiB in odd sizes and
    1 GiB, verified, eager and in graphs."""
    g = ctx.gpus
    steps: list[Step | Note] = [_window_setup(ctx, b, g) for b in ("cuda-ipc", "cuda-vmm")]

    def sweep(n: int, algo: str, *extra: str) -> Step:
        label = " in graphs" if extra else ""
        name = f"sweep allgather {algo} n={n} 1B-1G{label}"
        results = [ctx.scratch_file(name, ".result.json") for _ in range(2)]

        def one(result: str, low: str, *more: str) -> list[str]:
            return mpirun(ctx, n, *ipcshare(ctx, "allgather", "--backend", "cuda-vmm",
                                            "--algo", algo, "-b", low, "-e", "1G", *more, "-n",
                                            "2", "-w", "1", "-c", "2", "-d", "uint8", *extra,
                                            "--result", result))
        return Step.of(name, one(results[0], "1", "-f", "9"), one(results[1], "1G"),
                       limit_s=240, drop=RANK_LINES, results=results)

    for n in (3, 2 * g):
        steps += [sweep(n, algo) for algo in ("copy-engine", "push", "pull", "ring")]
        steps += [sweep(n, "auto", "--graph"), sweep(n, "push", "--graph")]
    return steps


def csweep_steps(ctx: Context) -> list[Step | Note]:
    """The collectives through the public API (tools/checks/collective_sweep.py)
    at CSWEEP_RANKS: ranks up to G on GPUs of their own, more under MPS (correctness
    only); then G + 1 ranks taking turns (stepped and auto)."""
    g = ctx.gpus
    limit = _limit(ctx, "STEP_TIMEOUT_CSWEEP", 400)
    ranks = sorted({int(n) for n in _words(ctx, "CSWEEP_RANKS", f"2 3 4 {2 * g}")})
    sweep = "tools/checks/collective_sweep.py"

    def run(n: int, label: str, mps: bool, *extra: str) -> Step:
        where = {"own": "", "mps": " under MPS", "time-sliced": " time-sliced"}[label]
        return Step.of(f"csweep n={n}{where}",
                       mpirun(ctx, n, ctx.python, sweep, "--max-bytes",
                              ctx.knob("CSWEEP_MAX", "1G"), "--json",
                              str(ctx.out / f"csweep-{label}-n{n}.json"), *extra, mps=mps),
                       limit_s=limit, mps=mps)

    steps: list[Step | Note] = [run(n, "own" if n <= g else "mps", n > g) for n in ranks]
    if ctx.knob("CSWEEP_SLICED", "1") != "0":
        steps.append(run(g + 1, "time-sliced", False, "--algos", "stepped,auto",
                         "--max-bytes", ctx.knob("CSWEEP_SLICED_MAX", "1G")))
    return steps


def doctor_steps(ctx: Context) -> list[Step | Note]:
    """``ipcshare doctor --quick``, the full check (JSON and YAML under doctor/), and
    doctor at 2 ranks a GPU."""
    g = ctx.gpus
    (ctx.out / "doctor").mkdir(parents=True, exist_ok=True)
    report = ctx.out / "doctor" / f"gpu-x{g}"
    return [
        Step.of(f"doctor --quick n={g}", mpirun(ctx, g, *ipcshare(ctx, "doctor", "--quick")),
                limit_s=120),
        Step.of(f"doctor (full) n={g}", mpirun(ctx, g, *ipcshare(
            ctx, "doctor", "--json", f"{report}.json", "--yaml", f"{report}.yaml")),
            limit_s=180),
        Step.of(f"doctor --quick n={2 * g} (2 ranks per GPU)",
                mpirun(ctx, 2 * g, *ipcshare(ctx, "doctor", "--quick")), limit_s=120)]


def faults_steps(ctx: Context) -> list[Step | Note]:
    """The dead-peer tests under MPICH's gforker (wheels brought in .whl/), and a soak of
    both GPU backends (window cycles and ring iterations, counts flat)."""
    prefix = ctx.mpich_prefix
    steps: list[Step | Note] = []
    sites = sorted(Path(prefix).glob("lib/python3*/site-packages"))
    if not (Path(prefix) / "bin" / "mpiexec.gforker").exists() or not sites:
        steps.append(Step.of("dead-peer tests under gforker",
                             ["sh", "-c", f"echo 'no MPICH under {prefix} (bring the mpich "
                              "and mpi4py wheels in .whl/)'; exit 1"], limit_s=10))
    else:
        path = os.pathsep.join(filter(None, [str(sites[0]), ctx.knobs.get("PYTHONPATH")]))
        steps.append(Step.of(
            "dead-peer tests under gforker (host and GPU backends)",
            # Not the 20-run repetitions (make test-slow's): a step of its own would fit.
            [ctx.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "-m",
             "not slow", "tests/faults", "tests/gpu/test_gpu_faults.py"], limit_s=300,
            env={"PYTHONPATH": path, "MPI4PY_LIBMPI": f"{prefix}/lib/libmpi.so.12",
                 "IPCSHARE_MPICH_BIN": f"{prefix}/bin"}))
        # The attacks across PID namespaces with this node's kernel: a relay, a silent and
        # a replaying stranger (ATTACK_JOBS jobs each).
        steps.append(Step.of("socket attacks across PID namespaces (relay, stranger)", *(
            [ctx.python, "tools/checks/socket_attacks.py", what, "--jobs",
             ctx.knob("ATTACK_JOBS", "5")] for what in ("relay", "stranger")), limit_s=300,
            env={"PYTHONPATH": path, "MPI4PY_LIBMPI": f"{prefix}/lib/libmpi.so.12",
                 "IPCSHARE_MPICH_BIN": f"{prefix}/bin"}))
    if ctx.gpus >= 2:
        (ctx.out / "soak").mkdir(parents=True, exist_ok=True)
        soak = "tools/checks/soak.py"
        for n, backend, windows, iters in ((2, "cuda-vmm", 10000, 100000),
                                           (2, "cuda-ipc", 10000, 100000),
                                           (ctx.gpus, "cuda-vmm", 1000, 20000)):
            steps.append(Step.of(
                f"soak {backend} n={n}: {windows} windows, {iters} ring iterations",
                mpirun(ctx, n, ctx.python, soak, "--backend", backend, "--windows",
                       str(windows), "--ring-iters", str(iters), "--json",
                       str(ctx.out / "soak" / f"soak-{backend}-n{n}.json")), limit_s=300))
    return steps


def fallback_steps(ctx: Context) -> list[Step | Note]:
    """GPU pairs without peer access (IPCSHARE_DISABLE_P2P): the fallback tests, what
    info and doctor report, and copy-engine sweeps direct, relayed and host-staged."""
    g = ctx.gpus
    limit = _limit(ctx, "STEP_TIMEOUT_TESTS", 420)
    disabled = "0-2,1-3" if g >= 4 else "0-1"
    forward = ["IPCSHARE_DISABLE_P2P", "IPCSHARE_P2P_FALLBACK"]
    files = ["tests/gpu/test_fallbacks.py", "tests/gpu/test_windows.py"]
    pick = ["-k", "fallback or peer_access"]
    steps: list[Step | Note] = [Step.of("fallback tests n=2 (host-staged)",
                                        pytest_mpi(ctx, 2, files, extra=pick), limit_s=limit)]
    if g >= 3:
        steps.append(Step.of(f"fallback tests n={g} (relay and host-staged)",
                             pytest_mpi(ctx, g, files, extra=pick), limit_s=limit))
    steps.append(Step.of(f"fallback tests n={2 * g} (2 ranks per GPU)",
                         pytest_mpi(ctx, 2 * g, files, extra=pick), limit_s=limit))
    env = {"IPCSHARE_DISABLE_P2P": disabled, "IPCSHARE_P2P_FALLBACK": "auto"}
    steps.append(Step.of(f"ipcshare info, {disabled} disabled", mpirun(
        ctx, g, *ipcshare(ctx, "info", "--json", str(ctx.out / "info-fallback.json")),
        forward=forward), limit_s=120, env=env))
    steps.append(Step.of(f"doctor --quick n={g}, {disabled} disabled", mpirun(
        ctx, g, *ipcshare(ctx, "doctor", "--quick"), forward=forward), limit_s=180, env=env))
    for op in ("allgather", "ring"):
        # The ring only uses neighbour pairs: disable ring edges for it.
        pairs = "0-1,2-3" if op == "ring" and g >= 4 else disabled
        cases = [("direct", "", "auto")]
        if g >= 3:
            cases.append(("relay", pairs, "relay"))
        cases.append(("host-staged", pairs, "host"))
        for label, off, fallback in cases:
            flags = ["--backend", "cuda-vmm", "--algo", "copy-engine", "-b", "1M", "-e",
                     ctx.knob("FALLBACK_MAX", "256M"), "-f", "4", "-n",
                     ctx.knob("BENCH_ITERS", "20"), "-w", "3", "-c", "1"]
            name = f"fallback {op} {label}{f' ({off})' if off else ''} n={g}"
            steps.append(timed_step(ctx, name, g, op, flags, tags={"fallback": label},
                                    limit_s=_limit(ctx, "STEP_TIMEOUT_BENCH", 150),
                                    env={"IPCSHARE_DISABLE_P2P": off,
                                         "IPCSHARE_P2P_FALLBACK": fallback},
                                    forward=forward))
    return steps


# -- collectives ------------------------------------------------------------------------
def _collective(ctx: Context, n: int, op: str, algo: str, *extra: str, low: str | None = None,
                high: str | None = None, iters: str | None = None,
                name: str | None = None) -> Step:
    """One sweep of ``op`` by ``algo`` at ``n`` ranks into results.jsonl, tagged
    ``collective_case`` (tools/analysis/auto_rows.py reads them)."""
    flags = ["--backend", "cuda-vmm", "--algo", algo, "-b", low or ctx.knob("COLLECTIVE_MIN", "8"),
             "-e", high or ctx.knob("COLLECTIVE_MAX", "64M"), "-f", "4", "-n",
             iters or ctx.knob("COLLECTIVE_ITERS", "50"), "-w", "5", "-c", "1", *extra]
    tag = f"{op}-{algo}" + (f" {' '.join(extra)}" if extra else "")
    return timed_step(ctx, name or f"{op} {algo} n={n} {' '.join(extra)}".rstrip(), n, op,
                      flags, tags={"collective_case": tag},
                      limit_s=_limit(ctx, "STEP_TIMEOUT_BENCH", 150))


def _auto_rows(ctx: Context) -> Step:
    return Step.of("auto rows from the sweeps (auto-rows.md)",
                   [ctx.python, "tools/analysis/auto_rows.py", str(ctx.out / "results.jsonl"),
                    "--out", str(ctx.out / "auto-rows.md")], limit_s=60)


def _gpu_tests(ctx: Context, n: int, *paths: str, name: str, mps: bool = False) -> Step:
    return Step.of(name, pytest_mpi(ctx, n, paths, mps=mps),
                   limit_s=_limit(ctx, "STEP_TIMEOUT_TESTS", 420), mps=mps)


def collectives_steps(ctx: Context) -> list[Step | Note]:
    """The communicator's and baselines' GPU tests at 2 ranks; each all-reduce and
    reduce-scatter algorithm 8 B - 64 MiB eager and in graphs; auto against NCCL in the
    same launch (copied and -R 1 arrays); the push kernels to COLLECTIVE_PUSH_MAX."""
    g = ctx.gpus
    n = min(int(ctx.knob("COLLECTIVE_RANKS", "2")), g)
    steps: list[Step | Note] = []
    if ctx.knob("COLLECTIVE_TESTS", "1") != "0":
        steps += [
            _gpu_tests(ctx, 2, "tests/gpu/test_gpu_communicator.py",
                       name="Communicator GPU tests n=2"),
            _gpu_tests(ctx, 2, "tests/gpu/test_register_gpu.py", name="register GPU tests n=2"),
            _gpu_tests(ctx, 2, "tests/gpu/test_gpu_baselines.py", "tests/gpu/test_after_kernel.py",
                       name="baseline GPU tests n=2"),
            # symmetric memory keeps per-group state: a process of its own
            _gpu_tests(ctx, 2, "tests/gpu/test_torch_symm_baseline.py",
                       name="torch-symm baseline GPU tests n=2")]
    # NCCL alone on the float16 reduce-scatter our nccl baseline saw wrong on symmetric
    # windows (odd counts; nccl-tests cannot ask for them): a finding, not a failure.
    steps.append(Step.of(f"NCCL float16 reduce-scatter probe n={g}", mpirun(
        ctx, g, ctx.python, "tools/probes/baselines/nccl_symmetric_probe.py", "--json",
        str(ctx.scratch / "nccl-symmetric-probe.jsonl")), limit_s=300))
    if ctx.knob("COLLECTIVE_SWEEPS", "1") != "0":
        for op, algos in (("allreduce", "one-shot two-shot copy-engine push auto"),
                          ("reducescatter", "one-shot push")):
            for algo in algos.split():
                steps += [_collective(ctx, n, op, algo), _collective(ctx, n, op, algo, "--graph")]
    if ctx.knob("COLLECTIVE_VS_NCCL", "1") != "0":
        for baseline in _words(ctx, "COLLECTIVE_BASELINES", "nccl"):
            for mode in (["--graph"], []):
                ops = ["allreduce"] if baseline == "torch-symm" else \
                    ["allreduce", "reducescatter", "allgather"]
                steps += [_collective(ctx, n, op, "auto", *mode, "--baseline", baseline)
                          for op in ops]
        for mode in (["--graph"], []):
            steps += [_collective(ctx, n, op, "auto", "-R", "1", *mode, "--baseline", "nccl")
                      for op in ("allreduce", "reducescatter")]
        for mode in (["--graph"], []):
            for op in ("allreduce", "reducescatter"):
                for register in ("0", "1"):
                    steps.append(_collective(ctx, n, op, "push", "-R", register, *mode,
                                             "--baseline", "nccl", low="1M",
                                             high=ctx.knob("COLLECTIVE_PUSH_MAX", "256M")))
    steps.append(_auto_rows(ctx))
    return steps


def latency_steps(ctx: Context) -> list[Step | Note]:
    """The low-latency protocol: its tests at G, 2 and G + 1 ranks, the launch-overhead
    probe, small-message sweeps against NCCL in graphs and eager, the ll128 all-reduces,
    p50 / p95 latency timing, and the LL all-to-all at G and 2 ranks."""
    g = ctx.gpus
    ll = "tests/gpu/test_gpu_low_latency.py"
    steps: list[Step | Note] = [_gpu_tests(ctx, g, ll, name=f"LL tests n={g}")]
    if g > 2:
        steps.append(_gpu_tests(ctx, 2, ll, name="LL tests n=2"))
    steps += [_gpu_tests(ctx, g, "tests/gpu/test_gpu_communicator.py",
                         name=f"Communicator tests n={g}"),
              _gpu_tests(ctx, g + 1, ll, name=f"LL tests n={g + 1} (shared GPU)"),
              probe_step(ctx, f"launch overhead n={g}", g,
                         "tools/probes/timing/launch_overhead_probe.py",
                         limit_s=_limit(ctx, "STEP_TIMEOUT_BENCH", 150))]
    pairs = [("allgather", "auto", "4M"), ("allreduce", "auto", "4M"),
             ("reducescatter", "auto", "4M")]
    if g > 2:
        pairs += [("allgather", "ll", "2M"), ("allreduce", "ll", "2M"),
                  ("reducescatter", "ll", "2M")]
    pairs += [("allreduce", "ll-two-shot", "2M"), ("allgather", "push", "512K"),
              ("allreduce", "one-shot", "512K"), ("reducescatter", "one-shot", "512K")]
    for mode in (["--graph"], []):
        steps += [_collective(ctx, g, op, algo, *mode, "--baseline", "nccl", high=high)
                  for op, algo, high in pairs]
    steps += [_collective(ctx, g, "allreduce", algo, "--graph", "--baseline", "nccl",
                          low="128K", high="8M") for algo in ("ll128", "ll128-two-shot")]
    if g == 2:
        steps += [_collective(ctx, g, op, "ll", "--graph", "--baseline", "nccl", low="512K",
                              high="2M") for op in ("allgather", "allreduce", "reducescatter")]
    else:
        steps += [_collective(ctx, 3, op, algo, "--graph", "--baseline", "nccl", high="2M")
                  for op in ("allgather", "allreduce", "reducescatter") for algo in ("ll", "auto")]
    steps += [_collective(ctx, g, op, "auto", "--graph", "--timing", "latency", "--baseline",
                          "nccl", low="4", high="1M", iters="200")
              for op in ("allgather", "allreduce")]
    for n in sorted({g, 2}):
        steps.append(timed_step(
            ctx, f"alltoall ll n={n} vs nccl --graph", n, "alltoall",
            ["--backend", "cuda-vmm", "--algo", "ll", "--splits", "even", "-b", "8", "-e",
             "512K", "-f", "4", "-n", "50", "-w", "5", "-c", "1", "--graph", "--baseline",
             "nccl"], tags={"alltoall_case": f"n{n} even nccl ll graph"},
            limit_s=_limit(ctx, "STEP_TIMEOUT_BENCH", 150)))
    steps.append(_auto_rows(ctx))
    return steps


def timer_steps(ctx: Context) -> list[Step | Note]:
    """Every collective at G ranks eager, in graphs and by latency samples against NCCL;
    then whether the three timings of each side tell one story (timer-consistency.md)."""
    g = ctx.gpus
    steps: list[Step | Note] = []
    for op in ("allreduce", "allgather", "reducescatter"):
        for mode, flags in (("eager", []), ("graph", ["--graph"]),
                            ("latency", ["--timing", "latency"])):
            steps.append(timed_step(
                ctx, f"timer {op} {mode} n={g} vs nccl", g, op,
                ["--backend", "cuda-vmm", "-b", ctx.knob("TIMER_MIN", "8"), "-e",
                 ctx.knob("TIMER_MAX", "2M"), "-f", "4", "-n", "50", "-w", "5", "-c", "1",
                 "--baseline", "nccl", *flags], tags={"timer_case": f"{op}-{mode}"},
                limit_s=_limit(ctx, "STEP_TIMEOUT_BENCH", 150)))
    steps.append(Step.of("eager, graph and latency tell one story", [
        ctx.python, "tools/analysis/timer_consistency.py", str(ctx.out / "results.jsonl"),
        "--markdown", str(ctx.out / "timer-consistency.md")], limit_s=60))
    return steps


def trace_steps(ctx: Context) -> list[Step | Note]:
    """Where each all-to-all kernel's microseconds go (tools/probes/timing/kernel_trace.py),
    2 ranks, TRACE_BYTES a rank, even and random splits; tables in kernel-trace.md."""
    from ipcshare.runtime.config import parse_size

    (ctx.out / "kernel-trace.md").write_text("")
    graph = ctx.knob("TRACE_GRAPH", "4")
    steps: list[Step | Note] = []
    for size in _words(ctx, "TRACE_BYTES", "2M 32M"):
        for splits in ("even", "random"):
            for algo in _words(ctx, "TRACE_ALGOS", "pull balanced ll push eager"):
                if algo == "ll" and parse_size(size) > 2 << 20:
                    continue  # its buffers take 2 MiB a rank
                result = ctx.scratch_file(f"kernel-trace-{algo}-{splits}-{size}",
                                          ".result.json")
                steps.append(Step.of(f"trace {algo} {splits} {size}", mpirun(
                    ctx, 2, ctx.python, "tools/probes/timing/kernel_trace.py", "--algo", algo,
                    "--splits", splits, "--bytes", size,
                    *(["--graph", graph] if graph != "0" else []), "--json",
                    str(ctx.scratch / f"kernel-trace-{algo}-{splits}-{size}.json"),
                    "--result", result),
                    limit_s=120, tee="kernel-trace.md", results=[result]))
    return steps


def ab_steps(ctx: Context) -> list[Step | Note]:
    """A change against the code it replaces, in one launch each: every case of AB_CASES
    ("N OP ALGO MAX [FLAGS...]", split by ";") in the base checkout AB_TREE, then in this
    one; tools/analysis/ab_table.py puts them side by side (ab.md)."""
    g = ctx.gpus
    tree = ctx.knob("AB_TREE", "")
    if not tree or not (Path(tree) / "ipcshare").is_dir():
        return [Step.of("ab: AB_TREE names a checkout of the base", [
            "sh", "-c", "echo 'AB_TREE must name a checkout of the base (a folder holding "
            "ipcshare/)'; exit 1"], limit_s=10)]
    base = str(Path(tree).resolve())
    compile_code = ("from ipcshare.kernels import KERNEL_SOURCES, compile_kernel_source\n"
                    "for source in KERNEL_SOURCES: compile_kernel_source(source)")
    steps: list[Step | Note] = []
    for side, folder in (("base", base), ("this", str(ctx.repo))):
        steps.append(Step.of(f"ab: compile the {side} tree's kernels",
                             [ctx.python, "-c", compile_code], limit_s=300, cwd=folder,
                             env={"PYTHONPATH": os.pathsep.join(
                                 filter(None, [folder, ctx.knobs.get("PYTHONPATH")]))}))
    default = ";".join(f"{g} {op} auto 2M --graph" for op in
                       ("allreduce", "allgather", "reducescatter"))
    for case in (c.strip() for c in ctx.knob("AB_CASES", default).split(";")):
        if not case:
            continue
        n, op, algo, high, *flags = case.split()
        for side, folder in (("base", base), ("this", str(ctx.repo))):
            # The side's package first: python -m puts the working folder first too.
            path = os.pathsep.join(filter(None, [folder, ctx.knobs.get("PYTHONPATH")]))
            package = os.path.join(folder, "ipcshare")
            timed = timed_step(
                ctx, f"ab {side}: {case}", int(n), op,
                ["--backend", ctx.knob("AB_BACKEND", "cuda-vmm"), "--algo", algo, "-b",
                 ctx.knob("AB_MIN", "8"), "-e", high, "-f", "4", "-n", "50", "-w", "5", "-c",
                 "1", "--baseline", ctx.knob("AB_BASELINE", "nccl"), *flags],
                tags={"ab_case": case, "ab_side": side, "ab_package": package},
                limit_s=_limit(ctx, "STEP_TIMEOUT_BENCH", 150), env={"PYTHONPATH": path},
                cwd=folder)
            # The package the side imports is the side's (ab_table.py refuses two sides of
            # one package; the tag is checked here, not assumed).
            check = [ctx.python, "-c", PACKAGE_CHECK, package]
            steps.append(dataclasses.replace(timed, commands=(tuple(check), *timed.commands)))
    steps.append(Step.of("ab: this tree against the base (ab.md)", [
        ctx.python, "tools/analysis/ab_table.py", str(ctx.out / "results.jsonl"), "--markdown",
        str(ctx.out / "ab.md")], limit_s=60))
    return steps


def torch_user_steps(ctx: Context) -> list[Step | Note]:
    """What a PyTorch user sees (``ipcshare vs-torch``) at 2 and G ranks: tables in
    torch-user-nN.md, result documents in result-documents.jsonl."""
    steps: list[Step | Note] = []
    for n in sorted({2, ctx.gpus}):
        result = ctx.scratch_file(f"torch-user-n{n}", ".result.json")
        steps.append(Step.of(f"torch-user table n={n}", mpirun(ctx, n, *ipcshare(
            ctx, "vs-torch", "-b", ctx.knob("TORCH_USER_MIN", "8K"), "-e",
            ctx.knob("TORCH_USER_MAX", "256M"), "-f", ctx.knob("TORCH_USER_FACTOR", "2"),
            "--markdown", str(ctx.out / f"torch-user-n{n}.md"), "--result", result)),
            limit_s=_limit(ctx, "STEP_TIMEOUT_TORCH_USER", 300), results=[result]))
    return steps


def p2p_steps(ctx: Context) -> list[Step | Note]:
    """``ipcshare p2p`` (one process over every GPU) against IPC windows, its tests,
    host-staged copies with peer access off, and doctor under launch/bind-gpu.sh."""
    g = ctx.gpus
    return [
        Step.of("p2p direct vs IPC, host-staged copies",
                [ctx.python, "-m", "pytest", "-q", "-s", "-rs", "-p", "no:cacheprovider",
                 "tests/gpu/test_p2p_direct.py"],
                ipcshare(ctx, "p2p", "-b", "8", "-e", ctx.knob("P2P_MAX", "256M"), "-f", "4",
                         "--json", str(ctx.out / "p2p.json")),
                ipcshare(ctx, "p2p", "--peer-access", "off", "--mode", "copy", "--no-ipc",
                         "-b", "64M", "-e", "256M", "-f", "4", "--json",
                         str(ctx.out / "p2p-staged.json")), limit_s=300),
        Step.of("doctor --quick under bind-gpu.sh", mpirun(
            ctx, g, "launch/bind-gpu.sh", *ipcshare(ctx, "doctor", "--quick", "--json",
                                                    str(ctx.out / "doctor-bound.json"))),
            limit_s=180)]


def namespaces_steps(ctx: Context) -> list[Step | Note]:
    """Every rank in a PID namespace of its own, host and both GPU backends. Open MPI
    4.1's shared-memory transport crashes across PID namespaces: TCP over loopback."""
    return [Step.of("ranks in separate PID namespaces (host, cuda-vmm, cuda-ipc)", [
        ctx.python, "-m", "pytest", "-q", "-s", "-rs", "-p", "no:cacheprovider",
        "tests/cli/test_pid_namespaces_cli.py", "-k", "not network"], limit_s=300,
        env={"OMPI_MCA_btl": "self,tcp", "OMPI_MCA_btl_tcp_if_include": "lo"})]


PACKAGE_CHECK = """
import os, sys
import ipcshare
found = os.path.dirname(os.path.abspath(ipcshare.__file__))
if found != os.path.abspath(sys.argv[1]):
    sys.exit(f"this side imports ipcshare from {found}, not {sys.argv[1]}")
"""

SHARED_TABLE = """
import json, sys
docs = [json.loads(line) for line in open(sys.argv[1]) if '"shared_case"' in line]
g = int(sys.argv[2])
time_of = {(d["shared_case"], d["world_size"]): d["rows"][0]["time_us"] for d in docs if d["rows"]}
print(f"{'case':<16} {g} ranks (us)  {g + 1} ranks (us)  ratio (target <= 3)")
for case in ("auto", "auto-graph", "ring", "auto-mps", "auto-graph-mps", "ring-mps"):
    alone, shared = time_of.get((case, g)), time_of.get((case, g + 1))
    if alone and shared:
        print(f"{case:<16} {alone:>12.2f}  {shared:>15.2f}  {shared / alone:>6.2f}"
              f"{'' if shared <= 3 * alone else '  over'}")
"""


def shared_steps(ctx: Context) -> list[Step | Note]:
    """G + 1 and 2xG ranks on G GPUs, taking turns and then under MPS: the shared-GPU
    tests, 1 MiB all-gathers and rings, the communicator's collectives 8 KiB - 4 MiB
    (auto against its spinning kernels), the placement and time-slice probes; then the
    G + 1 against G table."""
    g = ctx.gpus
    quick = ctx.knob("SHARED_QUICK", "0") == "1"
    limit = _limit(ctx, "STEP_TIMEOUT_TESTS", 420)
    env = {"IPCSHARE_SHARED_GPU_BARRIER": "host"}
    steps: list[Step | Note] = []
    if not quick:
        results = [ctx.scratch_file(f"timeslice-n{n}", ".result.json") for n in (2, 3)]
        steps.append(Step.of("time-slice probe, 2 and 3 ranks on GPU 0", *[
            mpirun(ctx, n, ctx.python, "tools/probes/sharing/timeslice_probe.py", "--rounds",
                   "500", "--result", result, forward=["CUDA_VISIBLE_DEVICES"])
            for n, result in zip((2, 3), results, strict=True)],
            limit_s=120, env={"CUDA_VISIBLE_DEVICES": "0"}, results=results))

    def run(n: int, label: str, op: str, *flags: str, mps: bool, limit_s: int = 120,
            extra_env: dict[str, str] | None = None) -> Step:
        return timed_step(ctx, f"shared{'-mps' if mps else ''} {label} n={n}", n, op,
                          ["-b", "1M", "-e", "1M", "-n", "50", "-w", "5", "-c", "1", *flags],
                          tags={"shared_case": f"{label}{'-mps' if mps else ''}"},
                          limit_s=limit_s, env={**env, **(extra_env or {})},
                          forward=["IPCSHARE_SHARED_GPU_BARRIER"], mps=mps)

    def cases(mps: bool) -> list[Step | Note]:
        s = "-mps" if mps else ""
        sweep = ["-b", "8K", "-e", "4M", "-f", "8"]
        made: list[Step | Note] = []
        for n in sorted({g, g + 1, 2 * g}):
            if n < 2:
                continue
            if not quick:
                made.append(Step.of(f"shared{s} tests n={n}", pytest_mpi(
                    ctx, n, ["tests/gpu/test_shared_gpu.py"], mps=mps), limit_s=limit, mps=mps))
                if not mps:
                    # torch's expandable segments: the guests' tensors are cuMem memory,
                    # handed to the leader by descriptor.
                    made.append(Step.of(
                        f"shared tests, expandable segments, n={n}", pytest_mpi(
                            ctx, n, ["tests/gpu/test_shared_gpu.py"], extra=[
                                "-k", "handed_to_its_leader or leader_of_a_time_sliced"],
                            forward=["PYTORCH_CUDA_ALLOC_CONF"]), limit_s=limit,
                        env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}))
            made += [run(n, "auto", "allgather", "--algo", "auto", mps=mps),
                     run(n, "auto-graph", "allgather", "--algo", "auto", "--graph", mps=mps),
                     run(n, "ring", "ring", mps=mps)]
            if quick:
                if n > g:
                    break
                continue
            for graph in ([], ["--graph"]):
                tail = "-graph" if graph else ""
                made += [run(n, f"allreduce-{a}{tail}", "allreduce", "--algo", a, *sweep, *graph,
                             mps=mps, limit_s=180) for a in ("auto", "one-shot")]
                made += [run(n, f"allgather-{a}{tail}", "allgather", "--algo", a, *sweep, *graph,
                             mps=mps, limit_s=180) for a in ("stepped", "pull")]
                made.append(run(n, f"reducescatter-auto{tail}", "reducescatter", "--algo",
                                "auto", *sweep, *graph, mps=mps, limit_s=180))
                made.append(run(n, f"allreduce-auto-R1{tail}", "allreduce", "--algo", "auto",
                                "-R", "1", *sweep, *graph, mps=mps, limit_s=180))
            if n == g:
                continue
            made.append(probe_step(ctx, f"shared{s} placement probe n={n}", n,
                                   "tools/probes/sharing/placement_probe.py", limit_s=180,
                                   mps=mps))
            made += [run(n, f"ce-{b}", "allgather", "--algo", "copy-engine", mps=mps,
                         extra_env={"IPCSHARE_SHARED_GPU_BARRIER": b}) for b in ("host", "stream")]
            made += [run(n, "push", "allgather", "--algo", "push", mps=mps),
                     run(n, "leader", "allgather", "--algo", "leader", mps=mps)]
        return made

    steps += cases(False)
    if ctx.knob("SHARED_MPS", "1") == "0":
        steps.append(Note("MPS cases skipped (SHARED_MPS=0)"))
    else:
        steps += cases(True)
        # Under MPS ranks on one GPU run side by side: the 3- and 4-rank code of the
        # collectives and Triton on any node (correctness only).
        if not quick or ctx.knob("SHARED_MPS_TESTS", "0") == "1":
            steps += [_gpu_tests(ctx, n, "tests/gpu/test_gpu_communicator.py",
                                 "tests/gpu/test_gpu_low_latency.py",
                                 "tests/gpu/test_triton_primitives.py", mps=True,
                                 name=f"shared-mps communicator, LL and Triton tests n={n}")
                      for n in (3, 4) if n > g]
    steps.append(Step.of("shared: G + 1 against G ranks", [
        ctx.python, "-c", SHARED_TABLE, str(ctx.out / "results.jsonl"), str(g)], limit_s=30))
    return steps


# -- nccl-tests and all-to-all ----------------------------------------------------------
def _nccl_tests(ctx: Context, programs: Sequence[str], name: str) -> tuple[Step, Path]:
    """A build of nccl-tests' ``programs`` (carried in .nccl-tests/, ignored by git) in
    a scratch folder of this run, against the NCCL wheel's library, with the node's nvcc:
    the step, and the folder the programs land in."""
    root = ctx.scratch / "nccl-tests"
    home, build = root / "nccl", root / "build"
    script = (
        'set -e\nwheel=$("$PY" -c \'import nvidia.nccl as n; print(list(n.__path__)[0])\')\n'
        'nvcc_path=$(command -v nvcc) || { echo "nvcc: not found"; exit 1; }\n'
        'mkdir -p "$HOME_DIR/lib"\nln -sfn "$wheel/include" "$HOME_DIR/include"\n'
        'ln -sf "$wheel"/lib/libnccl.so.* "$HOME_DIR/lib/"\n'
        'ln -sf "$(cd "$wheel/lib" && ls libnccl.so.* | head -1)" "$HOME_DIR/lib/libnccl.so"\n'
        'targets=""\nfor p in $PROGRAMS; do targets="$targets $BUILD_DIR/$p"; done\n'
        'make -C .nccl-tests/src -j 8 MPI=0 NCCL_HOME="$HOME_DIR" '
        'CUDA_HOME="$(dirname "$(dirname "$nvcc_path")")" '
        'NVCC_GENCODE=-gencode=arch=compute_90,code=sm_90 BUILDDIR="$BUILD_DIR" $targets\n')
    return Step.of(name, ["bash", "-c", script], limit_s=600,
                   env={"PY": ctx.python, "HOME_DIR": str(home), "BUILD_DIR": str(build),
                        "PROGRAMS": " ".join(programs)},
                   needs=str(ctx.repo / ".nccl-tests" / "src")), build


def _nccl_tests_run(ctx: Context, build: Path, program: str, ranks: int, flags: Sequence[str],
                    label: str) -> Step:
    home = ctx.scratch / "nccl-tests" / "nccl"
    log = ctx.out / "nccl-tests" / f"{program}.log"
    command = [str(build / program), "-b", "8", "-e", ctx.knob("NCCL_TESTS_MAX", "256M"),
               "-f", "4", "-g", "1", "-t", str(ranks), *flags]
    return Step.of(f"nccl-tests {program} -t {ranks} {' '.join(flags)} {label}", command,
                   limit_s=300, tee=str(log.relative_to(ctx.out)), needs=str(build / program),
                   env={"LD_LIBRARY_PATH": os.pathsep.join(
                       filter(None, [str(home / "lib"), ctx.knobs.get("LD_LIBRARY_PATH")]))})


def _alltoall_perf(ctx: Context, build: Path, ranks: int) -> list[Step | Note]:
    """alltoall_perf on plain buffers and on symmetric windows of a zero-CTA
    communicator (-R 2 -x 2: without -x 2, -R 2 runs -R 0's path), eager and graphs."""
    return [_nccl_tests_run(ctx, build, "alltoall_perf", ranks, [*flags, *graph], label)
            for flags in (["-R", "0"], ["-R", "2", "-x", "2"])
            for graph, label in (([], "eager"), (["-G", "20"], "graph"))]


def nccl_tests_steps(ctx: Context) -> list[Step | Note]:
    """NVIDIA's nccl-tests built here against the NCCL wheel: all-gather, all-reduce,
    reduce-scatter -R 0 and -R 2, eager and -G 20, then alltoall_perf (built apart);
    logs under nccl-tests/, their table in nccl-tests/nccl-tests.md."""
    g = ctx.gpus
    folder = ctx.out / "nccl-tests"
    folder.mkdir(parents=True, exist_ok=True)
    programs = ("all_gather_perf", "all_reduce_perf", "reduce_scatter_perf")
    for program in (*programs, "alltoall_perf"):
        (folder / f"{program}.log").write_text("")  # the runs append to them
    build_step, build = _nccl_tests(ctx, programs, "nccl-tests build (nvcc, the wheel's "
                                                   "NCCL, sm_90)")
    steps: list[Step | Note] = [build_step]
    steps += [_nccl_tests_run(ctx, build, program, g, ["-R", register, *graph], label)
              for program in programs for register in ("0", "2")
              for graph, label in (([], "eager"), (["-G", "20"], "graph"))]
    steps.append(_nccl_tests(ctx, ["alltoall_perf"], "nccl-tests build alltoall_perf")[0])
    steps += _alltoall_perf(ctx, build, g)
    steps.append(Step.of("nccl-tests table", ["sh", "-c", '"$0" -m ipcshare.bench.nccl_tests '
                                              '"$1"/*_perf.log > "$1/nccl-tests.md"; rc=$?; '
                                              'cat "$1/nccl-tests.md"; exit $rc',
                                              ctx.python, str(folder)], limit_s=60))
    return steps


def alltoall_steps(ctx: Context) -> list[Step | Note]:
    """``ipcshare alltoall`` at ALLTOALL_RANKS (up to G), each splits, algorithm and
    baseline, eager and in graphs; nccl-tests' alltoall_perf at the same rank counts; the
    table ours beside each baseline (alltoall.md)."""
    g = ctx.gpus
    limit = _limit(ctx, "STEP_TIMEOUT_ALLTOALL", 150)
    steps: list[Step | Note] = []
    if ctx.knob("ALLTOALL_TESTS", "0") != "0":
        # The torch-symm file alone: symmetric memory's backend is set once per process.
        steps += [_gpu_tests(ctx, 2, file, name=f"alltoall baselines' tests n=2 "
                             f"{os.path.basename(file)}")
                  for file in ("tests/gpu/test_gpu_alltoall_baselines.py",
                               "tests/gpu/test_torch_symm_alltoall_baseline.py")]
    ranks = [int(n) for n in _words(ctx, "ALLTOALL_RANKS", "2 4") if int(n) <= g]
    symm_splits = _words(ctx, "ALLTOALL_SYMM_SPLITS", "even")
    register = ["-R", "1"] if ctx.knob("ALLTOALL_REGISTER", "0") == "1" else []
    for n in ranks:
        for splits in _words(ctx, "ALLTOALL_SPLITS", "even random skewed"):
            for baseline in _words(ctx, "ALLTOALL_BASELINES", "nccl torch torch-symm"):
                # torch-symm's all_to_all_vdev refuses uneven splits its kernel cannot cut.
                if baseline == "torch-symm" and splits not in symm_splits:
                    continue
                for algo in _words(ctx, "ALLTOALL_ALGOS", "auto"):
                    modes = [("eager", [])]
                    if ctx.knob("ALLTOALL_GRAPH", "1") != "0":
                        modes.append(("graph", ["--graph"]))
                    for label, graph in modes:
                        tag = " ".join(filter(None, [f"n{n}", splits, baseline,
                                                     "" if algo == "auto" else algo,
                                                     "registered" if register else "",
                                                     "graph" if graph else ""]))
                        steps.append(timed_step(
                            ctx, f"alltoall n={n} --splits {splits} --algo {algo} vs "
                            f"{baseline} {label}", n, "alltoall",
                            ["--backend", "cuda-vmm", "--algo", algo, "--splits", splits, "-b",
                             ctx.knob("ALLTOALL_MIN", "8"), "-e",
                             ctx.knob("ALLTOALL_MAX", "256M"), "-f", "4", "-n",
                             ctx.knob("ALLTOALL_ITERS", "20"), "-w", "5", "-c", "1",
                             "--baseline", baseline, *register, *graph],
                            tags={"alltoall_case": tag}, limit_s=limit))
    logs: list[str] = []
    if ctx.knob("ALLTOALL_NCCL_TESTS", "1") == "0":
        steps.append(Note("nccl-tests' alltoall_perf not run (ALLTOALL_NCCL_TESTS=0)"))
    else:
        folder = ctx.out / "nccl-tests"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "alltoall_perf.log").write_text("")
        build_step, build = _nccl_tests(ctx, ["alltoall_perf"], "nccl-tests build alltoall_perf")
        steps.append(build_step)
        for n in ranks:
            steps += _alltoall_perf(ctx, build, n)
        logs = [str(folder / "alltoall_perf.log")]
    steps.append(Step.of("alltoall summary (alltoall.md)", [
        ctx.python, "tools/analysis/alltoall_summary.py", str(ctx.out / "results.jsonl"),
        "--nccl-tests", *logs, "--out", str(ctx.out / "alltoall.md")], limit_s=60))
    return steps


def inter_steps(ctx: Context) -> list[Step | Note]:
    """The engines between nodes on 2 virtual nodes of this node's GPUs (2x1 on 2 GPUs,
    2x2 on 4) against NCCL's flat collective; on one GPU, the GPU tests of 2 x 2 virtual
    nodes sharing it (MPI between them)."""
    g = ctx.gpus
    env = {"IPCSHARE_VIRTUAL_NODES": "2"}
    files = ["tests/gpu/test_inter_gpu.py", "tests/gpu/test_multinode_gpu.py"]
    limit = _limit(ctx, "STEP_TIMEOUT_TESTS", 420)
    if g < 2:
        return [Note("one GPU: the GPU tests at 2 x 2 virtual nodes on it, MPI between "
                     "nodes; NCCL and the sweeps need 2 GPUs"),
                Step.of("inter tests n=4 as 2 virtual nodes on one GPU", pytest_mpi(
                    ctx, 4, files, forward=list(env)), limit_s=limit, env=env)]
    n = 4 if g >= 4 else 2
    steps: list[Step | Note] = [Step.of(f"inter tests n={n} as 2 virtual nodes", pytest_mpi(
        ctx, n, files, forward=list(env)), limit_s=limit, env=env)]
    for op in ("allgather", "allreduce", "reducescatter"):
        for engine in ("nccl", "mpi"):
            steps.append(timed_step(
                ctx, f"inter {op} --inter {engine} n={n} as 2 virtual nodes", n, op,
                ["--backend", "cuda-vmm", "--inter", engine, "-b", ctx.knob("INTER_MIN", "1M"),
                 "-e", ctx.knob("INTER_MAX", "256M"), "-f", "4", "-n",
                 ctx.knob("BENCH_ITERS", "20"), "-w", "5", "-c", "1", "--baseline", "nccl"],
                tags={"inter_case": f"{op}-{engine}-2x{n // 2}"},
                limit_s=_limit(ctx, "STEP_TIMEOUT_INTER", 300), env=env, forward=list(env)))
    return steps


def probes_steps(ctx: Context) -> list[Step | Note]:
    """The tuning probes that answer design questions cited in the code: what SM loads,
    SM stores and the copy engine carry over NVLink (link_probe: why the push
    all-to-all stores), and where a copy-engine all-gather's time goes (allgather_probe:
    auto's all-gather rows)."""
    g = ctx.gpus
    links = ctx.scratch_file("link-probe", ".result.json")
    return [Step.of("what the links carry: SM loads, stores, the copy engine (link_probe)",
                    [ctx.python, "tools/probes/links/link_probe.py", "--result", links],
                    limit_s=300, results=[links]),
            probe_step(ctx, f"where an all-gather's time goes, n={g} (allgather_probe)", g,
                       "tools/probes/timing/allgather_probe.py", limit_s=300)]


# -- one rank's refused call, on GPUs -------------------------------------------------------
REFUSED_ALGOS = "pull balanced ll push eager ll128"


def refusals_steps(ctx: Context) -> list[Step | Note]:
    """A call that one rank's checks refuse, on GPUs at 3 and 4 ranks (REFUSED_RANKS; under
    MPS where they outnumber the GPUs): its GPU tests, then 50 refused all-to-all-v calls, each
    followed by a good one, for every all-to-all-v algorithm (REFUSED_ALGOS); then the
    stepped calls' refusals with 2 and 3 ranks taking turns on GPU 0 (no MPS)."""
    g = ctx.gpus
    limit = _limit(ctx, "STEP_TIMEOUT_TESTS", 420)
    files = ["tests/gpu/test_gpu_refused_calls.py", "tests/gpu/test_register_gpu.py",
             "tests/gpu/test_gpu_all_to_all.py",
             "tests/gpu/test_gpu_refused_calls_across_nodes.py"]
    steps: list[Step | Note] = []
    for n in (int(word) for word in _words(ctx, "REFUSED_RANKS", "3 4")):
        mps = n > g
        where = " under MPS" if mps else ""
        steps.append(Step.of(f"pytest the refused calls, {n} ranks{where}",
                             pytest_mpi(ctx, n, files, forward=["IPCSHARE_SIGNAL_TIMEOUT"],
                                        mps=mps),
                             limit_s=limit, env={"IPCSHARE_SIGNAL_TIMEOUT": "10"}, mps=mps))
        for algo in _words(ctx, "REFUSED_ALGOS", REFUSED_ALGOS):
            steps.append(Step.of(
                f"50 refused all-to-all-v calls, {algo}, {n} ranks{where}",
                mpirun(ctx, n, ctx.python, "tools/checks/refused_calls_repeat.py",
                       "--backend", "cuda-vmm", "--algo", algo,
                       forward=["IPCSHARE_SIGNAL_TIMEOUT"], mps=mps),
                limit_s=120, env={"IPCSHARE_SIGNAL_TIMEOUT": "10"}, mps=mps))
    for n in (2, 3):
        steps.append(Step.of(
            f"pytest the refused stepped calls, {n} ranks taking turns on GPU 0",
            pytest_mpi(ctx, n, ["tests/gpu/test_gpu_refused_calls_time_sliced.py"],
                       forward=["CUDA_VISIBLE_DEVICES", "IPCSHARE_SIGNAL_TIMEOUT"]),
            limit_s=limit, env={"CUDA_VISIBLE_DEVICES": "0", "IPCSHARE_SIGNAL_TIMEOUT": "10"}))
    return steps


# -- the first call on a fresh install ---------------------------------------------------
def first_call_steps(ctx: Context) -> list[Step | Note]:
    """The first collective of a fresh install, cold kernel cache, 2 ranks on one GPU
    (under MPS where they share it): the wheel in .dist/ (FIRST_CALL_WHEEL), built where
    NVRTC runs, installed on its own (no NVRTC needed here), then
    tools/first_call_bench.py's runs: shipped CUBINs, warm, and every kernel compiled."""
    wheels = sorted((ctx.repo / ".dist").glob("ipcshare-*.whl"))
    wheel = ctx.knob("FIRST_CALL_WHEEL", str(wheels[-1]) if wheels else "")
    if not wheel:
        return [Note("first-call: no wheel in .dist/ (pip wheel --no-deps -w .dist .): skipped")]
    target = str(ctx.scratch / "first-call-install")
    mps = ctx.gpus < 2
    # The installed package alone, and the carried wheels (/tmp/site), not the checkout.
    env = {"PYTHONPATH": os.pathsep.join([target, "/tmp/site"])}
    where = " under MPS" if mps else ""
    return [Step.of(f"install {Path(wheel).name} on its own", [
                ctx.python, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                "--target", target, wheel], limit_s=120, needs=wheel),
            Step.of(f"first call of a fresh install, 2 ranks{where}",
                    [ctx.python, str(ctx.repo / "tools" / "first_call_bench.py"), "--ranks",
                     "2", "--compile", "--json", str((ctx.out / "first-call.json").resolve())],
                    # Outside the checkout: `python -m ipcshare` would import it from the
                    # folder it starts in.
                    limit_s=_limit(ctx, "STEP_TIMEOUT_FIRST_CALL", 400), env=env, mps=mps,
                    needs=target, cwd=target)]


PHASES: dict[str, Phase] = {phase.name: phase for phase in (
    Phase("tests", "the GPU test suite at 2 ranks (under MPS on one GPU), 4 and 2xG ranks, "
                   "2 ranks taking turns on GPU 0, tests/mpi under the node's MPI", 1,
          tests_steps),
    Phase("refusals", "a call one rank refuses, on GPUs at 3 and 4 ranks: its tests and 50 "
                      "repetitions a GPU all-to-all-v algorithm; the stepped calls' with 2 "
                      "and 3 ranks taking turns on GPU 0", 1, refusals_steps),
    Phase("first-call", "the first collective of a fresh install from .dist/, cold cache, "
                        "2 ranks on one GPU", 1, first_call_steps),
    Phase("allreduce-quick", "all-reduce (graphs, eager) and all-to-all (graphs) 8 B - 1 MiB "
                             "at max(2, G) ranks, against NCCL with a GPU a rank, else under "
                             "MPS", 1, quick_steps),
    Phase("bench", "window setup, ring and all-gather sweeps of both GPU backends against "
                   "NCCL", 2, bench_steps),
    Phase("suite", "ipcshare bench with configs/bench-h200-x$G.yaml", 1, suite_steps),
    Phase("sweep", "every all-gather algorithm at 3 and 2xG ranks, 1 B - 1 GiB, verified", 2,
          sweep_steps),
    Phase("csweep", "the collectives through the public API, every algorithm, dtype and "
                    "reduction, 1 element - 1 GiB", 1, csweep_steps),
    Phase("doctor", "ipcshare doctor, quick and full", 1, doctor_steps),
    Phase("faults", "the dead-peer tests under MPICH's gforker; soaks of both GPU backends",
          0, faults_steps),
    Phase("fallback", "GPU pairs without peer access: relayed and host-staged paths", 2,
          fallback_steps),
    Phase("namespaces", "every rank in a PID namespace of its own", 0, namespaces_steps),
    Phase("shared", "G + 1 and 2xG ranks on G GPUs, taking turns and under MPS", 1,
          shared_steps),
    Phase("collectives", "the communicator's algorithms against NCCL, copied and registered "
                         "arrays", 2, collectives_steps),
    Phase("p2p", "one process over every GPU against IPC windows", 2, p2p_steps),
    Phase("latency", "the low-latency protocol and small messages against NCCL", 2,
          latency_steps),
    Phase("timer", "eager, graph and latency timings of ours and NCCL's agree", 2,
          timer_steps),
    Phase("nccl-tests", "NVIDIA's nccl-tests built here against the NCCL wheel", 2,
          nccl_tests_steps),
    Phase("alltoall", "ipcshare alltoall against NCCL, torch and torch-symm; alltoall_perf",
          2, alltoall_steps),
    Phase("torch-user", "ipcshare vs-torch: what a PyTorch user sees", 2, torch_user_steps),
    Phase("inter", "the engines between nodes on 2 virtual nodes", 1, inter_steps),
    Phase("trace", "where each all-to-all kernel's microseconds go", 2, trace_steps),
    Phase("ab", "a change against the code it replaces, in one launch", 2, ab_steps),
    Phase("probes", "the tuning probes behind design choices: the links, an all-gather's "
                    "parts", 2, probes_steps),
)}
