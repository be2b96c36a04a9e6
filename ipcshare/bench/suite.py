"""The bench suite file: a matrix of ops x backends x algorithms x timing modes over one
size sweep (or a list of such matrices), validated in one place into frozen cases.

```yaml
name: host vs MPI          # optional title (default: the file's name)
ops: [allgather, ring]
backends: [host]           # auto | host | cuda-ipc | cuda-vmm
algorithms: [auto]         # auto | single-copy (host) | copy-engine | push | pull | ring (GPU)
timing: [nccl-tests, latency]  # and graph: nccl-tests timing of a CUDA graph (GPU all-gather);
                               # after-kernel: nccl-tests timing, an empty kernel before each (GPU)
baselines: [mpi, nccl]     # also torch, torch-symm; skipped, with a note, where they cannot run
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
```
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..config import PatternOptions, format_size, load_yaml_config, merge_options, parse_size
from ..errors import ConfigError
from ..patterns.timing import TIMING_MODES

__all__ = ["BenchCase", "Suite", "load_suite", "parse_suite", "ALGORITHMS", "BASELINE_NAMES",
           "BACKEND_CHOICES", "DEFAULT_ROTATE_BUFFERS", "SUITE_TIMINGS", "KERNEL_ALGORITHMS"]

BACKEND_CHOICES = ("auto", "host", "cuda-ipc", "cuda-vmm")
# nccl: NCCL through nccl4py; torch: NCCL through torch.distributed; torch-symm: PyTorch
# symmetric memory (all-reduce only: skipped, with the reason, by the suites' ops).
BASELINE_NAMES = ("mpi", "nccl", "torch", "torch-symm")
_GPU = ("cuda-ipc", "cuda-vmm")
# Each algorithm and the backends that run it. On host memory "auto" is single-copy; on
# GPUs it stays "auto": the measured choice per size (patterns.choice).
ALGORITHMS = {"single-copy": ("host",), "auto": _GPU, "copy-engine": _GPU,
              "push": _GPU, "pull": _GPU, "ring": _GPU}
# The all-gather kernels: cases pairing them with another op are left out of a matrix.
KERNEL_ALGORITHMS = ("push", "pull", "ring")
# Timing modes of a suite: the driver's two, "graph" (nccl-tests timing of operations
# captured in a CUDA graph) and "after-kernel" (nccl-tests timing with an empty kernel on
# the stream before every operation, ours and NCCL's). Latency cases of GPU all-gathers
# replay graphs, too.
SUITE_TIMINGS = (*TIMING_MODES, "graph", "after-kernel")
DEFAULT_ROTATE_BUFFERS = 4
_MAX_ROTATE_BUFFERS = 64

# The ops a suite runs. allreduce / reducescatter (ipcshare allreduce | reducescatter) join
# once suites name their reduction (-o) and the collectives' algorithms.
BENCH_OPS = ("ring", "allgather")
# List-valued keys of a matrix: allowed names and the default.
_LIST_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "ops": (BENCH_OPS, ("allgather",)),
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
    algorithm: str        # resolved: single-copy, auto, copy-engine, push, pull or ring
    timing: str           # nccl-tests, latency or graph
    baselines: tuple[str, ...]
    options: PatternOptions

    @property
    def label(self) -> str:
        """``'allgather host single-copy latency'``."""
        return f"{self.op} {self.backend} {self.algorithm} {self.timing}"


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
    cases = []
    for op in lists["ops"]:
        for requested in lists["backends"]:
            backend = resolve_backend(requested)
            for algorithm in _algorithms_for(backend, lists["algorithms"], where):
                if op != "allgather" and algorithm in KERNEL_ALGORITHMS:
                    continue  # the kernels are all-gathers
                for timing in lists["timing"]:
                    if timing == "graph" and (backend == "host" or op != "allgather"):
                        raise ConfigError(
                            f"{where}: timing 'graph' captures GPU all-gathers in CUDA "
                            f"graphs; it cannot time {op} on {backend}")
                    if timing == "after-kernel" and backend == "host":
                        raise ConfigError(
                            f"{where}: timing 'after-kernel' launches a GPU kernel before "
                            f"each operation; it cannot time {op} on host")
                    options = dataclasses.replace(sweep, backend=backend)
                    cases.append(BenchCase(op, backend, algorithm, timing,
                                           lists["baselines"], options))
    if not cases:
        raise ConfigError(f"{where}: no case left: the kernel algorithms "
                          f"({', '.join(KERNEL_ALGORITHMS)}) run only the allgather op")
    return cases


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
            what = {"ops": "op", "backends": "backend", "algorithms": "algorithm",
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


def _algorithms_for(backend: str, requested: tuple[str, ...], where: str) -> list[str]:
    """The requested algorithms that ``backend`` runs, ``auto`` resolved to its own.

    Raises:
        ConfigError: the backend runs none of them.
    """
    own = [name for name, backends in ALGORITHMS.items() if backend in backends]
    if not own:
        raise ConfigError(f"{where}: no algorithm runs on backend {backend!r}")
    chosen: list[str] = []
    for name in requested:
        resolved = "auto" if name == "auto" and "auto" in own else name
        resolved = own[0] if resolved == "auto" and "auto" not in own else resolved
        if resolved in own and resolved not in chosen:
            chosen.append(resolved)
    if not chosen:
        raise ConfigError(
            f"{where}: backend {backend!r} runs none of the algorithms "
            f"{', '.join(requested)}; it runs {', '.join(own)} (or say auto)")
    return chosen


def _sweep_options(matrix: Mapping[str, Any], where: str,
                   common: PatternOptions) -> PatternOptions:
    """Sizes, iterations and datatype through PatternOptions, the one validator."""
    try:
        given = {key: matrix[key] for key in _SWEEP_KEYS if matrix.get(key) is not None}
        sizes = {key: parse_size(given[key], what=key)
                 for key in ("min_bytes", "max_bytes") if key in given}
        low = sizes.get("min_bytes", PatternOptions.min_bytes)
        high = sizes.get("max_bytes", PatternOptions.max_bytes)
        if high < low:
            raise ConfigError(f"max_bytes ({format_size(high)}) is smaller than min_bytes "
                              f"({format_size(low)}): make max_bytes >= min_bytes")
        return merge_options({**given, **sizes, "exchange": common.exchange,
                              "handle": common.handle})
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
