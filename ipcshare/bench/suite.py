"""The bench suite file: a matrix of ops x backends x algorithms x timing modes over one
size sweep (or a list of such matrices), validated in one place into frozen cases.

```yaml
name: host vs MPI          # optional title (default: the file's name)
ops: [allgather, ring]     # also allreduce, reducescatter, alltoall (the collectives layer's), p2p
reductions: [sum]          # -o of allreduce / reducescatter: sum | max | min (a case each)
arrays: [copied]           # allreduce / reducescatter: copied (by the library) | registered
                           # (with the communicator, read in place: -R 1); a case each
splits: [even]             # alltoall: even (all_to_all) | random | skewed (all_to_all_v on
                           # seeded splits, ipcshare alltoall --splits); a case each
p2p_ops: [ring, allgather] # the patterns of the p2p op (a case each; default both)
p2p_peer_access: [enabled] # disabled too: the direct half without peer access, so its
                           # copies go host-staged (a case each; default enabled)
backends: [host]           # auto | host | cuda-ipc | cuda-vmm
algorithms: [auto]         # per op and backend: ALGORITHMS; the others are left out
timing: [nccl-tests, latency]  # and graph: nccl-tests timing of a CUDA graph (GPU);
                               # after-kernel: nccl-tests timing, an empty kernel before each (GPU)
baselines: [mpi, nccl]     # also torch, torch-symm; skipped, with a note, where they cannot run
datatype: float32          # allreduce / reducescatter: float32 | float16 | bfloat16 | int32
min_bytes: 1K
max_bytes: 16M
step_factor: 4
iters: 20
warmup: 3
checks: 1
repeat: 1                  # repetitions of the whole suite
rotate_buffers: 4          # buffer sets cycled through at sizes up to 1 MiB per rank
cases:                     # optional: several matrices, each overriding the keys above
  - {timing: [latency], max_bytes: 1M, iters: 200}
  - {ops: [p2p], backends: [cuda-vmm], max_bytes: 256M}
```

The ``p2p`` op sets P2P direct against IPC on the same sizes (docs/P2P.md, "In a bench
suite"): per pattern of ``p2p_ops``, ``ipcshare p2p --no-ipc`` over the GPUs of the job's
ranks (one process: kernels storing through peer pointers, ``p2p-kernel``, and
``cuMemcpyPeerAsync``, ``p2p-copy``) beside the pattern on the case's backend and
algorithm through IPC windows, one rank per GPU; the direct modes are the case's baselines.
It pairs with GPU backends and ``auto`` (a suite naming host alone for it is refused), times
nccl-tests style only, moves float32, and ignores ``baselines`` and ``reductions``. Where it
cannot run (no GPU, one rank, ranks on several nodes or sharing GPUs, more than 8 ranks)
the case is skipped, with the reason, in every output.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..collectives.algorithms import algorithm_names
from ..collectives.reduction import REDUCE_DTYPES
from ..collectives.scratch import LL128_MAX_BYTES, LL_MAX_BYTES
from ..patterns.timing import TIMING_MODES
from ..runtime.config import (
    REDUCTIONS,
    SPLITS,
    PatternOptions,
    format_size,
    load_yaml_config,
    merge_options,
)
from ..runtime.errors import ConfigError

__all__ = ["BenchCase", "Suite", "load_suite", "parse_suite", "ALGORITHMS", "BASELINE_NAMES",
           "BACKEND_CHOICES", "DEFAULT_ROTATE_BUFFERS", "SUITE_TIMINGS", "BENCH_OPS",
           "REDUCTION_OPS", "P2P_OP", "P2P_OPS", "GRAPH_OPS", "OP_TITLES", "OP_SIZES",
           "ALL_TO_ALL_OP",
           "algorithms_of"]

BACKEND_CHOICES = ("auto", "host", "cuda-ipc", "cuda-vmm")
# nccl: NCCL through nccl4py; torch: NCCL through torch.distributed; torch-symm: PyTorch
# symmetric memory (all-reduce only: skipped, with the reason, by the suites' ops).
BASELINE_NAMES = ("mpi", "nccl", "torch", "torch-symm")
_GPU = ("cuda-ipc", "cuda-vmm")
# The algorithms of the low-latency protocol and the inputs their buffers take at most.
_LOW_LATENCY = {"ll": LL_MAX_BYTES, "ll-two-shot": LL_MAX_BYTES, "ll128": LL128_MAX_BYTES,
                "ll128-two-shot": LL128_MAX_BYTES}
# The ops of the collectives layer: each case names its reduction (-o) and datatype.
REDUCTION_OPS = ("allreduce", "reducescatter")
# P2P direct (one process over every rank's GPU) against IPC windows, per pattern of
# P2P_OPS: the patterns ``ipcshare p2p`` runs (p2p.direct.OPS; a test holds them equal).
P2P_OP = "p2p"
P2P_OPS = ("ring", "allgather")
# What P2P direct moves and checks (p2p.direct.ELEMENT_SIZE): the runs' default datatype.
P2P_DATATYPE = PatternOptions.datatype
# The ops a suite runs.
# All-to-all (ipcshare alltoall): each case names its splits and datatype.
ALL_TO_ALL_OP = "alltoall"
BENCH_OPS = ("ring", "allgather", *REDUCTION_OPS, ALL_TO_ALL_OP, P2P_OP)
# How outputs name each op, and what its table's size counts (nccl-tests' conventions).
OP_TITLES = {"ring": "ring", "allgather": "all-gather", "allreduce": "all-reduce",
             "reducescatter": "reduce-scatter", "alltoall": "all-to-all"}
OP_SIZES = {"ring": "bytes each rank sends per step", "allgather": "total gathered bytes",
            "allreduce": "bytes of each rank's array",
            "reducescatter": "bytes of each rank's input",
            "alltoall": "bytes of each rank's input"}
# The ops whose GPU operations can be captured in CUDA graphs (the ring's signals carry
# host-chosen values).
GRAPH_OPS = ("allgather", *REDUCTION_OPS, ALL_TO_ALL_OP)
# The library's name of each reduction op, whose algorithms it lists per memory.
_COLLECTIVES = {"allreduce": "all_reduce", "reducescatter": "reduce_scatter",
                "alltoall": "all_to_all"}


def _algorithm_table() -> dict[str, dict[str, tuple[str, ...]]]:
    """algorithm -> op -> the backends that run it. All-gather and ring run the driver's
    patterns (single-copy is the host's engine copy; push / pull / ring are the
    all-gather kernels; ll the collectives layer's low-latency all-gather); all-reduce and
    reduce-scatter run what the collectives layer registers for host or GPU memory. On
    host memory ``auto`` of all-gather and ring is single-copy; elsewhere it stays
    ``auto``, the measured choice per size."""
    table: dict[str, dict[str, list[str]]] = {
        "single-copy": {"allgather": ["host"], "ring": ["host"]},
        "auto": {"allgather": [*_GPU], "ring": [*_GPU]},
        "copy-engine": {"allgather": [*_GPU], "ring": [*_GPU]},
        "push": {"allgather": [*_GPU]}, "pull": {"allgather": [*_GPU]},
        "ring": {"allgather": [*_GPU]}, "ll": {"allgather": [*_GPU]},
        "ll128": {"allgather": [*_GPU]},
    }
    for op, collective in _COLLECTIVES.items():
        for backend in ("host", *_GPU):
            memory = "host" if backend == "host" else "cuda"
            for name in ("auto", *algorithm_names(memory, collective)):
                table.setdefault(name, {}).setdefault(op, []).append(backend)
    return {name: {op: tuple(backends) for op, backends in ops.items()}
            for name, ops in table.items()}


ALGORITHMS = _algorithm_table()


def algorithms_of(op: str, backend: str) -> tuple[str, ...]:
    """The algorithms that run ``op`` on ``backend``, in ALGORITHMS' order."""
    return tuple(name for name, ops in ALGORITHMS.items() if backend in ops.get(op, ()))


# Timing modes of a suite: the driver's two, "graph" (nccl-tests timing of operations
# captured in a CUDA graph) and "after-kernel" (nccl-tests timing with an empty kernel on
# the stream before every operation, ours and NCCL's). Latency cases of GPU all-gathers
# replay graphs, too.
SUITE_TIMINGS = (*TIMING_MODES, "graph", "after-kernel")
DEFAULT_ROTATE_BUFFERS = 4
_MAX_ROTATE_BUFFERS = 64

# List-valued keys of a matrix: allowed names and the default.
_LIST_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "ops": (BENCH_OPS, ("allgather",)),
    "reductions": (REDUCTIONS, ("sum",)),
    "arrays": (("copied", "registered"), ("copied",)),
    "splits": (SPLITS, ("even",)),
    "p2p_ops": (P2P_OPS, P2P_OPS),
    # Not on / off: YAML reads those as booleans.
    "p2p_peer_access": (("enabled", "disabled"), ("enabled",)),
    "backends": (BACKEND_CHOICES, ("auto",)),
    "algorithms": (tuple(ALGORITHMS), ("auto",)),
    "timing": (SUITE_TIMINGS, ("nccl-tests",)),
    "baselines": (("none", *BASELINE_NAMES), ("mpi",)),
}
_SWEEP_KEYS = ("min_bytes", "max_bytes", "step_factor", "iters", "warmup", "checks", "datatype")
_MATRIX_KEYS = (*_LIST_KEYS, *_SWEEP_KEYS)
_SUITE_KEYS = ("name", "exchange", "handle", "repeat", "rotate_buffers", "min_bw", "cases",
               *_MATRIX_KEYS)


