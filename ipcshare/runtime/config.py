"""Run options as frozen dataclasses, sizes with K/M/G suffixes, YAML configs."""

from __future__ import annotations

import dataclasses
import math
import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .errors import ConfigError, OptionError

__all__ = [
    "is_seconds",
    "BACKENDS",
    "EXCHANGES",
    "ALGOS",
    "REDUCTIONS",
    "SPLITS",
    "BASELINES",
    "DATATYPES",
    "INTER_ENGINES",
    "PatternOptions",
    "as_typed",
    "parse_size",
    "format_size",
    "human_bytes",
    "load_yaml_config",
    "merge_options",
]

BACKENDS = ("auto", "host", "cuda-ipc", "cuda-vmm")
EXCHANGES = ("auto", "mpi", "socket", "pidfd")
# nccl: NCCL through nccl4py; torch: NCCL through torch.distributed; torch-symm: PyTorch
# symmetric memory's all-reduce (baselines.registry).
BASELINES = ("none", "mpi", "nccl", "torch", "torch-symm")
HANDLES = ("posix-fd", "fabric")
# auto / copy-engine: engine copies (memcpy on host, the copy engine on GPUs);
# hierarchical: all-gather by IPC inside nodes and MPI between them (auto's choice when a
# job spans nodes); push / pull / ring: all-gather kernels (GPU backends); one-shot /
# two-shot: all-reduce (and one-shot reduce-scatter) of the collectives layer; ll: the
# low-latency protocol of the collectives layer (all-gather, all-reduce, reduce-scatter and
# all-to-all of even splits, GPU backends), ll-two-shot its two-shot all-reduce; stepped:
# the collectives layer's kernels that never spin (ranks sharing GPUs); balanced: the
# all-to-all kernel that cuts its work by bytes (GPU backends); eager: the all-to-all-v
# kernel that stores into its peers' inbox slots without a meeting (GPU backends); ll128:
# the low-latency protocol by 128-byte lines (all-gather, all-reduce, reduce-scatter and
# all-to-all, GPU backends), ll128-two-shot its two-shot all-reduce.
ALGOS = ("auto", "copy-engine", "hierarchical", "push", "pull", "ring", "one-shot",
         "two-shot", "leader", "ll", "ll-two-shot", "stepped", "balanced", "eager", "ll128",
         "ll128-two-shot")
# --timing of the op commands (patterns.timing.TIMING_MODES, kept in step by a test).
TIMINGS = ("nccl-tests", "latency")
# What carries the hierarchical collectives' step between nodes: NCCL through nccl4py
# (rails of local rank i), MPI, or auto (NCCL where importable on a GPU backend, else MPI).
INTER_ENGINES = ("auto", "nccl", "mpi")
# -o of allreduce / reducescatter (the collectives layer's ops).
REDUCTIONS = ("sum", "max", "min")
# --splits of alltoall: even (all_to_all), random or skewed (all_to_all_v, seeded splits).
SPLITS = ("even", "random", "skewed")
# name -> (numpy dtype string, bytes per element)
DATATYPES = {
    "uint8": ("u1", 1), "int8": ("i1", 1),
    "int32": ("i4", 4), "uint32": ("u4", 4), "float32": ("f4", 4), "float": ("f4", 4),
    "float16": ("f2", 2), "half": ("f2", 2), "bfloat16": ("u2", 2),
    "int64": ("i8", 8), "float64": ("f8", 8), "double": ("f8", 8),
}

