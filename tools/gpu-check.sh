#!/usr/bin/env bash
# The one script run on a GPU node: facts, the GPU test suite at 2 (and 4) ranks and with
# two ranks sharing one GPU, then ring / all-gather sweeps on both GPU backends against NCCL.
#
#   tools/gpu-check.sh [all|tests|bench|suite|sweep|csweep|doctor|faults|fallback|namespaces|shared|
#                       collectives|p2p|latency|timer|nccl-tests|alltoall|torch-user|inter|trace|
#                       ab]...
#                       (default all)
#
#   tests   the GPU pytest suite at 2, 4 and 2xG ranks, and 2 ranks sharing one GPU;
#           tests/mpi under the node's own MPI at 2 and 3 ranks
#   bench   quick ring / all-gather sweeps of both backends against NCCL (and one all-gather
#           sweep with an empty kernel before each operation), window setup time
#   suite   `ipcshare bench` with configs/bench-h200-x$G.yaml (every algorithm, eager and
#           graph timing, NCCL and MPI); JSON, plot and Markdown under $OUT/bench/
#   sweep   correctness at the world sizes the suite and tests do not cover (3 and 2xG
#           ranks): every all-gather algorithm, 1 byte to 387 MiB in odd sizes (factor 9)
#           and 1 GiB, eager and in CUDA graphs; plus window setup time of both backends
#   csweep  the collectives through the public API (tools/collective_sweep.py): every
#           algorithm, dtype and reduction, 1 element to CSWEEP_MAX (default 1G) in odd
#           sizes, out of place, in place and replayed in graphs with new data, at 2, 3 and
#           4 ranks and 2xG (CSWEEP_RANKS; ranks beyond the GPUs share them under MPS:
#           correctness only); then G + 1 ranks on G GPUs without MPS (auto and stepped)
#   faults  the dead-peer tests (tests/faults, tests/gpu/test_gpu_faults.py) under MPICH's
#           gforker launcher from wheels brought in .whl/ (mpich, mpi4py), and a soak of
#           both GPU backends (tools/soak.py: window cycles and ring iterations, counts flat)
#   doctor  `ipcshare doctor --quick`, then the full check with --json/--yaml under $OUT/doctor/
#   fallback  GPU pairs without peer access, forced with IPCSHARE_DISABLE_P2P (0-2,1-3 on 4
#           GPUs, 0-1 on 2 or 3): tests/gpu/test_fallbacks.py at 2, G and 2xG ranks, the paths
#           `ipcshare info` and `ipcshare doctor --quick` report, and copy-engine all-gather /
#           ring sweeps direct vs relay vs host-staged (results.jsonl rows carry "fallback")
#   namespaces  every rank in a PID namespace of its own (unshare -p, as one container per
#           rank): tests/cli/test_pid_namespaces_cli.py on the host and both GPU backends
#           (records what legacy cudaIpc does there)
#   collectives  the communicator's GPU tests (and the baselines') at 2 ranks; each
#           all-reduce / reduce-scatter algorithm 8 B - 64 MiB, eager and in graphs; auto
#           against NCCL through nccl4py in the same launch (copied and -R 1 arrays); the
#           push kernels from 1 MiB to COLLECTIVE_PUSH_MAX (256M) against NCCL, -R 0 and -R 1;
#           first NCCL alone on odd-count float16 reduce-scatters, plain and symmetric
#           (tools/nccl_symmetric_probe.py, $OUT/nccl-symmetric-probe.jsonl)
#   p2p     `ipcshare p2p` (one process over every GPU: peer pointers and cuMemcpyPeerAsync
#           against IPC windows) 8 B - P2P_MAX (256M), its GPU tests, host-staged copies with
#           peer access off, and doctor --quick with every rank under launch/bind-gpu.sh
#   latency the low-latency protocol (algo ll, ll-two-shot): its GPU tests at 2, G and G+1
#           ranks, and 8 B - 4 MiB sweeps of ll, the other kernels and NCCL, in graphs and eager;
#           the ll128 all-reduces (one-shot, two-shot) 128 KiB - 8 MiB in graphs;
#           the LL all-to-all (even splits, 8 B - 512 KiB) in graphs at G and 2 ranks
#   shared  G+1 and 2xG ranks on G GPUs (some share one; 2 ranks on a 1-GPU node): all-gather
#           and ring at 1 MiB with auto, the copy engine under both shared-GPU barriers
#           (host, stream), push and leader; the communicator's collectives at 8 KiB - 4 MiB
#           with auto (stepped kernels) against its spinning kernels (one-shot, pull), eager
#           and in graphs; the communicator by where its arrays lie (tools/placement_probe.py)
#           and the cost of handing GPU 0 between contexts (tools/timeslice_probe.py); the
#           G-rank figure beside them (2 GPUs or more); first the
#           shared-GPU tests at that many ranks; again under MPS when it can be started,
#           with the communicator and LL tests at 3 and 4 ranks where GPUs are fewer
#   nccl-tests  NVIDIA's nccl-tests (source carried in .nccl-tests/, ignored by git) built
#           here with the node's nvcc against the nvidia-nccl-cu13 wheel's NCCL (sm_90
#           CUBIN, MPI=0); all_gather_perf, all_reduce_perf, reduce_scatter_perf with
#           -g 1 -t G at -b 8 -e 256M -f 4, -R 0 and -R 2, eager and -G 20; alltoall_perf
#           (built apart) -R 0 and -R 2 -x 2 (symmetric windows of a zero-CTA communicator:
#           NCCL's copy-engine all-to-all; -R 2 alone is -R 0's path for all-to-all); logs
#           under $OUT/nccl-tests/, their Markdown table in $OUT/nccl-tests/nccl-tests.md
#   alltoall  `ipcshare alltoall` at 2 and 4 ranks (ALLTOALL_RANKS, those of them up to G),
#           --splits even, random and skewed, eager and --graph, -b 8 -e ALLTOALL_MAX (256M)
#           -f 4, each against --baseline nccl and torch, and torch-symm for even splits
#           (ALLTOALL_SYMM_SPLITS: uneven splits are refused where its kernel cannot cut
#           them, from 512 KiB - 8 MiB up); the result documents in results.jsonl (tagged "alltoall_case"), and
#           $OUT/alltoall.md (tools/alltoall_summary.py: ours beside each baseline with its
#           speedup, then nccl-tests' alltoall_perf at the same rank counts, -R 0 and
#           -R 2 -x 2, eager and -G 20, when .nccl-tests/ is carried). ALLTOALL_TESTS=1
#           first runs the baselines' GPU tests at 2 ranks (the torch-symm one in a process
#           of its own). Estimated (not yet timed) at 5-6 minutes on 2 GPUs and 11-12 on 4,
#           over one 10-minute device call there: ALLTOALL_RANKS=4 and ALLTOALL_RANKS=2 in
#           two calls, or ALLTOALL_MAX=64M in one
#   timer   all-reduce, all-gather and reduce-scatter at G ranks, 8 B - TIMER_MAX (2M), each
#           eager, in CUDA graphs and by latency samples against NCCL (nccl4py) in the same
#           launch; every row passes the timer's self-checks (exit 5 otherwise), then
#           tools/timer_consistency.py checks that the three timings of ours and of NCCL
#           tell one story ($OUT/timer-consistency.md)
#   torch-user  what a PyTorch user sees (issue 36; `ipcshare vs-torch`): ipcshare's
#           all-reduce, all-gather, reduce-scatter and all-to-all against NCCL through
#           torch.distributed on the same bf16 tensors, TORCH_USER_MIN-TORCH_USER_MAX
#           (default 8K-256M, factor TORCH_USER_FACTOR, default 2), in one CUDA graph of
#           20 calls, eager, and host time per call (ours bound and plain, torch's), at 2
#           and G ranks; every row checked (results, second clock, ceiling: exit 3 or 5
#           otherwise); $OUT/torch-user-n2.md/.json and $OUT/torch-user-n$G.md/.json
#   inter   the engines between nodes on 2 virtual nodes of this node's GPUs (2x1 on 2 GPUs,
#           2x2 on 4): tests/gpu/test_inter_gpu.py and test_multinode_gpu.py, then all-gather,
#           all-reduce and reduce-scatter sweeps INTER_MIN-INTER_MAX (default 1M-256M) with
#           --inter nccl and --inter mpi against NCCL's flat collective over all ranks
#           (--baseline nccl); results.jsonl rows carry "inter_case" (op-engine-2xL)
#   trace   where each all-to-all kernel's microseconds go: tools/kernel_trace.py (the kernels
#           built with phase stamps, IPCSHARE_KERNEL_TRACE=1) at 2 ranks for pull, balanced,
#           ll, push and eager (TRACE_ALGOS), even and random splits, TRACE_BYTES a rank
#           (default "2M 32M"; ll to 2 MiB only), in CUDA graphs of TRACE_GRAPH calls
#           (default 4; 0: eager calls); the tables in $OUT/kernel-trace.md
#   ab      a change against the code it replaces, in one launch: each case of AB_CASES
#           (cases split by ";", each "N OP ALGO MAX [FLAGS...]", default the three
#           collectives' auto at G ranks to 2M in graphs) swept 8 B (AB_MIN) to MAX against
#           NCCL, first in the checkout at AB_TREE (the base: e.g. `mkdir -p ab-base && git
#           archive main | tar -x -C ab-base`, an untracked folder that travels with the
#           tree), then in this one;
#           tools/ab_table.py puts them side by side ($OUT/ab.md; rows carry "ab_case" and
#           "ab_side"); AB_BACKEND (cuda-vmm) and AB_BASELINE (nccl) pick the sweeps' flags
#
# Writes under ${OUT:-out}: gpu-check.log (everything), results.jsonl (one result document
# per line), info.json (ipcshare info), summary.txt, and after collective sweeps
# auto-rows.md (tools/auto_rows.py: each algorithm per size beside NCCL's best, and the
# rows they propose for auto's table). Keeps going after a failure and exits
# non-zero at the end if any step failed. Each step runs under `timeout`.
#
# Knobs: COLLECTIVE_TESTS=0, COLLECTIVE_SWEEPS=0 and COLLECTIVE_VS_NCCL=0 (collectives
# phase without its tests, its per-algorithm sweeps, or its sweeps against NCCL),
# COLLECTIVE_RANKS (ranks of its sweeps, default 2: 3 or 4 on the 4-GPU node), SHARED_MPS=0 (shared phase without its MPS half),
# SHARED_QUICK=1 (shared phase: only the 1 MiB all-gather and ring at G and G + 1 ranks),
# SHARED_MPS_TESTS=1 (with SHARED_QUICK=1: the GPU tests under MPS at 3 and 4 ranks too),
# CSWEEP_RANKS (world sizes of the csweep phase), CSWEEP_MAX (its largest array, default
# 1G), CSWEEP_SLICED=0 (csweep without its time-sliced run), CSWEEP_SLICED_MAX (its largest
# array, default 1G), STEP_TIMEOUT_CSWEEP (seconds per sweep, default 400),
# BENCH_MAX (largest size, default 1G), BENCH_ITERS (default 20), BENCH_BASELINE (nccl,
# mpi or none; default nccl), STEP_TIMEOUT_TESTS (seconds per pytest run, default 420:
# on 4 H200s, 2026-11-28, tests/gpu took 246 s at 4 ranks and 145 s at 2; 8 ranks on 4
# GPUs ran 88 % in 270 s and 2 ranks sharing GPU 0 92 % in 200 s; later the same day 2 ranks
# sharing one GPU took 294 s whole and 8 ranks on 4 GPUs ran 93 % in 390 s: the shared part
# wants a device call of its own, and 2G two: 2G-1 and 2G-2), TESTS_PARTS
# (which runs of the tests phase: any of "2 examples 4 2G 2G-1 2G-2 shared mpi"; default
# "2 examples 4 2G shared mpi"; 2G-1 and 2G-2 are the 2G run over every other test file,
# from the first or the second; the whole phase outlasts one 10-minute device call on
# 4 GPUs, so split it),
# TESTS_FILES (the GPU test files or folders those runs take, default tests/gpu: a fix
# re-checked on the files it touches),
# STEP_TIMEOUT_BENCH (per sweep, default 150), ALLTOALL_RANKS (default "2 4"), ALLTOALL_MAX
# (default 256M), ALLTOALL_MIN (default 8), ALLTOALL_ITERS (default 20), ALLTOALL_ALGOS
# (the library's algorithms to sweep: pull, balanced, ll, ll128, copy-engine, push, eager (uneven
# splits only; at 3 ranks and more it refuses the random splits, a segment past its slot,
# and the sweep stops with that error); default auto; ll
# and ll128 take blocks up to 2 MiB and 8 MiB a peer, e.g.:
# ALLTOALL_ALGOS=ll ALLTOALL_SPLITS=even
# ALLTOALL_MAX=512K ALLTOALL_BASELINES=nccl; copy-engine even splits only:
# ALLTOALL_ALGOS=copy-engine ALLTOALL_SPLITS=even ALLTOALL_MIN=1M), ALLTOALL_GRAPH=0
# (eager sweeps only), ALLTOALL_REGISTER=1 (the sweeps' arrays registered with the
# communicator, -R 1: peers read the inputs in place and the push all-to-all stores into
# the outputs), ALLTOALL_SPLITS (default "even random
# skewed"), ALLTOALL_BASELINES (default "nccl torch torch-symm"), ALLTOALL_SYMM_SPLITS
# (default even), ALLTOALL_TESTS (default 0), ALLTOALL_NCCL_TESTS (default 1: nccl-tests'
# alltoall_perf beside the sweeps, from the carried .nccl-tests/; 0 leaves it out),
# STEP_TIMEOUT_ALLTOALL (per sweep, default
# 150), TORCH_USER_MIN, TORCH_USER_MAX, TORCH_USER_FACTOR (torch-user sizes, default 8K,
# 256M, 2), STEP_TIMEOUT_TORCH_USER (seconds per torch-user run, default 300), PYTHON,
# MPIEXEC.
set -u