@dataclasses.dataclass(frozen=True)
class BenchCase:
    """One line of the suite: an op on a backend with an algorithm and a timing mode,
    swept over ``options``' sizes, with the baselines to time beside it."""

    op: str
    backend: str          # resolved: host, cuda-ipc or cuda-vmm
    algorithm: str        # resolved: one of algorithms_of(pattern_op, backend)
    timing: str           # nccl-tests, latency, graph or after-kernel
    baselines: tuple[str, ...]
    options: PatternOptions   # all-reduce / reduce-scatter: options.op is the reduction
    # The p2p op's pattern (one of P2P_OPS); None for every other op.
    p2p_op: str | None = None
    # The p2p op's direct half with peer access enabled (False: left off on purpose, so
    # its peer copies are staged through host memory and its kernel mode cannot run).
    p2p_peer_access: bool = True

    @property
    def reduction(self) -> str | None:
        """The reduction (sum, max, min) of an all-reduce or reduce-scatter, else None."""
        return self.options.op if self.op in REDUCTION_OPS else None

    @property
    def pattern_op(self) -> str:
        """The op whose sizes, layout and bandwidth formula the rows follow (the p2p
        case's pattern, else the op itself): the table and plot panel it goes in."""
        return self.p2p_op or self.op

    @property
    def what(self) -> str:
        """What is measured: ``'allgather'``, ``'allreduce sum float32'`` (reductions name
        their reduction and datatype), ``'alltoall random float32'`` (splits and
        datatype), ``'p2p ring'``."""
        if self.p2p_op is not None:
            return f"{self.op} {self.p2p_op}" + ("" if self.p2p_peer_access else " host-staged")
        if self.reduction is not None:
            return (f"{self.op} {self.reduction} {self.options.datatype}"
                    + (" registered" if self.options.register else ""))
        if self.op == ALL_TO_ALL_OP:
            return f"{self.op} {self.options.splits} {self.options.datatype}"
        return self.op

    @property
    def label(self) -> str:
        """``'allgather host single-copy latency'``, ``'allreduce sum float32 host auto
        nccl-tests'``, ``'p2p ring cuda-vmm auto nccl-tests'``."""
        return f"{self.what} {self.backend} {self.algorithm} {self.timing}"