def as_typed(value: Any) -> str:
    """``value`` as a user would type it in a shell or a YAML file: ``4K``, ``-1``,
    ``'two words'``, ``''``; always one line."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, str):
        text = shlex.quote(value)
    else:
        text = str(value)
    # A value may hold a line break (found by fuzzing): the error stays one line.
    return text.replace("\r", "\\r").replace("\n", "\\n")


_SIZE_RE = re.compile(r"^\s*([-+]?\d+)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)
_SUFFIX = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str | int, *, what: str = "size") -> int:
    """Bytes from ``"64"``, ``"4K"``, ``"1M"``, ``"2G"`` (binary suffixes) or an int.

    Raises:
        OptionError: zero, negative, fractional or non-numeric input, naming ``what``
            and the text as given.
    """
    shown = (what, as_typed(text))
    if isinstance(text, bool):
        raise OptionError("{0}: expected a size such as 1M", shown)
    if isinstance(text, int):
        value = text
    else:
        match = _SIZE_RE.match(str(text))
        if not match:
            raise OptionError("{0} is not a size; use a positive integer with an optional "
                              "K, M or G suffix (binary), e.g. 64K or 1M", shown)
        value = int(match.group(1)) * _SUFFIX[match.group(2).lower()]
    if value <= 0:
        raise OptionError("{0}: must be at least 1 byte; use a size such as 64K or 1M", shown)
    return value


def is_seconds(value: Any) -> bool:
    """Whether ``value`` is a positive, finite number of seconds (a bool is not)."""
    return (not isinstance(value, bool) and isinstance(value, (int, float))
            and math.isfinite(value) and value > 0)


def human_bytes(nbytes: int | None) -> str:
    """``1.5G``-style approximate size (binary units), ``-`` for None."""
    if nbytes is None:
        return "-"
    value = float(nbytes)
    for unit in ("B", "K", "M", "G", "T", "P"):
        if value < 1024 or unit == "P":
            return f"{value:.0f}{unit}" if unit == "B" or value >= 100 else f"{value:.1f}{unit}"
        value /= 1024
    return f"{nbytes}B"


def format_size(nbytes: int) -> str:
    """Shortest exact binary-suffixed spelling: 1048576 -> '1M', 1000 -> '1000'."""
    for suffix, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{suffix}"
    return str(nbytes)


@dataclasses.dataclass(frozen=True)
class PatternOptions:
    """Everything a ring or all-gather run needs; immutable once validated."""

    backend: str = "auto"
    exchange: str = "auto"
    handle: str = "posix-fd"
    min_bytes: int = 1 << 20
    max_bytes: int = 1 << 20
    step_factor: int = 2
    iters: int = 20
    warmup: int = 5
    checks: int = 1
    datatype: str = "float32"
    baseline: str = "none"
    algo: str = "auto"
    inter: str = "auto"
    op: str = "sum"
    # Reductions (allreduce, reducescatter): 1 registers the case's arrays with the
    # communicator (Communicator.register), so calls read them in place (nccl-tests -R).
    register: int = 0
    # alltoall: how each rank's input is split between the ranks (patterns.alltoall).
    splits: str = "even"
    graph: bool = False
    after_kernel: bool = False
    # nccl-tests: averaged back-to-back runs; latency: samples of one operation each,
    # reported as p50 with p5 / p95 (patterns.timing).
    timing: str = "nccl-tests"
    json: str | None = None
    min_bw: float | None = None

    def __post_init__(self) -> None:
        _choice("backend", self.backend, BACKENDS)
        _choice("exchange", self.exchange, EXCHANGES)
        _choice("handle", self.handle, HANDLES)
        _choice("baseline", self.baseline, BASELINES)
        _choice("algo", self.algo, ALGOS)
        _choice("inter", self.inter, INTER_ENGINES)
        _choice("op", self.op, REDUCTIONS)
        _choice("splits", self.splits, SPLITS)
        _choice("timing", self.timing, TIMINGS)
        _choice("datatype", self.datatype, tuple(DATATYPES))
        for name in ("min_bytes", "max_bytes"):
            parse_size(getattr(self, name), what=name)
        if self.max_bytes < self.min_bytes:
            raise OptionError("{0} is smaller than {1}: the largest size must be at least "
                              "the smallest", ("max_bytes", format_size(self.max_bytes)),
                              ("min_bytes", format_size(self.min_bytes)))
        if self.step_factor < 2 and self.max_bytes != self.min_bytes:
            raise OptionError("{0}: must be >= 2 to sweep sizes from {1} to {2}",
                              ("step_factor", str(self.step_factor)),
                              ("min_bytes", format_size(self.min_bytes)),
                              ("max_bytes", format_size(self.max_bytes)))
        for name, low in (("iters", 1), ("warmup", 0), ("checks", 0)):
            value = getattr(self, name)
            if value < low:
                raise OptionError(f"{{0}}: must be >= {low}", (name, str(value)))
        if self.register not in (0, 1):
            raise OptionError("{0}: must be 0 (arrays copied in by the library) or 1 "
                              "(registered with the communicator)",
                              ("register", as_typed(self.register)))
        if self.min_bw is not None and (math.isnan(self.min_bw) or self.min_bw < 0):
            raise OptionError("{0}: must be a non-negative number of GB/s",
                              ("min_bw", f"{self.min_bw:g}"))

    @property
    def element_size(self) -> int:
        """Bytes per element of ``datatype``."""
        return DATATYPES[self.datatype][1]

    def sizes(self) -> list[int]:
        """The sweep: min, min*f, ... up to and including max (nccl-tests order)."""
        sizes, size = [], self.min_bytes
        while size <= self.max_bytes:
            sizes.append(size)
            if self.step_factor < 2:
                break
            size *= self.step_factor
        return sizes


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise OptionError(f"{{0}}: unknown {name}; choose one of: {', '.join(allowed)}",
                          (name, as_typed(value)))


_FIELD_TYPES = {
    "backend": str, "exchange": str, "handle": str, "datatype": str, "baseline": str,
    "min_bytes": "size", "max_bytes": "size", "step_factor": int, "iters": int,
    "warmup": int, "checks": int, "graph": bool, "after_kernel": bool, "algo": str,
    "inter": str, "json": str, "min_bw": float, "op": str, "timing": str, "register": int,
    "splits": str,
}


def merge_options(*layers: Mapping[str, Any]) -> PatternOptions:
    """Build PatternOptions from dicts, later layers winning; None means 'not given'.

    This is the one place where user dicts (YAML, CLI) become typed options.

    Raises:
        OptionError: a value of the wrong type or an invalid value (a ConfigError
            naming the option: ``render`` names it as the user did).
        ConfigError: unknown key.
    """
    merged: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if value is None:
                continue
            key = key.replace("-", "_")
            if key not in _FIELD_TYPES:
                raise ConfigError(
                    f"unknown option {key!r}; known options: {', '.join(sorted(_FIELD_TYPES))}")
            merged[key] = _coerce(key, value)
    return PatternOptions(**merged)


def _coerce(key: str, value: Any) -> Any:
    kind = _FIELD_TYPES[key]
    if kind == "size":
        return parse_size(value, what=key)
    shown = (key, as_typed(value))
    if kind is bool:
        if not isinstance(value, bool):
            raise OptionError("{0}: expected true or false", shown)
        return value
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise OptionError("{0}: expected an integer", shown)
        return value
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise OptionError("{0}: expected a number", shown)
        return float(value)
    if not isinstance(value, str):
        raise OptionError("{0}: expected a string", shown)
    return value


def load_yaml_config(path: str | Path) -> dict[str, Any]:
    """Read a YAML run config: a mapping of option names to values.

    Raises:
        ConfigError: missing file, YAML syntax error, or a document that is not a mapping.
    """
    import yaml  # a light import, but only commands that read configs need it

    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"config file {str(path)!r} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"config file {str(path)!r} cannot be read: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        raise ConfigError(f"config file {str(path)!r} is not valid YAML{at}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file {str(path)!r} must be a mapping of option: value, "
            f"got a {type(data).__name__}")
    for key in data:
        if not isinstance(key, str):
            raise ConfigError(
                f"config file {str(path)!r}: option names must be strings, got {key!r}")
    return data