phases=("${@:-all}")
for phase in "${phases[@]}"; do
  case "$phase" in all|tests|bench|suite|sweep|csweep|doctor|faults|fallback|namespaces|shared|collectives|p2p|latency|timer|nccl-tests|alltoall|torch-user|inter|ab) ;;
    *) echo "usage: $0 [all|tests|bench|suite|sweep|csweep|doctor|faults|fallback|namespaces|shared|collectives|p2p|latency|timer|nccl-tests|alltoall|torch-user|inter|ab]..." >&2
       exit 2 ;; esac
done
wants() {  # wants PHASE: whether PHASE was asked for (all = tests and bench)
  local asked
  for asked in "${phases[@]}"; do
    [[ $asked == "$1" || ( $asked == all && ( $1 == tests || $1 == bench ) ) ]] && return 0
  done
  return 1
}
phase="${phases[*]}"
# Bench sizes: BENCH_MIN (default 1M) to BENCH_MAX.

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo" || exit 2
OUT=${OUT:-out}
mkdir -p "$OUT"
LOG="$OUT/gpu-check.log"
RESULTS="$OUT/results.jsonl"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"

export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 PYTHONUNBUFFERED=1

BENCH_MAX=${BENCH_MAX:-1G}
BENCH_ITERS=${BENCH_ITERS:-20}
BENCH_BASELINE=${BENCH_BASELINE:-nccl}
STEP_TIMEOUT_TESTS=${STEP_TIMEOUT_TESTS:-420}
STEP_TIMEOUT_BENCH=${STEP_TIMEOUT_BENCH:-150}
STEP_TIMEOUT_CSWEEP=${STEP_TIMEOUT_CSWEEP:-400}
PY=${PYTHON:-python3}
MPIEXEC=${MPIEXEC:-mpiexec}

failures=0
started=$(date +%s)

log() { echo "$*" | tee -a "$LOG"; }

# step NAME TIMEOUT CMD...: run (a program or an exported function), tee, record the
# outcome. timeout signals its whole process group, so mpiexec and its ranks go too.
step() {
  local name=$1 limit=$2 t0 rc verdict
  shift 2
  log ""
  log "===== $name ($(date -u +%H:%M:%S), limit ${limit}s)"
  log "+ $*"
  t0=$(date +%s)
  timeout -k 15 "$limit" bash -c '"$@"' step "$@" 2>&1 | tee -a "$LOG"
  rc=${PIPESTATUS[0]}
  if [[ $rc -eq 0 ]]; then
    verdict=ok
  elif [[ $rc -eq 124 || $rc -eq 137 ]]; then
    verdict="TIMEOUT after ${limit}s"
    failures=$((failures + 1))
  else
    verdict="FAILED rc=$rc"
    failures=$((failures + 1))
  fi
  printf '%-58s %-22s %4ss\n' "$name" "$verdict" "$(( $(date +%s) - t0 ))" | tee -a "$SUMMARY" >>"$LOG"
}

# Wheels brought along, none of them on the nodes' image: pytest-mpi, nccl4py (the nccl
# baseline), ml_dtypes (the reduction tests' reference). MPICH's go elsewhere (below).
extra_wheels=()
for wheel in .whl/pytest_mpi-*.whl .whl/nccl4py-*.whl .whl/ml_dtypes-*.whl; do
  [[ -f $wheel ]] && extra_wheels+=("$wheel")