@dataclasses.dataclass(frozen=True)
class Suite:
    """A validated suite: its cases and what applies to all of them."""

    name: str
    source: str
    cases: tuple[BenchCase, ...]
    exchange: str = "auto"
    handle: str = "posix-fd"
    repeat: int = 1
    rotate_buffers: int = DEFAULT_ROTATE_BUFFERS
    min_bw: float | None = None

    @property
    def backends(self) -> tuple[str, ...]:
        """The backends of the cases, in order of first appearance."""
        return tuple(dict.fromkeys(case.backend for case in self.cases))


def _resolve_backend(name: str) -> str:
    from ..window import resolve_backend_name

    return resolve_backend_name(name)


def load_suite(path: str | Path, *, overrides: Mapping[str, Any] | None = None,
               resolve_backend: Callable[[str], str] = _resolve_backend) -> Suite:
    """Read and validate a suite YAML file.

    ``overrides`` (``repeat``, ``min_bw``, ``baselines``; None means not given) win over
    the file, for every case. ``resolve_backend`` turns ``auto`` into a backend name.

    Raises:
        ConfigError: missing or unreadable file, bad YAML, or any invalid value.
    """
    data = load_yaml_config(path)
    if not data:
        raise ConfigError(f"suite file {str(path)!r} is empty: give at least ops and backends")
    return parse_suite(data, source=str(path), overrides=overrides,
                       resolve_backend=resolve_backend)


def parse_suite(data: Any, *, source: str = "suite", overrides: Mapping[str, Any] | None = None,
                resolve_backend: Callable[[str], str] = _resolve_backend) -> Suite:
    """Validate a suite mapping (as loaded from YAML) into a :class:`Suite`.

    This is the one place where suite dicts become typed cases; it raises nothing but
    ConfigError, whatever ``data`` holds.

    Raises:
        ConfigError: not a mapping, unknown key, unknown op / backend / algorithm /
            timing mode / baseline, a value of the wrong type, max_bytes < min_bytes.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: a suite is a mapping of key: value, "
                          f"got a {type(data).__name__}")
    _check_keys(data, _SUITE_KEYS, source)
    given = {key: value for key, value in (overrides or {}).items() if value is not None}
    _check_keys(given, ("repeat", "min_bw", "baselines"), "overrides")
    settings = {**data, **{k: v for k, v in given.items() if k != "baselines"}}

    name = settings.get("name", Path(source).stem)
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{source}: name: expected a non-empty string, got {name!r}")
    try:
        # Exchange and handle are checked where every run option is: PatternOptions.
        common = merge_options({"exchange": settings.get("exchange"),
                                "handle": settings.get("handle")})
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    repeat = _integer(settings.get("repeat", 1), "repeat", source, low=1)
    rotate = _integer(settings.get("rotate_buffers", DEFAULT_ROTATE_BUFFERS), "rotate_buffers",
                      source, low=1, high=_MAX_ROTATE_BUFFERS)
    min_bw = _min_bw(settings.get("min_bw"), source)

    top = {key: data[key] for key in _MATRIX_KEYS if key in data}
    entries = data.get("cases")
    if entries is None:
        matrices = [(source, top)]
    else:
        if not isinstance(entries, list) or not entries:
            raise ConfigError(f"{source}: cases: expected a non-empty list of mappings, "
                              f"got {entries!r}")
        matrices = []
        for index, entry in enumerate(entries):
            where = f"{source}: cases[{index}]"
            if not isinstance(entry, Mapping):
                raise ConfigError(f"{where}: expected a mapping, got {entry!r}")
            _check_keys(entry, _MATRIX_KEYS, where)
            matrices.append((where, {**top, **entry}))

    cases: dict[BenchCase, None] = {}  # ordered, without duplicates
    for where, matrix in matrices:
        if "baselines" in given:
            matrix = {**matrix, "baselines": given["baselines"]}
        for case in _expand(matrix, where, common, resolve_backend):
            cases.setdefault(case, None)
    return Suite(name=name.strip(), source=source, cases=tuple(cases),
                 exchange=common.exchange, handle=common.handle, repeat=repeat,
                 rotate_buffers=rotate, min_bw=min_bw)


def _expand(matrix: Mapping[str, Any], where: str, common: PatternOptions,
            resolve_backend: Callable[[str], str]) -> list[BenchCase]:
    lists = {key: _names(matrix.get(key), key, where) for key in _LIST_KEYS}
    sweep = _sweep_options(matrix, where, common)
    for op in lists["ops"]:
        if op in REDUCTION_OPS and sweep.datatype not in REDUCE_DTYPES:
            raise ConfigError(f"{where}: the {op} op reduces {', '.join(REDUCE_DTYPES)}, not "
                              f"datatype {sweep.datatype}: give it a case of its own with "
                              "one of those")
        if op == P2P_OP and sweep.datatype != P2P_DATATYPE:
            raise ConfigError(f"{where}: the p2p op moves {P2P_DATATYPE} (as ipcshare p2p "
                              f"does), not datatype {sweep.datatype}: give it a case of its "
                              "own without datatype")
    backends = list(dict.fromkeys(resolve_backend(name) for name in lists["backends"]))
    plain = tuple(op for op in lists["ops"] if op != P2P_OP)
    p2p_ops = lists["p2p_ops"] if P2P_OP in lists["ops"] else ()
    p2p_backends = _p2p_backends(lists["backends"], resolve_backend, where) if p2p_ops else ()
    chosen = {}
    for backend in backends:
        patterns = tuple(dict.fromkeys((*plain, *(p2p_ops if backend in p2p_backends else ()))))
        if patterns:
            chosen[backend] = _algorithms_for(backend, patterns, lists["algorithms"], where)
    cases = []
    for op in lists["ops"]:
        for reduction, p2p_op, peer_access, registered, splits in _variants(op, lists, sweep):
            for backend in p2p_backends if p2p_op else backends:
                for algorithm in chosen[backend][p2p_op or op]:
                    limit = _LOW_LATENCY.get(algorithm)
                    if limit is not None and sweep.max_bytes > limit:
                        raise ConfigError(
                            f"{where}: algorithm {algorithm!r} takes sizes up to "
                            f"{format_size(limit)} (its buffers' limit), not max_bytes "
                            f"{format_size(sweep.max_bytes)}: give {algorithm} a case of its "
                            f"own with max_bytes <= {format_size(limit)}")
                    for timing in lists["timing"]:
                        _check_timing(timing, op, backend, where)
                        options = dataclasses.replace(sweep, backend=backend, op=reduction,
                                                      register=int(registered), splits=splits)
                        # P2P direct is the p2p case's comparison: no other baseline.
                        cases.append(BenchCase(op, backend, algorithm, timing,
                                               () if p2p_op else lists["baselines"], options,
                                               p2p_op=p2p_op, p2p_peer_access=peer_access))
    return cases


def _variants(op: str, lists: Mapping[str, tuple[str, ...]],
              sweep: PatternOptions) -> list[tuple[str, str | None, bool, bool, str]]:
    """(reduction, p2p pattern, peer access, arrays registered, splits) of each case of
    ``op``: a reduction op's per reduction and array placement, the p2p op's per pattern
    of p2p_ops and per p2p_peer_access, all-to-all's per splits, one for the others."""
    even = PatternOptions.splits
    if op in REDUCTION_OPS:
        return [(reduction, None, True, arrays == "registered", even)
                for reduction in lists["reductions"] for arrays in lists["arrays"]]
    if op == P2P_OP:
        return [(sweep.op, pattern, access == "enabled", False, even)
                for pattern in lists["p2p_ops"] for access in lists["p2p_peer_access"]]
    if op == ALL_TO_ALL_OP:
        return [(sweep.op, None, True, False, splits) for splits in lists["splits"]]
    return [(sweep.op, None, True, False, even)]