done
if [[ ${#extra_wheels[@]} -gt 0 ]]; then
  "$PY" -m pip install -q --no-index --no-deps --target /tmp/site "${extra_wheels[@]}" 2>&1 | tee -a "$LOG"
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
# MPICH (with its gforker launcher) and an mpi4py that can bind to it, under a prefix of
# their own: only the dead-peer tests use them (Open MPI's launcher kills the whole job
# when a rank dies, so it cannot show survivors noticing a death by themselves).
MPICH_PREFIX=/tmp/mpich
if compgen -G ".whl/mpich-*.whl" >/dev/null && compgen -G ".whl/mpi4py-*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --prefix "$MPICH_PREFIX" .whl/mpich-*.whl \
    .whl/mpi4py-*.whl 2>&1 | tee -a "$LOG"
fi
# The package is not installed on the node: run it from the checkout.
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"

log "===== gpu-check $phase on $(hostname) at $(date -u +%FT%TZ)"
log "PYTHONPATH=$PYTHONPATH"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi 2>&1 | tee -a "$LOG"
  nvidia-smi topo -m 2>&1 | tee -a "$LOG"
  G=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
else
  log "nvidia-smi: not found"
  G=0
fi
if [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then
  IFS=, read -r -a visible <<<"$CUDA_VISIBLE_DEVICES"
  G=${#visible[@]}
fi
"$PY" - <<'EOF' 2>&1 | tee -a "$LOG"
import importlib, platform
print("python", platform.python_version())
for name in ("numpy", "mpi4py", "torch", "cupy", "cuda.bindings", "pytest", "pytest_mpi"):
    try:
        module = importlib.import_module(name)
        print(f"{name:14s}", getattr(module, "__version__", "?"))
    except Exception as exc:  # report and carry on
        print(f"{name:14s} not importable: {exc}")
try:
    import torch
    print("torch cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(),
          "devices", torch.cuda.device_count())
except Exception as exc:
    print("torch cuda: n/a:", exc)
EOF
"$MPIEXEC" --version 2>&1 | head -1 | tee -a "$LOG"
log "GPUs visible: $G"

step "ipcshare info" 120 "$PY" -m ipcshare info --json "$OUT/info.json"

if [[ $G -lt 1 ]]; then
  log "no GPU visible: nothing more to check"
  failures=$((failures + 1))
fi

pytest_run() {  # pytest_run N [extra mpiexec args...]
  local n=$1
  shift
  # The slowest tests listed (--durations): the shared-GPU runs outlast a device call, and
  # the list says where their time goes.
  # shellcheck disable=SC2086 # TESTS_FILES is a list of paths
  "$MPIEXEC" -n "$n" --bind-to none "$@" "$PY" -m pytest -q -rs --with-mpi -m gpu \
    -p no:cacheprovider --durations=25 ${TESTS_FILES:-tests/gpu}
}
export -f pytest_run
mpi_suite_run() {  # mpi_suite_run N: tests/mpi under the node's MPI
  "$MPIEXEC" -n "$1" --bind-to none "$PY" -m pytest -q -rs --with-mpi -m mpi \
    -p no:cacheprovider tests/mpi
}
export -f mpi_suite_run
export PY MPIEXEC OUT RESULTS TESTS_FILES BENCH_MAX BENCH_ITERS BENCH_BASELINE

test_files_half() {  # test_files_half 1|2: every other test file of TESTS_FILES (folders
  # expanded, sorted), from the first or the second: two runs of about equal length
  local entry files=() i
  # shellcheck disable=SC2086 # TESTS_FILES is a list of paths
  for entry in ${TESTS_FILES:-tests/gpu}; do
    if [[ -d $entry ]]; then
      while IFS= read -r file; do files+=("$file"); done < <(find "$entry" -name 'test_*.py' | sort)
    else
      files+=("$entry")
    fi
  done
  for ((i = $1 - 1; i < ${#files[@]}; i += 2)); do printf '%s ' "${files[i]}"; done
}
tests_part() {  # tests_part PART: whether TESTS_PARTS asks for PART (every part by default)
  [[ " ${TESTS_PARTS:-2 examples 4 2G shared mpi} " == *" $1 "* ]]
}
if [[ $G -ge 1 ]] && wants tests; then
  tests_part 2 && step "pytest tests/gpu, 2 ranks" "$STEP_TIMEOUT_TESTS" pytest_run 2
  # They launch mpiexec (2 ranks on 2 GPUs), or drive both GPUs from one process.
  if [[ $G -ge 2 ]] && tests_part examples; then
    step "pytest tests/gpu/test_examples.py test_triton_examples.py test_line_probe_gpu.py" \
      "$STEP_TIMEOUT_TESTS" "$PY" -m pytest -q -rs -s -m "gpu and not mpi" \
      -p no:cacheprovider tests/gpu/test_examples.py tests/gpu/test_triton_examples.py \
      tests/gpu/test_line_probe_gpu.py
  fi
  if [[ $G -ge 4 ]]; then
    tests_part 4 && step "pytest tests/gpu, 4 ranks" "$STEP_TIMEOUT_TESTS" pytest_run 4
  fi
  # Two ranks a GPU (8 on 4 GPUs, 4 on 2): every GPU shared, contexts taking turns.
  if [[ $G -ge 2 ]]; then
    tests_part 2G && step "pytest tests/gpu, $((2 * G)) ranks on $G GPUs" "$STEP_TIMEOUT_TESTS" \
      pytest_run $((2 * G))
    # The same in two halves of the test files, each within one device call.
    for half in 1 2; do
      tests_part "2G-$half" && TESTS_FILES="$(test_files_half "$half")" step \
        "pytest tests/gpu, $((2 * G)) ranks on $G GPUs, files half $half" "$STEP_TIMEOUT_TESTS" \
        pytest_run $((2 * G))
    done
  fi
  # Open MPI passes -x variables to every rank explicitly.
  tests_part shared && CUDA_VISIBLE_DEVICES=0 step "pytest tests/gpu, 2 ranks sharing GPU 0" \
    "$STEP_TIMEOUT_TESTS" pytest_run 2 -x CUDA_VISIBLE_DEVICES
  # The MPI suite (host backend, exchanges, garbage, multi-node simulation) under the
  # node's own Open MPI, not only under the MPICH wheel that CI uses.
  if tests_part mpi; then
    step "pytest tests/mpi, 2 ranks (node MPI)" "$STEP_TIMEOUT_TESTS" mpi_suite_run 2
    step "pytest tests/mpi, 3 ranks (node MPI)" "$STEP_TIMEOUT_TESTS" mpi_suite_run 3
  fi
fi

setup_time() {  # setup_time BACKEND N: window creation with a small (1 MiB) window
  "$MPIEXEC" -n "$2" --bind-to none "$PY" -m ipcshare allgather --backend "$1" \
    -b 1M -e 1M -n 5 -w 1 -c 1 | grep -E "window setup|Out of bounds"
}
export -f setup_time

if [[ $G -ge 2 ]] && wants bench; then
  for backend in cuda-ipc cuda-vmm; do
    step "window setup $backend n=$G" 120 setup_time "$backend" "$G"
  done
fi

bench() {  # bench OP BACKEND N [EXTRA FLAGS...]
  local op=$1 backend=$2 n=$3 json="$OUT/$1-$2-$3.json" rc
  shift 3
  "$MPIEXEC" -n "$n" --bind-to none "$PY" -m ipcshare "$op" --backend "$backend" \
    -b "${BENCH_MIN:-1M}" -e "$BENCH_MAX" -f 4 -n "$BENCH_ITERS" -w 5 -c 1 --baseline "$BENCH_BASELINE" --json "$json" "$@"
  rc=$?
  # One line per document in results.jsonl: the node hands back few files.
  if [[ -s "$json" ]]; then
    "$PY" -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1]))))' "$json" >>"$RESULTS"
    rm -f "$json"
  fi
  return $rc
}
export -f bench

if [[ $G -ge 2 ]] && wants bench; then
  sizes=(2)
  [[ $G -ge 4 ]] && sizes+=(4)
  for backend in cuda-ipc cuda-vmm; do
    for n in "${sizes[@]}"; do
      for op in allgather ring; do
        step "bench $op $backend n=$n" "$STEP_TIMEOUT_BENCH" bench "$op" "$backend" "$n"
      done
    done
  done
  # As in an application: an empty kernel before every all-gather (ours and NCCL's); the
  # copy engine on 4 GPUs is slower then (docs/BENCHMARKS.md, "After a kernel").
  if [[ $BENCH_BASELINE != mpi ]]; then
    step "bench allgather cuda-vmm n=$G after a kernel" "$STEP_TIMEOUT_BENCH" \
      bench allgather cuda-vmm "$G" --after-kernel
  fi
  if [[ $G -ge 4 ]]; then
    # The same node as 2 virtual nodes x 2 GPUs: the hierarchical all-gather (rails),
    # its MPI step with device pointers if the MPI is CUDA-aware, else host-staged.
    IPCSHARE_VIRTUAL_NODES=2 step "bench allgather cuda-vmm n=4 as 2 virtual nodes x 2" \
      "$STEP_TIMEOUT_BENCH" bench allgather cuda-vmm 4
  fi
elif wants bench; then
  log "bench: needs 2 GPUs (NCCL runs one rank per GPU); skipped"
fi

suite() {  # suite N CONFIG: one `ipcshare bench` launch, outputs under $OUT/bench
  mkdir -p "$OUT/bench"
  local name
  name=$(basename "$2" .yaml)-n$1
  "$MPIEXEC" -n "$1" --bind-to none "$PY" -m ipcshare bench --config "$2"     --json "$OUT/bench/$name.json" --plot "$OUT/bench/$name.png" --markdown "$OUT/bench/$name.md"
}
export -f suite
if wants suite; then
  if [[ -f configs/bench-h200-x$G.yaml ]]; then
    step "bench suite configs/bench-h200-x$G.yaml n=$G" "${STEP_TIMEOUT_SUITE:-540}" \
      suite "$G" "configs/bench-h200-x$G.yaml"
  else
    log "suite: no configs/bench-h200-x$G.yaml for $G GPUs; skipped"
  fi
fi

sweep() {  # sweep N ALGO [--graph]: 1 byte to 387 MiB in odd sizes, then 1 GiB; all verified
  set -o pipefail
  "$MPIEXEC" -n "$1" --bind-to none "$PY" -m ipcshare allgather --backend cuda-vmm \
    --algo "$2" -b 1 -e 1G -f 9 -n 2 -w 1 -c 2 -d uint8 "${@:3}" | grep -Ev "^#  Rank" &&
  "$MPIEXEC" -n "$1" --bind-to none "$PY" -m ipcshare allgather --backend cuda-vmm \
    --algo "$2" -b 1G -e 1G -n 2 -w 1 -c 2 -d uint8 "${@:3}" | grep -Ev "^#  Rank"
}
export -f sweep
if [[ $G -ge 2 ]] && wants sweep; then
  for backend in cuda-ipc cuda-vmm; do
    step "window setup $backend n=$G" 120 setup_time "$backend" "$G"
  done
  for n in 3 $((2 * G)); do
    for algo in copy-engine push pull ring; do
      step "sweep allgather $algo n=$n 1B-1G" 240 sweep "$n" "$algo"
    done
    step "sweep allgather auto n=$n 1B-1G in graphs" 240 sweep "$n" auto --graph
    step "sweep allgather push n=$n 1B-1G in graphs" 240 sweep "$n" push --graph
  done
fi

csweep_run() {  # csweep_run N LABEL [SWEEP ARGS...]: tools/collective_sweep.py at N ranks
  local n=$1 label=$2 forward=()
  shift 2
  [[ -n ${CUDA_MPS_PIPE_DIRECTORY:-} ]] && forward+=(-x CUDA_MPS_PIPE_DIRECTORY -x CUDA_MPS_LOG_DIRECTORY)
  "$MPIEXEC" -n "$n" --bind-to none "${forward[@]}" "$PY" tools/collective_sweep.py \
    --max-bytes "${CSWEEP_MAX:-1G}" --json "$OUT/csweep-$label-n$n.json" "$@"
}
export -f csweep_run
if [[ $G -ge 1 ]] && wants csweep; then
  # World sizes (CSWEEP_RANKS, default 2 3 4 and 2xG): those up to G on GPUs of their own,
  # the larger ones under MPS, where ranks on one GPU run side by side (so any node runs
  # the 3- and 4-rank code; correctness only).
  own=() beyond=()
  for n in $(printf '%s\n' ${CSWEEP_RANKS:-2 3 4 $((2 * G))} | sort -nu); do
    (( n <= G )) && own+=("$n") || beyond+=("$n")
  done
  for n in "${own[@]}"; do
    step "csweep n=$n" "$STEP_TIMEOUT_CSWEEP" csweep_run "$n" own
  done
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/ipcshare-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/ipcshare-mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if (( ${#beyond[@]} == 0 )); then
    :
  elif command -v nvidia-cuda-mps-control >/dev/null && nvidia-cuda-mps-control -d; then
    log "MPS daemon started"
    for n in "${beyond[@]}"; do
      step "csweep n=$n under MPS" "$STEP_TIMEOUT_CSWEEP" csweep_run "$n" mps
    done
    echo quit | nvidia-cuda-mps-control
    sleep 2
    log "MPS daemon stopped"
  else
    log "csweep: MPS could not be started here; ${beyond[*]} ranks skipped"
  fi
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  # GPUs that take turns (G + 1 ranks, no MPS): the stepped kernels, and auto, which runs
  # them there (CSWEEP_SLICED=0 leaves this out; the later --max-bytes wins).
  [[ ${CSWEEP_SLICED:-1} == 0 ]] || step "csweep n=$((G + 1)) time-sliced" \
    "$STEP_TIMEOUT_CSWEEP" csweep_run $((G + 1)) time-sliced --algos stepped,auto \
    --max-bytes "${CSWEEP_SLICED_MAX:-1G}"
fi

doctor_run() {  # doctor_run N [--quick]
  mkdir -p "$OUT/doctor"
  "$MPIEXEC" -n "$1" --bind-to none "$PY" -m ipcshare doctor "${@:2}"
}
export -f doctor_run
if [[ $G -ge 1 ]] && wants doctor; then
  # Reports are named by the GPU model the node has (h100, h200, ...) and the count.
  model=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 |
          grep -oiE 'h[0-9]{3}|a[0-9]{3}|b[0-9]{3}' | tr '[:upper:]' '[:lower:]')
  report="$OUT/doctor/${model:-gpu}-x$G"
  step "doctor --quick n=$G" 120 doctor_run "$G" --quick
  step "doctor (full) n=$G" 180 doctor_run "$G" --json "$report.json" --yaml "$report.yaml"
  step "doctor --quick n=$((2 * G)) (2 ranks per GPU)" 120 doctor_run $((2 * G)) --quick
fi

faults_pytest() {  # the dead-peer tests, with mpi4py bound to MPICH and its gforker
  local site
  site=$(ls -d "$MPICH_PREFIX"/lib/python3*/site-packages) || return 1
  PYTHONPATH="$site:$PYTHONPATH" MPI4PY_LIBMPI="$MPICH_PREFIX/lib/libmpi.so.12" \
    IPCSHARE_MPICH_BIN="$MPICH_PREFIX/bin" \
    "$PY" -m pytest -q -p no:cacheprovider -rs -m "not slow" tests/faults tests/gpu/test_gpu_faults.py
}
soak_run() {  # soak_run N BACKEND WINDOWS RING_ITERS
  mkdir -p "$OUT/soak"
  "$MPIEXEC" -n "$1" --bind-to none "$PY" tools/soak.py --backend "$2" --windows "$3" \
    --ring-iters "$4" --json "$OUT/soak/soak-$2-n$1.json"
}
export -f faults_pytest soak_run
export MPICH_PREFIX
if wants faults; then
  if [[ -x $MPICH_PREFIX/bin/mpiexec.gforker ]]; then
    step "dead-peer tests under gforker (host and GPU backends)" 300 faults_pytest
  else
    log "faults: no MPICH under $MPICH_PREFIX (bring the mpich and mpi4py wheels in .whl/)"
    failures=$((failures + 1))
  fi
  if [[ $G -ge 2 ]]; then
    for backend in cuda-vmm cuda-ipc; do
      step "soak $backend n=2: 10000 windows, 100000 ring iterations" 300 \
        soak_run 2 "$backend" 10000 100000
    done
    step "soak cuda-vmm n=$G: 1000 windows, 20000 ring iterations" 300 \
      soak_run "$G" cuda-vmm 1000 20000
  fi
fi

append_result() {  # append_result JSON KEY VALUE [KEY VALUE...]: JSON's document, tagged, onto $RESULTS
  [[ -s "$1" ]] || return 0
  "$PY" -c 'import json, sys
d = json.load(open(sys.argv[1])); d.update(zip(sys.argv[2::2], sys.argv[3::2])); print(json.dumps(d))' \
    "$@" >>"$RESULTS"
  rm -f "$1"
}
export -f append_result
fallback_tests() {  # fallback_tests N [extra mpiexec args...]
  local n=$1
  shift
  "$MPIEXEC" -n "$n" --bind-to none "$@" "$PY" -m pytest -q -rs --with-mpi -m gpu \
    -p no:cacheprovider tests/gpu/test_fallbacks.py tests/gpu/test_windows.py -k "fallback or peer_access"
}
fallback_env() {  # fallback_env DISABLED FALLBACK CMD...: run CMD with the pairs disabled
  IPCSHARE_DISABLE_P2P=$1 IPCSHARE_P2P_FALLBACK=$2 "${@:3}"
}
fallback_bench() {  # fallback_bench OP LABEL DISABLED FALLBACK N: one sweep, one JSON line
  local json="$OUT/fallback-$1-$2-n$5.json" rc
  IPCSHARE_DISABLE_P2P=$3 IPCSHARE_P2P_FALLBACK=$4 "$MPIEXEC" -n "$5" --bind-to none \
    -x IPCSHARE_DISABLE_P2P -x IPCSHARE_P2P_FALLBACK "$PY" -m ipcshare "$1" \
    --backend cuda-vmm --algo copy-engine -b 1M -e "${FALLBACK_MAX:-256M}" -f 4 \
    -n "$BENCH_ITERS" -w 3 -c 1 --json "$json" | grep -Ev "^#  Rank"
  rc=${PIPESTATUS[0]}
  append_result "$json" fallback "$2"
  return $rc
}
export -f fallback_tests fallback_env fallback_bench
if [[ $G -ge 2 ]] && wants fallback; then
  if [[ $G -ge 4 ]]; then disabled=0-2,1-3; else disabled=0-1; fi
  step "fallback tests n=2 (host-staged)" "$STEP_TIMEOUT_TESTS" fallback_tests 2
  [[ $G -ge 3 ]] && step "fallback tests n=$G (relay and host-staged)" "$STEP_TIMEOUT_TESTS" \
    fallback_tests "$G"
  step "fallback tests n=$((2 * G)) (2 ranks per GPU)" "$STEP_TIMEOUT_TESTS" fallback_tests $((2 * G))
  step "ipcshare info, $disabled disabled" 120 fallback_env "$disabled" auto \
    "$MPIEXEC" -n "$G" --bind-to none -x IPCSHARE_DISABLE_P2P -x IPCSHARE_P2P_FALLBACK \
    "$PY" -m ipcshare info --json "$OUT/info-fallback.json"
  step "doctor --quick n=$G, $disabled disabled" 180 fallback_env "$disabled" auto \
    "$MPIEXEC" -n "$G" --bind-to none -x IPCSHARE_DISABLE_P2P -x IPCSHARE_P2P_FALLBACK \
    "$PY" -m ipcshare doctor --quick
  for op in allgather ring; do
    step "fallback $op direct n=$G" "$STEP_TIMEOUT_BENCH" fallback_bench "$op" direct "" auto "$G"
    # The ring only uses neighbour pairs: disable ring edges for it (0-2,1-3 are none).
    pairs=$disabled
    [[ $op == ring && $G -ge 4 ]] && pairs=0-1,2-3
    [[ $G -ge 3 ]] && step "fallback $op relay ($pairs) n=$G" "$STEP_TIMEOUT_BENCH" \
      fallback_bench "$op" relay "$pairs" relay "$G"
    step "fallback $op host-staged ($pairs) n=$G" "$STEP_TIMEOUT_BENCH" \
      fallback_bench "$op" host-staged "$pairs" host "$G"
  done
elif wants fallback; then
  log "fallback: needs 2 GPUs; skipped"
fi

collective_tests() {  # collective_tests N FILE...: GPU tests of the collectives and baselines
  local n=$1
  shift
  "$MPIEXEC" -n "$n" --bind-to none "$PY" -m pytest -q -rs --with-mpi -m gpu \
    -p no:cacheprovider "$@"
}
collective_bench() {  # collective_bench N OP ALGO [extra flags...]: one sweep, into $RESULTS
  local n=$1 op=$2 algo=$3 json rc
  shift 3
  json="$OUT/collective-$op-$algo-n$n.json"
  "$MPIEXEC" -n "$n" --bind-to none "$PY" -m ipcshare "$op" --backend cuda-vmm \
    --algo "$algo" -b "${COLLECTIVE_MIN:-8}" -e "${COLLECTIVE_MAX:-64M}" -f 4 \
    -n "${COLLECTIVE_ITERS:-50}" -w 5 -c 1 --json "$json" "$@" | grep -Ev "^#  Rank"
  rc=${PIPESTATUS[0]}
  append_result "$json" collective_case "$op-$algo${*:+ $*}"
  return $rc
}
export -f collective_tests collective_bench
if [[ $G -ge 2 ]] && wants collectives; then
  CN=${COLLECTIVE_RANKS:-2}  # ranks of the sweeps (the tests run at 2); at most G
  (( CN > G )) && CN=$G
  # The tests first (COLLECTIVE_TESTS=0 skips them, for a call that only measures).
  if [[ ${COLLECTIVE_TESTS:-1} != 0 ]]; then
    step "Communicator GPU tests n=2" "$STEP_TIMEOUT_TESTS" collective_tests 2 \
      tests/gpu/test_gpu_communicator.py
    step "register GPU tests n=2" "$STEP_TIMEOUT_TESTS" collective_tests 2 \
      tests/gpu/test_register_gpu.py
    # Baselines: torch-symm in a process of its own (symmetric memory keeps per-group state).
    step "baseline GPU tests n=2" "$STEP_TIMEOUT_TESTS" collective_tests 2 \
      tests/gpu/test_gpu_baselines.py tests/gpu/test_after_kernel.py
    step "torch-symm baseline GPU tests n=2" "$STEP_TIMEOUT_TESTS" collective_tests 2 \
      tests/gpu/test_torch_symm_baseline.py
  fi
  # NCCL alone on the float16 reduce-scatter that our nccl baseline saw wrong on symmetric
  # windows (odd counts; nccl-tests cannot ask for them): a finding, not a failure.
  step "NCCL float16 reduce-scatter probe n=$G (tools/nccl_symmetric_probe.py)" 300 \
    "$MPIEXEC" -n "$G" --bind-to none "$PY" tools/nccl_symmetric_probe.py \
    --json "$OUT/nccl-symmetric-probe.jsonl"
  # Each algorithm alone (COLLECTIVE_SWEEPS=0 skips these).
  [[ ${COLLECTIVE_SWEEPS:-1} == 0 ]] || for op in allreduce reducescatter; do
    algos="one-shot push"
    [[ $op == allreduce ]] && algos="one-shot two-shot copy-engine push auto"
    for algo in $algos; do
      step "$op $algo n=$CN" "$STEP_TIMEOUT_BENCH" collective_bench "$CN" "$op" "$algo"
      step "$op $algo n=$CN graph" "$STEP_TIMEOUT_BENCH" collective_bench "$CN" "$op" "$algo" --graph
    done
  done
  # Against each baseline in the same launch, in graphs and eager (COLLECTIVE_BASELINES;
  # COLLECTIVE_VS_NCCL=0 leaves out these, -R 1 and the push sweeps below).
  [[ ${COLLECTIVE_VS_NCCL:-1} == 0 ]] || for baseline in ${COLLECTIVE_BASELINES:-nccl}; do
    for mode in --graph ""; do
      step "allreduce auto n=$CN vs $baseline $mode" "$STEP_TIMEOUT_BENCH" collective_bench "$CN" \
        allreduce auto $mode --baseline "$baseline"
      [[ $baseline == torch-symm ]] && continue
      step "reducescatter auto n=$CN vs $baseline $mode" "$STEP_TIMEOUT_BENCH" collective_bench "$CN" \
        reducescatter auto $mode --baseline "$baseline"
      step "allgather auto n=$CN vs $baseline $mode" "$STEP_TIMEOUT_BENCH" collective_bench "$CN" \
        allgather auto $mode --baseline "$baseline"
    done
  done
  # Registered arrays (-R 1, as nccl-tests' -R): inputs read in place, no copy in, against
  # NCCL's best path in the same launch.
  [[ ${COLLECTIVE_VS_NCCL:-1} == 0 ]] || for mode in --graph ""; do
    for op in allreduce reducescatter; do
      step "$op auto -R 1 n=$CN vs nccl $mode" "$STEP_TIMEOUT_BENCH" collective_bench "$CN" \
        "$op" auto -R 1 $mode --baseline nccl
    done
  done
  # The push kernels from 1 MiB, copied and registered, against NCCL in the same launch:
  # the bandwidth rows of auto's table (issue: 1.2x NCCL's busbw at 1-64 MiB).
  [[ ${COLLECTIVE_VS_NCCL:-1} == 0 ]] || for mode in --graph ""; do
    for op in allreduce reducescatter; do
      for arrays in "-R 0" "-R 1"; do
        step "$op push $arrays n=$CN vs nccl $mode" "$STEP_TIMEOUT_BENCH" collective_bench "$CN" \
          "$op" push $arrays $mode --baseline nccl -b 1M -e "${COLLECTIVE_PUSH_MAX:-256M}"
      done
    done
  done
elif wants collectives; then
  log "collectives: needs 2 GPUs; skipped"
fi

if [[ $G -ge 2 ]] && wants latency; then
  # The low-latency protocol: its tests at G ranks (and 2 and G+1 ranks, some sharing a
  # GPU), the Communicator's tests of it, then small-message sweeps of ll against the
  # other kernels and NCCL (nccl4py, plain and symmetric) in the same launch, in graphs
  # and eager.
  step "LL tests n=$G" "$STEP_TIMEOUT_TESTS" collective_tests "$G" tests/gpu/test_gpu_low_latency.py
  [[ $G -gt 2 ]] && step "LL tests n=2" "$STEP_TIMEOUT_TESTS" collective_tests 2 \
    tests/gpu/test_gpu_low_latency.py
  step "Communicator tests n=$G" "$STEP_TIMEOUT_TESTS" collective_tests "$G" \
    tests/gpu/test_gpu_communicator.py
  step "LL tests n=$((G + 1)) (shared GPU)" "$STEP_TIMEOUT_TESTS" collective_tests $((G + 1)) \
    tests/gpu/test_gpu_low_latency.py
  # The launch cost from Python: a call, a bound call, a bare launch of an empty kernel.
  step "launch overhead n=$G" "$STEP_TIMEOUT_BENCH" "$MPIEXEC" -n "$G" --bind-to none "$PY" \
    tools/launch_overhead_probe.py
  # auto (ll up to 512 KiB on 2 GPUs) and each kernel alone, against NCCL in the same
  # launch, in graphs and eager (bound calls; the host column is Python's time per call).
  # Beyond 2 ranks auto does not pick ll yet, so ll runs alone there, 8 B to its 2 MiB.
  pairs=("allgather auto 4M" "allreduce auto 4M" "reducescatter auto 4M")
  [[ $G -gt 2 ]] && pairs+=("allgather ll 2M" "allreduce ll 2M" "reducescatter ll 2M")
  # The LL two-shot all-reduce (not in auto's rows yet), at 2 ranks and G alike.
  pairs+=("allreduce ll-two-shot 2M")
  pairs+=("allgather push 512K" "allreduce one-shot 512K" "reducescatter one-shot 512K")
  for mode in --graph ""; do
    for pair in "${pairs[@]}"; do
      set -- $pair
      COLLECTIVE_MAX=$3 step "$1 $2 n=$G vs nccl $mode" "$STEP_TIMEOUT_BENCH" \
        collective_bench "$G" "$1" "$2" $mode --baseline nccl
    done
  done
  # The all-reduces by 128-byte lines (not in auto's rows yet), in graphs from 128 KiB to
  # their buffers' 8 MiB: the sizes of auto's sweep above (8 B x 4^k), for the rows.
  for algo in ll128 ll128-two-shot; do
    COLLECTIVE_MIN=128K COLLECTIVE_MAX=8M step "allreduce $algo n=$G 128K-8M vs nccl --graph" \
      "$STEP_TIMEOUT_BENCH" collective_bench "$G" allreduce "$algo" --graph --baseline nccl
  done
  if [[ $G -eq 2 ]]; then
    # Where ll stops winning: 512 KiB to 2 MiB in graphs (its buffers take 2 MiB inputs).
    for op in allgather allreduce reducescatter; do
      COLLECTIVE_MIN=512K COLLECTIVE_MAX=2M step "$op ll n=$G 512K-2M vs nccl --graph" \
        "$STEP_TIMEOUT_BENCH" collective_bench "$G" "$op" ll --graph --baseline nccl
    done
  else
    # 3 ranks, in graphs: the rows auto needs for 3 ranks (ll against auto's kernels).
    for op in allgather allreduce reducescatter; do
      for algo in ll auto; do
        COLLECTIVE_MAX=2M step "$op $algo n=3 vs nccl --graph" "$STEP_TIMEOUT_BENCH" \
          collective_bench 3 "$op" "$algo" --graph --baseline nccl
      done
    done
  fi
  # Latency timing in graphs: p50 and p95 per size, ours and NCCL's, 4 B to 1 MiB.
  for op in allgather allreduce; do
    COLLECTIVE_MIN=4 COLLECTIVE_MAX=1M COLLECTIVE_ITERS=200 step \
      "$op auto n=$G latency graph vs nccl" "$STEP_TIMEOUT_BENCH" collective_bench "$G" "$op" \
      auto --graph --timing latency --baseline nccl
  done
  # The LL all-to-all (even splits; auto's choice up to 512 KiB) in graphs at G ranks and 2,
  # against NCCL in the same launch (issue 42: at most 7 us up to 8 KiB).
  ll_alltoall() {  # ll_alltoall N: one sweep, into $RESULTS
    local json="$OUT/alltoall-ll-n$1.json" rc
    "$MPIEXEC" -n "$1" --bind-to none "$PY" -m ipcshare alltoall --backend cuda-vmm --algo ll \
      --splits even -b 8 -e 512K -f 4 -n 50 -w 5 -c 1 --graph --baseline nccl --json "$json" \
      | grep -Ev "^#  Rank"
    rc=${PIPESTATUS[0]}
    append_result "$json" alltoall_case "n$1 even nccl ll graph"
    return $rc
  }
  export -f ll_alltoall
  for n in $(printf '%s\n' "$G" 2 | sort -un); do
    step "alltoall ll n=$n vs nccl --graph" "$STEP_TIMEOUT_BENCH" ll_alltoall "$n"
  done
elif wants latency; then
  log "latency: needs 2 GPUs; skipped"
fi

timer_case() {  # timer_case N OP MODE: OP at N ranks timed MODE-wise against NCCL, tagged
  local n=$1 op=$2 mode=$3 json="$OUT/timer-$2-$3.json" flags=() rc
  [[ $mode == graph ]] && flags=(--graph)
  [[ $mode == latency ]] && flags=(--timing latency)
  "$MPIEXEC" -n "$n" --bind-to none "$PY" -m ipcshare "$op" --backend cuda-vmm \
    -b "${TIMER_MIN:-8}" -e "${TIMER_MAX:-2M}" -f 4 -n 50 -w 5 -c 1 --baseline nccl \
    --json "$json" "${flags[@]}" | grep -Ev "^#  Rank"
  rc=${PIPESTATUS[0]}
  append_result "$json" timer_case "$op-$mode"
  return $rc
}
export -f timer_case
if [[ $G -ge 2 ]] && wants timer; then
  # The measurement issue's check: every collective eager, in graphs and by latency, ours
  # and NCCL's, on every GPU; each row passes the timer's two self-checks (a non-zero exit
  # is a measurement error or wrong data), then tools/timer_consistency.py says whether
  # the three timings of each side tell one story.
  for op in allreduce allgather reducescatter; do
    for mode in eager graph latency; do
      step "timer $op $mode n=$G vs nccl" "$STEP_TIMEOUT_BENCH" timer_case "$G" "$op" "$mode"
    done
  done
  step "eager, graph and latency tell one story" 60 "$PY" tools/timer_consistency.py \
    "$RESULTS" --markdown "$OUT/timer-consistency.md"
elif wants timer; then
  log "timer: needs 2 GPUs; skipped"
fi

ab_case_run() {  # ab_case_run SIDE CASE: CASE ("N OP ALGO MAX [FLAGS...]") in SIDE's tree
  local side=$1 dir=$repo json="$OUT/ab-$1.json" n op algo max rest rc package
  local -a flags
  [[ $side == base ]] && dir=$AB_TREE
  read -r n op algo max rest <<<"$2"
  read -r -a flags <<<"$rest"
  # The base's package first: python -m puts the working directory first on sys.path.
  (cd "$dir" && PYTHONPATH="$dir:$PYTHONPATH" "$MPIEXEC" -n "$n" --bind-to none "$PY" -m \
    ipcshare "$op" --backend "${AB_BACKEND:-cuda-vmm}" --algo "$algo" -b "${AB_MIN:-8}" -e "$max" \
    -f 4 -n 50 -w 5 -c 1 --baseline "${AB_BASELINE:-nccl}" --json "$json" "${flags[@]}") \
    | grep -Ev "^#  Rank"
  rc=${PIPESTATUS[0]}
  # Which package the side imported: ab_table.py refuses two sides that ran the same one.
  package=$(cd "$dir" && PYTHONPATH="$dir:$PYTHONPATH" "$PY" -c 'import os, ipcshare
print(os.path.dirname(os.path.abspath(ipcshare.__file__)))')
  append_result "$json" ab_case "$2" ab_side "$side" ab_package "$package"
  return $rc
}
ab_compile() {  # ab_compile DIR: the NVRTC kernels of DIR's tree into the kernel cache
  (cd "$1" && PYTHONPATH="$1:$PYTHONPATH" "$PY" -c 'from ipcshare.kernels import KERNEL_SOURCES, compile_kernel_source
for source in KERNEL_SOURCES: compile_kernel_source(source)')
}
export -f ab_case_run ab_compile
# trace: where each all-to-all kernel's microseconds go (tools/kernel_trace.py, the kernels
# built with phase stamps), at 2 ranks, TRACE_BYTES a rank (default "2M 32M"), even and
# random splits, each algorithm of TRACE_ALGOS (default "pull balanced ll push eager"; ll up
# to 2 MiB), graphs of TRACE_GRAPH calls (default 4, 0: eager calls); the tables in
# $OUT/kernel-trace.md.
kernel_trace_run() {  # kernel_trace_run ALGO SPLITS BYTES
  local -a graph=()
  [[ ${TRACE_GRAPH:-4} != 0 ]] && graph=(--graph "${TRACE_GRAPH:-4}")
  "$MPIEXEC" -n 2 --bind-to none "$PY" tools/kernel_trace.py --algo "$1" --splits "$2" \
    --bytes "$3" "${graph[@]}" --json "$OUT/kernel-trace-$1-$2-$3.json" \
    | tee -a "$OUT/kernel-trace.md"
}
export -f kernel_trace_run
if [[ $G -ge 2 ]] && wants trace; then
  : >"$OUT/kernel-trace.md"
  for bytes in ${TRACE_BYTES:-2M 32M}; do
    for splits in even random; do
      for algo in ${TRACE_ALGOS:-pull balanced ll push eager}; do
        [[ $algo == ll && $("$PY" -c "from ipcshare.runtime.config import parse_size as p
print(int(p('$bytes') > 2 * 2**20))") == 1 ]] && continue
        step "trace $algo $splits $bytes" 120 kernel_trace_run "$algo" "$splits" "$bytes"
      done
    done
  done
elif wants trace; then
  log "trace: needs 2 GPUs; skipped"
fi

if [[ $G -ge 2 ]] && wants ab; then
  if [[ -z ${AB_TREE:-} || ! -d ${AB_TREE:-/nonexistent}/ipcshare ]]; then
    log "ab: AB_TREE must name a checkout of the base (a folder holding ipcshare/); skipped"
    failures=$((failures + 1))
  else
    AB_TREE=$(cd "$AB_TREE" && pwd)
    export AB_TREE repo
    # Both trees' kernels at once (a cold NVRTC compile takes 35-60 s each).
    ab_compile "$AB_TREE" >"$OUT/ab-compile-base.log" 2>&1 &
    step "ab: compile this tree's kernels" 300 ab_compile "$repo"
    wait
    IFS=';' read -r -a ab_cases <<<"${AB_CASES:-$G allreduce auto 2M --graph;$G allgather auto 2M --graph;$G reducescatter auto 2M --graph}"
    for case in "${ab_cases[@]}"; do
      case=$(xargs <<<"$case")   # trimmed
      [[ -z $case ]] && continue
      for side in base this; do
        step "ab $side: $case" "$STEP_TIMEOUT_BENCH" ab_case_run "$side" "$case"
      done
    done
    step "ab: this tree against the base ($OUT/ab.md)" 60 "$PY" tools/ab_table.py "$RESULTS" \
      --markdown "$OUT/ab.md"
  fi
elif wants ab; then
  log "ab: needs 2 GPUs; skipped"
fi

torch_user_run() {  # torch_user_run N: `ipcshare vs-torch` at N ranks, one GPU each
  "$MPIEXEC" -n "$1" --bind-to none "$PY" -m ipcshare vs-torch \
    -b "${TORCH_USER_MIN:-8K}" -e "${TORCH_USER_MAX:-256M}" -f "${TORCH_USER_FACTOR:-2}" \
    --markdown "$OUT/torch-user-n$1.md" --json "$OUT/torch-user-n$1.json"
}
export -f torch_user_run
if [[ $G -ge 2 ]] && wants torch-user; then
  # What a PyTorch user sees (issue 36): ours against NCCL through torch.distributed on
  # the same bf16 tensors, in one CUDA graph of 20 calls, eager and by host time per
  # call, at 2 and G ranks; every row passes its checks (exit 3 otherwise: wrong
  # elements; exit 5: a timer the host clock contradicts, a busbw above the links' ceiling).
  for n in $(printf '%s\n' 2 "$G" | sort -nu); do
    step "torch-user table n=$n" "${STEP_TIMEOUT_TORCH_USER:-300}" torch_user_run "$n"
  done
elif wants torch-user; then
  log "torch-user: needs 2 GPUs; skipped"
fi

p2p_runs() {  # the P2P-direct mode against IPC, and host-staged copies (docs/P2P.md)
  "$PY" -m pytest -q -s -rs -p no:cacheprovider tests/gpu/test_p2p_direct.py || return 1
  "$PY" -m ipcshare p2p -b 8 -e "${P2P_MAX:-256M}" -f 4 --json "$OUT/p2p.json" || return 1
  "$PY" -m ipcshare p2p --peer-access off --mode copy --no-ipc -b 64M -e 256M -f 4 \
    --json "$OUT/p2p-staged.json"
}
doctor_bound() {  # doctor_bound N: doctor, every rank bound by launch/bind-gpu.sh (CPU, NUMA)
  "$MPIEXEC" -n "$1" --bind-to none launch/bind-gpu.sh "$PY" -m ipcshare doctor --quick \
    --json "$OUT/doctor-bound.json"
}
export -f p2p_runs doctor_bound
if [[ $G -ge 2 ]] && wants p2p; then
  step "p2p direct vs IPC, host-staged copies" 300 p2p_runs
  step "doctor --quick under bind-gpu.sh" 180 doctor_bound "$G"
elif wants p2p; then
  log "p2p: needs 2 GPUs; skipped"
fi

namespaces_tests() {  # the PID-namespace tests, host and GPU backends, under the node's MPI
  # Open MPI 4.1's shared-memory transport crashes (SIGSEGV in MPI_Comm_split_type) when
  # ranks are in different PID namespaces: its messages go over loopback TCP here, and
  # the case with a network namespace per rank (which TCP cannot cross) is left out.
  OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=lo "$PY" -m pytest -q -s -rs \
    -p no:cacheprovider tests/cli/test_pid_namespaces_cli.py -k "not network"
}
export -f namespaces_tests
if wants namespaces; then
  step "ranks in separate PID namespaces (host, cuda-vmm, cuda-ipc)" 300 namespaces_tests
fi

shared_run() {  # shared_run N LABEL [ENV=VALUE...] -- OP [ARGS...]: a 1 MiB sweep (ARGS
  local n=$1 label=$2 json rc op                # may name other sizes)
  shift 2
  local envs=()
  while [[ $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  op=$1
  shift
  json="$OUT/shared-$label-n$n.json"
  local forward=(-x IPCSHARE_SHARED_GPU_BARRIER)
  [[ -n ${CUDA_MPS_PIPE_DIRECTORY:-} ]] && forward+=(-x CUDA_MPS_PIPE_DIRECTORY -x CUDA_MPS_LOG_DIRECTORY)
  env "${envs[@]}" "$MPIEXEC" -n "$n" --bind-to none "${forward[@]}" \
    "$PY" -m ipcshare "$op" -b 1M -e 1M -n 50 -w 5 -c 1 --json "$json" "$@" | grep -Ev "^#  Rank"
  rc=${PIPESTATUS[0]}
  append_result "$json" shared_case "$label"
  return $rc
}
shared_cases() {  # shared_cases SUFFIX: every case at G, G+1 and 2G ranks (SUFFIX: -mps)
  local n s=$1 algo graph sweep=(-b 8K -e 4M -f 8)
  for n in $(printf '%s\n' "$G" $((G + 1)) $((2 * G)) | sort -nu); do
    [[ $n -lt 2 ]] && continue
    [[ ${SHARED_QUICK:-0} == 1 ]] || step "shared$s tests n=$n" "$STEP_TIMEOUT_TESTS" shared_tests "$n"
    # torch's expandable segments: the guests' tensors are cuMem memory, handed to the
    # leader by descriptor (pidfd_getfd) instead of a legacy IPC handle.
    [[ -z $s && ${SHARED_QUICK:-0} != 1 ]] && step "shared tests, expandable segments, n=$n" "$STEP_TIMEOUT_TESTS" \
      shared_tests "$n" PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
      -k "handed_to_its_leader or leader_of_a_time_sliced"
    step "shared$s allgather auto n=$n" 120 shared_run "$n" "auto$s" -- allgather --algo auto
    step "shared$s allgather auto graph n=$n" 120 shared_run "$n" "auto-graph$s" -- allgather --algo auto --graph
    step "shared$s ring n=$n" 120 shared_run "$n" "ring$s" -- ring
    # SHARED_QUICK=1: only these 1 MiB cases at G and G + 1 ranks (the issue's target).
    if [[ ${SHARED_QUICK:-0} == 1 ]]; then
      [[ $n -gt $G ]] && break
      continue
    fi
    # The communicator: auto (stepped kernels where GPUs are shared) against kernels that
    # spin on their peers.
    for graph in "" --graph; do
      for algo in auto one-shot; do
        step "shared$s allreduce $algo $graph n=$n" 180 shared_run "$n" "allreduce-$algo${graph:+-graph}$s" \
          -- allreduce --algo $algo "${sweep[@]}" $graph
      done
      for algo in stepped pull; do
        step "shared$s allgather $algo $graph n=$n" 180 shared_run "$n" "allgather-$algo${graph:+-graph}$s" \
          -- allgather --algo $algo "${sweep[@]}" $graph
      done
      step "shared$s reducescatter auto $graph n=$n" 180 shared_run "$n" "reducescatter-auto${graph:+-graph}$s" \
        -- reducescatter --algo auto "${sweep[@]}" $graph
      # Registered arrays: on a time-sliced GPU the leader reaches its guests' in place.
      step "shared$s allreduce auto -R 1 $graph n=$n" 180 shared_run "$n" "allreduce-auto-R1${graph:+-graph}$s" \
        -- allreduce --algo auto -R 1 "${sweep[@]}" $graph
    done
    [[ $n -eq $G ]] && continue
    # The communicator's calls by where their arrays lie (heap, registered, plain
    # tensors): on a time-sliced GPU the leader runs its guests' calls.
    step "shared$s placement probe n=$n" 180 placement_probe "$n"
    for barrier in host stream; do
      step "shared$s allgather copy-engine, $barrier barriers, n=$n" 120 shared_run "$n" \
        "ce-$barrier$s" IPCSHARE_SHARED_GPU_BARRIER=$barrier -- allgather --algo copy-engine
    done
    step "shared$s allgather push n=$n" 120 shared_run "$n" "push$s" -- allgather --algo push
    step "shared$s allgather leader n=$n" 120 shared_run "$n" "leader$s" -- allgather --algo leader
  done
}
shared_tests() {  # shared_tests N [VAR=VALUE] [PYTEST ARGS]: the shared-GPU tests at N ranks
  local n=$1 forward=() envs=()
  shift
  [[ -n ${CUDA_MPS_PIPE_DIRECTORY:-} ]] && forward+=(-x CUDA_MPS_PIPE_DIRECTORY -x CUDA_MPS_LOG_DIRECTORY)
  while [[ ${1:-} == *=* ]]; do envs+=("$1"); forward+=(-x "${1%%=*}"); shift; done
  env "${envs[@]}" "$MPIEXEC" -n "$n" --bind-to none "${forward[@]}" "$PY" -m pytest -q -rs \
    --with-mpi -m gpu -p no:cacheprovider tests/gpu/test_shared_gpu.py "$@"
}
placement_probe() {  # placement_probe N: tools/placement_probe.py at N ranks
  local forward=()
  [[ -n ${CUDA_MPS_PIPE_DIRECTORY:-} ]] && forward+=(-x CUDA_MPS_PIPE_DIRECTORY -x CUDA_MPS_LOG_DIRECTORY)
  "$MPIEXEC" -n "$1" --bind-to none "${forward[@]}" "$PY" tools/placement_probe.py
}
timeslice_probes() {  # what a hand-over of GPU 0 costs, by the work of the other contexts
  local n
  for n in 2 3; do
    CUDA_VISIBLE_DEVICES=0 "$MPIEXEC" -n "$n" --bind-to none -x CUDA_VISIBLE_DEVICES \
      "$PY" tools/timeslice_probe.py --rounds 500 || return 1
  done
}
mps_collective_tests() {  # mps_collective_tests N: the collectives' and Triton's GPU tests at N ranks
  "$MPIEXEC" -n "$1" --bind-to none -x CUDA_MPS_PIPE_DIRECTORY -x CUDA_MPS_LOG_DIRECTORY \
    "$PY" -m pytest -q -rs --with-mpi -m gpu -p no:cacheprovider \
    tests/gpu/test_gpu_communicator.py tests/gpu/test_gpu_low_latency.py \
    tests/gpu/test_triton_primitives.py
}
export -f shared_run shared_tests mps_collective_tests placement_probe timeslice_probes
if wants shared; then
  export IPCSHARE_SHARED_GPU_BARRIER=host
  [[ ${SHARED_QUICK:-0} == 1 ]] || step "time-slice probe, 2 and 3 ranks on GPU 0" 120 timeslice_probes
  shared_cases ""
  # MPS runs the contexts of one GPU side by side: start a daemon of our own (pipe and log
  # directories under /tmp), measure, and stop it again.
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/ipcshare-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/ipcshare-mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if [[ ${SHARED_MPS:-1} == 0 ]]; then
    log "shared: MPS cases skipped (SHARED_MPS=0)"
  elif command -v nvidia-cuda-mps-control >/dev/null && nvidia-cuda-mps-control -d; then
    log "MPS daemon started"
    shared_cases -mps
    # Under MPS the ranks on one GPU run side by side, so more ranks than GPUs exercise
    # the collectives' and Triton's 3- and 4-rank code on any node (correctness only, not
    # speed). SHARED_MPS_TESTS=1 runs them in a quick run too.
    for n in 3 4; do
      [[ $n -le $G ]] && continue
      [[ ${SHARED_QUICK:-0} == 1 && ${SHARED_MPS_TESTS:-0} != 1 ]] && continue
      step "shared-mps communicator, LL and Triton tests n=$n" "$STEP_TIMEOUT_TESTS" mps_collective_tests "$n"
    done
    echo quit | nvidia-cuda-mps-control
    sleep 2
    log "MPS daemon stopped"
  else
    log "MPS could not be started here; shared-GPU figures without MPS only"
  fi
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  # The issue's target in one table: 1 MiB all-gather (auto) and ring with G + 1 ranks on G
  # GPUs against G ranks, eager and in graphs, without and with MPS (target: <= 3x).
  step "shared: G + 1 against G ranks" 30 "$PY" - "$RESULTS" "$G" <<'PYEOF'
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
PYEOF
fi

# nccl-tests: the NCCL reference measured by NVIDIA's own harness, built here with the
# node's nvcc against the NCCL wheel (below). The wheel's NCCL has no libnccl.so link, which the Makefile wants. The
# build and that link live in a folder this run makes (mktemp), never one found by name.
nccl_tests_build() {  # nccl_tests_build PROGRAM...: those programs of nccl-tests
  local wheel nvcc_path program targets=()
  wheel=$("$PY" -c 'import nvidia.nccl as n; print(list(n.__path__)[0])') || return 1
  nvcc_path=$(command -v nvcc) || { echo "nvcc: not found"; return 1; }
  mkdir -p "$NCCL_TESTS_HOME/lib"
  # -f / -n: a second build of this run finds the links of the first.
  ln -sfn "$wheel/include" "$NCCL_TESTS_HOME/include"
  ln -sf "$wheel"/lib/libnccl.so.* "$NCCL_TESTS_HOME/lib/"
  ln -sf "$(cd "$wheel/lib" && ls libnccl.so.* | head -1)" "$NCCL_TESTS_HOME/lib/libnccl.so"
  for program in "$@"; do targets+=("$NCCL_TESTS_BUILD/$program"); done
  make -C .nccl-tests/src -j 8 MPI=0 NCCL_HOME="$NCCL_TESTS_HOME" \
    CUDA_HOME="$(dirname "$(dirname "$nvcc_path")")" \
    NVCC_GENCODE=-gencode=arch=compute_90,code=sm_90 BUILDDIR="$NCCL_TESTS_BUILD" "${targets[@]}"
}
# nccl_tests_run PROGRAM REGISTER [FLAGS...]: one run on NCCL_TESTS_RANKS threads (default
# G), one GPU each, appended to its log
nccl_tests_run() {
  local program=$1 register=$2 ranks=${NCCL_TESTS_RANKS:-$G} log
  shift 2
  log="$OUT/nccl-tests/$program.log"
  echo "+ $program -b 8 -e ${NCCL_TESTS_MAX:-256M} -f 4 -g 1 -t $ranks -R $register $*" >>"$log"
  LD_LIBRARY_PATH="$NCCL_TESTS_HOME/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    "$NCCL_TESTS_BUILD/$program" -b 8 -e "${NCCL_TESTS_MAX:-256M}" -f 4 -g 1 -t "$ranks" \
    -R "$register" "$@" | tee -a "$log"
  return "${PIPESTATUS[0]}"
}
# nccl_tests_alltoall: alltoall_perf on plain buffers and on symmetric windows of a
# zero-CTA communicator (-x 2; without it -R 2 runs -R 0's send / recv path), eager and in
# graphs
nccl_tests_alltoall() {
  local flags
  for flags in "0" "2 -x 2"; do
    # shellcheck disable=SC2086  # the flags are words
    step "nccl-tests alltoall_perf -t ${NCCL_TESTS_RANKS:-$G} -R $flags eager" 300 \
      nccl_tests_run alltoall_perf $flags
    # shellcheck disable=SC2086
    step "nccl-tests alltoall_perf -t ${NCCL_TESTS_RANKS:-$G} -R $flags graph" 300 \
      nccl_tests_run alltoall_perf $flags -G 20
  done
}
# nccl_tests_setup: whether .nccl-tests/ is here; if so a build folder of this run's own
# (mktemp; nccl_tests_cleanup removes it)
nccl_tests_setup() {
  if [[ ! -d .nccl-tests/src ]]; then
    log "nccl-tests: .nccl-tests/src missing (carry the ignored .nccl-tests/ folder along)"
    failures=$((failures + 1))
    return 1
  fi
  mkdir -p "$OUT/nccl-tests"
  NCCL_TESTS_ROOT=$(mktemp -d "${TMPDIR:-/tmp}/ipcshare-nccl-tests.XXXXXX")
  NCCL_TESTS_HOME=$NCCL_TESTS_ROOT/nccl NCCL_TESTS_BUILD=$NCCL_TESTS_ROOT/build
  export NCCL_TESTS_HOME NCCL_TESTS_BUILD
}
nccl_tests_cleanup() { rm -rf "$NCCL_TESTS_ROOT"; }  # made by nccl_tests_setup's mktemp
export -f nccl_tests_build nccl_tests_run
export G
if [[ $G -ge 2 ]] && wants nccl-tests && nccl_tests_setup; then
  for program in all_gather_perf all_reduce_perf reduce_scatter_perf alltoall_perf; do
    : >"$OUT/nccl-tests/$program.log"  # this run's logs start empty (runs append to them)
  done
  step "nccl-tests build (nvcc, the wheel's NCCL, sm_90)" 600 nccl_tests_build \
    all_gather_perf all_reduce_perf reduce_scatter_perf
  for program in all_gather_perf all_reduce_perf reduce_scatter_perf; do
    for register in 0 2; do
      step "nccl-tests $program -t $G -R $register eager" 300 nccl_tests_run "$program" "$register"
      step "nccl-tests $program -t $G -R $register graph" 300 nccl_tests_run "$program" "$register" -G 20
    done
  done
  # Apart: a failure to build it (nccl-tests newer than the wheel's NCCL) costs it alone.
  step "nccl-tests build alltoall_perf" 600 nccl_tests_build alltoall_perf
  nccl_tests_alltoall
  step "nccl-tests table" 60 bash -c '"$0" -m ipcshare.bench.nccl_tests "$1"/nccl-tests/*_perf.log > "$1/nccl-tests/nccl-tests.md"; rc=$?; cat "$1/nccl-tests/nccl-tests.md"; exit $rc' "$PY" "$OUT"
  nccl_tests_cleanup
elif wants nccl-tests && [[ $G -lt 2 ]]; then
  log "nccl-tests: needs 2 GPUs; skipped"
fi

# alltoall_case N SPLITS BASELINE [--graph]: one `ipcshare alltoall` sweep, into $RESULTS
# (--algo $ALGO, default auto; the file and tag name the algorithm unless it is auto)
alltoall_case() {
  local n=$1 splits=$2 baseline=$3 algo=${ALGO:-auto} json rc tag
  shift 3
  local -a register=()
  tag=${algo/#auto/}
  [[ ${ALLTOALL_REGISTER:-0} == 1 ]] && register=(-R 1)
  json="$OUT/alltoall-n$n-$splits-$baseline${tag:+-$tag}${register:+-registered}${1:+-graph}.json"
  "$MPIEXEC" -n "$n" --bind-to none "$PY" -m ipcshare alltoall --backend cuda-vmm \
    --algo "$algo" \
    --splits "$splits" -b "${ALLTOALL_MIN:-8}" -e "${ALLTOALL_MAX:-256M}" -f 4 \
    -n "${ALLTOALL_ITERS:-20}" -w 5 \
    -c 1 --baseline "$baseline" --json "$json" ${register[@]+"${register[@]}"} "$@" \
    | grep -Ev "^#  Rank"
  rc=${PIPESTATUS[0]}
  append_result "$json" alltoall_case \
    "n$n $splits $baseline${tag:+ $tag}${register:+ registered}${1:+ graph}"
  return $rc
}
# alltoall_tests N FILE: one GPU test file of the all-to-all baselines, a pytest of its own
alltoall_tests() {
  "$MPIEXEC" -n "$1" --bind-to none "$PY" -m pytest -q -rs --with-mpi -m gpu \
    -p no:cacheprovider "$2"
}
export -f alltoall_case alltoall_tests
if [[ $G -ge 2 ]] && wants alltoall; then
  STEP_TIMEOUT_ALLTOALL=${STEP_TIMEOUT_ALLTOALL:-150}
  if [[ ${ALLTOALL_TESTS:-0} != 0 ]]; then
    # The torch-symm file alone: symmetric memory's backend is set once per process.
    for file in tests/gpu/test_gpu_alltoall_baselines.py tests/gpu/test_torch_symm_alltoall_baseline.py; do
      step "alltoall baselines' tests n=2 $(basename "$file")" "$STEP_TIMEOUT_TESTS" \
        alltoall_tests 2 "$file"
    done
  fi
  alltoall_ranks=()
  for n in ${ALLTOALL_RANKS:-2 4}; do
    (( n <= G )) && alltoall_ranks+=("$n")
  done
  # torch-symm where this torch has all_to_all_vdev and NVSHMEM (the baseline's own check;
  # its reason in the log otherwise, not a failure).
  if symm_missing=$("$PY" -c 'import torch
from ipcshare.baselines.torch_symm_alltoall import all_to_all_vdev_module
all_to_all_vdev_module(torch)' 2>&1); then
    symm_missing=""
  else
    log "alltoall: no torch-symm baseline here: $(tail -1 <<<"$symm_missing")"
  fi
  for n in "${alltoall_ranks[@]}"; do
    for splits in ${ALLTOALL_SPLITS:-even random skewed}; do
      for baseline in ${ALLTOALL_BASELINES:-nccl torch torch-symm}; do
        # torch-symm's all_to_all_vdev refuses sizes whose uneven splits its kernel
        # cannot cut (the run would end there): even splits only, unless asked.
        if [[ $baseline == torch-symm && ( -n $symm_missing ||
              " ${ALLTOALL_SYMM_SPLITS:-even} " != *" $splits "* ) ]]; then
          continue
        fi
        for algo in ${ALLTOALL_ALGOS:-auto}; do
          step "alltoall n=$n --splits $splits --algo $algo vs $baseline eager" \
            "$STEP_TIMEOUT_ALLTOALL" env ALGO="$algo" bash -c \
            'alltoall_case "$@"' _ "$n" "$splits" "$baseline"
          if [[ ${ALLTOALL_GRAPH:-1} != 0 ]]; then
            step "alltoall n=$n --splits $splits --algo $algo vs $baseline graph" \
              "$STEP_TIMEOUT_ALLTOALL" env ALGO="$algo" bash -c \
              'alltoall_case "$@"' _ "$n" "$splits" "$baseline" --graph
          fi
        done
      done
    done
  done
  # NCCL's own harness beside them, at the same rank counts (ALLTOALL_NCCL_TESTS=0: not).
  alltoall_logs=()
  if [[ ${ALLTOALL_NCCL_TESTS:-1} == 0 ]]; then
    log "alltoall: nccl-tests' alltoall_perf not run (ALLTOALL_NCCL_TESTS=0)"
  elif nccl_tests_setup; then
    : >"$OUT/nccl-tests/alltoall_perf.log"
    step "nccl-tests build alltoall_perf" 600 nccl_tests_build alltoall_perf
    if [[ -x $NCCL_TESTS_BUILD/alltoall_perf ]]; then
      for n in "${alltoall_ranks[@]}"; do
        NCCL_TESTS_RANKS=$n nccl_tests_alltoall
      done
      alltoall_logs=("$OUT/nccl-tests/alltoall_perf.log")
    fi
    nccl_tests_cleanup
  fi
  step "alltoall summary ($OUT/alltoall.md)" 60 "$PY" tools/alltoall_summary.py "$RESULTS" \
    --nccl-tests ${alltoall_logs[@]+"${alltoall_logs[@]}"} --out "$OUT/alltoall.md"
elif wants alltoall; then
  log "alltoall: needs 2 GPUs (NCCL runs one rank per GPU); skipped"
fi

inter_tests() {  # inter_tests N: the GPU tests of the engines between nodes, 2 virtual nodes
  IPCSHARE_VIRTUAL_NODES=2 "$MPIEXEC" -n "$1" --bind-to none -x IPCSHARE_VIRTUAL_NODES \
    "$PY" -m pytest -q -rs --with-mpi -m gpu -p no:cacheprovider \
    tests/gpu/test_inter_gpu.py tests/gpu/test_multinode_gpu.py
}
inter_bench() {  # inter_bench N OP ENGINE: one sweep on 2 virtual nodes against flat NCCL
  local n=$1 op=$2 engine=$3 json rc
  json="$OUT/inter-$op-$engine-n$n.json"
  IPCSHARE_VIRTUAL_NODES=2 "$MPIEXEC" -n "$n" --bind-to none -x IPCSHARE_VIRTUAL_NODES \
    "$PY" -m ipcshare "$op" --backend cuda-vmm --inter "$engine" -b "${INTER_MIN:-1M}" \
    -e "${INTER_MAX:-256M}" -f 4 -n "$BENCH_ITERS" -w 5 -c 1 --baseline nccl \
    --json "$json" | grep -Ev "^#  Rank"
  rc=${PIPESTATUS[0]}
  append_result "$json" inter_case "$op-$engine-2x$((n / 2))"
  return $rc
}
export -f inter_tests inter_bench
if [[ $G -ge 2 ]] && wants inter; then
  n=$(( G >= 4 ? 4 : 2 ))  # 2 virtual nodes of 1 GPU each on 2 GPUs, of 2 each on 4
  step "inter tests n=$n as 2 virtual nodes" "$STEP_TIMEOUT_TESTS" inter_tests "$n"
  for op in allgather allreduce reducescatter; do
    for engine in nccl mpi; do
      step "inter $op --inter $engine n=$n as 2 virtual nodes" \
        "${STEP_TIMEOUT_INTER:-300}" inter_bench "$n" "$op" "$engine"
    done
  done
elif wants inter; then
  # One GPU: 2 x 2 virtual nodes whose ranks share it. The engine between nodes is MPI
  # (NCCL needs a GPU per rank of a rail); the timings say nothing, the checks do.
  log "inter: one GPU: the GPU tests at 2 x 2 virtual nodes on it, MPI between nodes; NCCL and the sweeps need 2 GPUs"
  step "inter tests n=4 as 2 virtual nodes on one GPU" "$STEP_TIMEOUT_TESTS" inter_tests 4
fi

# Every collective sweep of this run (collectives, latency phases) side by side per size,
# NCCL's best beside them, and auto's proposed rows (tools/auto_rows.py).
if grep -q '"collective_case"' "$RESULTS" 2>/dev/null; then
  step "auto rows from the sweeps" 60 bash -c '"$0" tools/auto_rows.py "$1/results.jsonl" --out "$1/auto-rows.md"' "$PY" "$OUT"
fi

log ""
log "===== summary ($phase, $(( $(date +%s) - started ))s, $failures failed)"
tee -a "$LOG" <"$SUMMARY"
[[ $failures -eq 0 ]]