def _p2p_backends(names: tuple[str, ...], resolve_backend: Callable[[str], str],
                  where: str) -> tuple[str, ...]:
    """The backends of the p2p op's IPC side: the named ones but host, resolved (``auto``
    stays in: where it finds no GPU, the runner skips the case, saying why).

    Raises:
        ConfigError: host is the only backend named.
    """
    chosen = tuple(dict.fromkeys(resolve_backend(name) for name in names if name != "host"))
    if not chosen:
        raise ConfigError(f"{where}: the p2p op sets P2P direct against IPC windows between "
                          "GPUs, and backend 'host' has no GPU memory: give the p2p case "
                          "backends [cuda-vmm], [cuda-ipc] or [auto]")
    return chosen


def _check_timing(timing: str, op: str, backend: str, where: str) -> None:
    """Raises ConfigError where ``timing`` cannot time ``op`` on ``backend``."""
    if op == P2P_OP and timing != "nccl-tests":
        raise ConfigError(f"{where}: the p2p op times P2P direct and IPC back to back, as "
                          f"nccl-tests does; it cannot time {timing!r}: give it a case of "
                          "its own with timing [nccl-tests]")
    if timing == "graph" and (backend == "host" or op not in GRAPH_OPS):
        raise ConfigError(f"{where}: timing 'graph' captures GPU {', '.join(GRAPH_OPS)} in "
                          f"CUDA graphs; it cannot time {op} on {backend}")
    if timing == "after-kernel" and backend == "host":
        raise ConfigError(f"{where}: timing 'after-kernel' launches a GPU kernel before each "
                          f"operation; it cannot time {op} on host")


def _names(value: Any, key: str, where: str) -> tuple[str, ...]:
    """A list key's names: a list of strings, or one string (commas separate names)."""
    allowed, default = _LIST_KEYS[key]
    if value is None:
        return default
    if isinstance(value, str):
        items: list[Any] = [part.strip() for part in value.split(",")]
    elif isinstance(value, list):
        items = value
    else:
        raise ConfigError(f"{where}: {key}: expected a list of names, got {value!r}")
    names: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise ConfigError(f"{where}: {key}: expected names (strings), got {item!r}")
        if item not in allowed:
            what = {"ops": "op", "reductions": "reduction", "arrays": "array placement",
                    "splits": "splits",
                    "p2p_ops": "p2p op",
                    "p2p_peer_access": "p2p peer access setting",
                    "backends": "backend",
                    "algorithms": "algorithm",
                    "timing": "timing mode", "baselines": "baseline"}[key]
            raise ConfigError(f"{where}: unknown {what} {item!r}; choose one of: "
                              f"{', '.join(allowed)}")
        if item not in names:
            names.append(item)
    if key == "baselines":
        if "none" in names and len(names) > 1:
            raise ConfigError(f"{where}: baselines: 'none' cannot be combined with others")
        return tuple(name for name in names if name != "none")
    if not names:
        raise ConfigError(f"{where}: {key}: give at least one of: {', '.join(allowed)}")
    return tuple(names)


def _algorithms_for(backend: str, ops: tuple[str, ...], requested: tuple[str, ...],
                    where: str) -> dict[str, list[str]]:
    """For each op, the requested algorithms that run it on ``backend``, ``auto``
    resolved to the op's own there (single-copy for all-gather and ring on host memory).
    An algorithm that does not run an op leaves that pairing out of the matrix (the
    all-gather kernels run no ring).

    Raises:
        ConfigError: the backend runs none of the requested algorithms for any op.
    """
    chosen: dict[str, list[str]] = {}
    for op in ops:
        own = algorithms_of(op, backend)
        names = chosen[op] = []
        for name in requested:
            resolved = name if name != "auto" or "auto" in own else own[0]
            if resolved in own and resolved not in names:
                names.append(resolved)
    if not any(chosen.values()):
        runs = list(dict.fromkeys(name for op in ops for name in algorithms_of(op, backend)))
        raise ConfigError(
            f"{where}: backend {backend!r} runs none of the algorithms "
            f"{', '.join(requested)} for {', '.join(ops)}; it runs {', '.join(runs)} "
            "(or say auto)")
    return chosen


def _sweep_options(matrix: Mapping[str, Any], where: str,
                   common: PatternOptions) -> PatternOptions:
    """Sizes, iterations and datatype through PatternOptions, the one validator."""
    try:
        given = {key: matrix[key] for key in _SWEEP_KEYS if matrix.get(key) is not None}
        return merge_options({**given, "exchange": common.exchange, "handle": common.handle})
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _check_keys(data: Mapping[Any, Any], known: tuple[str, ...], where: str) -> None:
    for key in data:
        if not isinstance(key, str):
            raise ConfigError(f"{where}: keys must be strings, got {key!r}")
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{where}: unknown key {key!r}{hint}; known keys: "
                              f"{', '.join(known)}")


def _integer(value: Any, key: str, where: str, *, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: {key}: expected an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"within [{low}, {high}]"
        raise ConfigError(f"{where}: {key} must be {bound}, got {value}")
    return value


def _min_bw(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}: min_bw: expected a number of GB/s, got {value!r}")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if math.isnan(number) or number < 0:
        raise ConfigError(f"{where}: min_bw must be a non-negative number of GB/s, got {value}")
    return number
