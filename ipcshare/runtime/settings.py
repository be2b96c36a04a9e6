"""Every ``IPCSHARE_*`` environment variable, read here and nowhere else.

Each variable is read when it is needed (not cached at import), so a test or a launcher
may set it late; what it means and its default are listed once, in ``SETTINGS`` (and in
docs/SETTINGS.md, which a test holds against this table). A malformed value raises
SettingError (a ConfigError) naming the variable and the value.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .errors import SettingError

__all__ = [
    "Setting", "SETTINGS", "raw", "seconds", "log_level", "debug", "max_ranks_per_gpu",
    "disabled_p2p_pairs", "shared_gpu_barrier", "SHARED_GPU_BARRIERS", "mpi_cuda_aware",
    "socket_dir", "kernel_cache", "kernel_archs", "kernel_shipped", "kernel_trace",
    "doctor_test_death", "exchange_timeout", "signal_timeout", "given_source_commit",
    "SOURCE_COMMIT",
    "DEFAULT_EXCHANGE_TIMEOUT_S", "DEFAULT_SIGNAL_TIMEOUT_S", "MIN_SECONDS", "MAX_SECONDS",
    "LOG", "DEBUG", "VIRTUAL_NODES", "MAX_RANKS_PER_GPU",
    "DISABLE_P2P", "P2P_FALLBACK", "P2P_CHUNK", "SHARED_GPU_BARRIER", "MPI_CUDA_AWARE",
    "SIGNAL_TIMEOUT", "EXCHANGE_TIMEOUT",
    "ARRIVAL_TIMEOUT", "PEER_EXIT_GRACE", "DOCTOR_TIMEOUT", "SOCKET_DIR", "KERNEL_CACHE",
    "KERNEL_ARCHS", "KERNEL_SHIPPED", "KERNEL_TRACE", "DOCTOR_TEST_DIE_RANK",
    "DOCTOR_TEST_DIE_STAGE",
]

LOG = "IPCSHARE_LOG"
DEBUG = "IPCSHARE_DEBUG"
VIRTUAL_NODES = "IPCSHARE_VIRTUAL_NODES"
MAX_RANKS_PER_GPU = "IPCSHARE_MAX_RANKS_PER_GPU"
DISABLE_P2P = "IPCSHARE_DISABLE_P2P"
P2P_FALLBACK = "IPCSHARE_P2P_FALLBACK"
P2P_CHUNK = "IPCSHARE_P2P_CHUNK"
SHARED_GPU_BARRIER = "IPCSHARE_SHARED_GPU_BARRIER"
MPI_CUDA_AWARE = "IPCSHARE_MPI_CUDA_AWARE"
SIGNAL_TIMEOUT = "IPCSHARE_SIGNAL_TIMEOUT"
EXCHANGE_TIMEOUT = "IPCSHARE_EXCHANGE_TIMEOUT"
ARRIVAL_TIMEOUT = "IPCSHARE_ARRIVAL_TIMEOUT"
PEER_EXIT_GRACE = "IPCSHARE_PEER_EXIT_GRACE"
DOCTOR_TIMEOUT = "IPCSHARE_DOCTOR_TIMEOUT"
SOCKET_DIR = "IPCSHARE_SOCKET_DIR"
KERNEL_CACHE = "IPCSHARE_KERNEL_CACHE"
KERNEL_ARCHS = "IPCSHARE_KERNEL_ARCHS"
KERNEL_SHIPPED = "IPCSHARE_KERNEL_SHIPPED"
KERNEL_TRACE = "IPCSHARE_KERNEL_TRACE"
DOCTOR_TEST_DIE_RANK = "IPCSHARE_DOCTOR_TEST_DIE_RANK"
DOCTOR_TEST_DIE_STAGE = "IPCSHARE_DOCTOR_TEST_DIE_STAGE"
SOURCE_COMMIT = "IPCSHARE_SOURCE_COMMIT"


@dataclass(frozen=True)
class Setting:
    """One variable: its name, its default (as a user would write it) and its meaning."""

    name: str
    default: str
    meaning: str


SETTINGS = (
    Setting(LOG, "WARNING", "log level of ipcshare's messages on stderr (DEBUG, INFO, ...)"),
    Setting(DEBUG, "unset", "any value: the CLI prints the traceback of every error it "
            "reports"),
    Setting(VIRTUAL_NODES, "unset", "K: split the job's ranks into K simulated nodes "
            "(the same on every rank)"),
    Setting(MAX_RANKS_PER_GPU, "unlimited", "how many ranks may share one GPU (a whole "
            "number, at least 1)"),
    Setting(DISABLE_P2P, "unset", "device pairs treated as having no peer access, e.g. "
            "`0-1,2-3`"),
    Setting(P2P_FALLBACK, "auto", "how pairs without peer access move bytes: auto, relay "
            "or host"),
    Setting(P2P_CHUNK, "4M", "bytes per staged chunk of a fallback pair (K/M/G suffixes)"),
    Setting(SHARED_GPU_BARRIER, "host", "how barriers meet when ranks share a GPU whose "
            "contexts take turns (no MPS): host or stream"),
    Setting(MPI_CUDA_AWARE, "MPI's own answer", "1: hand MPI device pointers; 0: stage "
            "device memory through the host"),
    Setting(SIGNAL_TIMEOUT, "30", "seconds a wait on a peer's signal may take (on the host "
            "or on the GPU)"),
    Setting(EXCHANGE_TIMEOUT, "30", "seconds a handle exchange or a fail-together step "
            "waits for every rank"),
    Setting(ARRIVAL_TIMEOUT, "600", "seconds a rank making a group waits for every other "
            "rank of the communicator to make it too (ranks start at different times), "
            "before every rank gives up; a waiting rank warns after the group's timeout, "
            "and gives up then on a rank of its host whose process is stopped (SIGSTOP, a "
            "debugger; known from an earlier meeting of the ranks, such as the CLI's first "
            "agreements), naming it. The CLI's first agreements wait as long for a running "
            "rank"),
    Setting(PEER_EXIT_GRACE, "2", "seconds a rank stuck in a blocking MPI call lives on "
            "after a peer died, before its guard ends it"),
    Setting(DOCTOR_TIMEOUT, "60", "seconds a rank may be late at a doctor checkpoint"),
    Setting(SOCKET_DIR, "the temp dir", "where the job's private socket directory goes "
            "(one directory mounted in every container of a node); set, it must be a "
            "writable directory whose socket paths fit 107 bytes, this user's or root's and "
            "not writable by others unless sticky (as /tmp), or every group fails at setup "
            "on every rank naming why"),
    Setting(KERNEL_CACHE, "$XDG_CACHE_HOME/ipcshare/kernels, else "
            "~/.cache/ipcshare/kernels", "where compiled kernels (CUBIN) are kept, one file "
            "per kernel, architecture and NVRTC version"),
    Setting(KERNEL_ARCHS, "sm_80,sm_90,sm_100", "when the package is built or installed: "
            "the architectures whose kernels it ships, built by NVRTC (commas or spaces; "
            "none: ship none, every first call compiles)"),
    Setting(KERNEL_SHIPPED, "1", "0: ignore the CUBINs shipped in the package (every kernel "
            "comes from the cache or NVRTC), e.g. to time a cold compile"),
    Setting(KERNEL_TRACE, "0", "1: build the collective kernels with phase stamps for "
            "tools/probes/timing/kernel_trace.py (a CUBIN of its own; results the same)"),
    Setting(SOURCE_COMMIT, "unset", "the commit of the tree that runs, HASH or HASH+dirty: "
            "what result documents name, before any git folder a copy of the tree may carry "
            "(a GPU node's copy carried one of another commit); tools/gpu_check.py --commit "
            "sets it"),
    Setting(DOCTOR_TEST_DIE_RANK, "unset", "tests only: the rank that dies during doctor"),
    Setting(DOCTOR_TEST_DIE_STAGE, "matrix", "tests only: the doctor stage at which it dies"),
)


def raw(name: str) -> str:
    """The variable's text as the process has it ("" when unset), not stripped: some
    callers compare it between ranks exactly as it was written."""
    return os.environ.get(name, "")


def _text(name: str) -> str:
    return raw(name).strip()


# Every duration setting lies in this range. Below a millisecond no wait on a peer can
# succeed (a rank's turn on a shared core is longer), so such a value only turns every run
# into a timeout; above about eleven days a deadline is no deadline, and values near the
# float limit overflow the clocks that sockets and sleeps take (`inf`, `1e308`).
MIN_SECONDS = 1e-3
MAX_SECONDS = 1e6


def duration_problem(value: object) -> str | None:
    """Why ``value`` is no duration in the settings' range (a number of seconds within
    [``MIN_SECONDS``, ``MAX_SECONDS``]), or None when it is one: the same rule for a
    duration given in code (``Group(timeout=)``) as for the ``IPCSHARE_*`` variables."""
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not MIN_SECONDS <= value <= MAX_SECONDS):  # also refuses NaN and inf
        return (f"give a positive number of seconds between {MIN_SECONDS:g} and "
                f"{MAX_SECONDS:g}")
    return None


def seconds(name: str, default: float) -> float:
    """A number of seconds from variable ``name`` within [``MIN_SECONDS``,
    ``MAX_SECONDS``], else ``default``.

    Raises:
        SettingError: set but not a number, not positive, not finite or out of range.
    """
    text = _text(name)
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise SettingError(f"{name}={text!r} is not a number of seconds", setting=name,
                           value=text) from None
    if not value > 0:  # also refuses NaN
        raise SettingError(f"{name} must be positive, got {text!r}", setting=name, value=text)
    if not MIN_SECONDS <= value <= MAX_SECONDS:  # also refuses inf
        raise SettingError(f"{name}={text!r} is out of range: give between {MIN_SECONDS:g} "
                           f"and {MAX_SECONDS:g} seconds, or unset it", setting=name,
                           value=text)
    return value


DEFAULT_EXCHANGE_TIMEOUT_S = 30.0
DEFAULT_SIGNAL_TIMEOUT_S = 30.0


def signal_timeout() -> float:
    """``IPCSHARE_SIGNAL_TIMEOUT`` in seconds (default 30).

    Raises:
        SettingError: set but not a number of seconds in range.
    """
    return seconds(SIGNAL_TIMEOUT, DEFAULT_SIGNAL_TIMEOUT_S)


def exchange_timeout() -> float:
    """``IPCSHARE_EXCHANGE_TIMEOUT`` in seconds (default 30).

    Raises:
        SettingError: set but not a positive number.
    """
    return seconds(EXCHANGE_TIMEOUT, DEFAULT_EXCHANGE_TIMEOUT_S)


def log_level() -> str | None:
    """``IPCSHARE_LOG`` as written, or None when unset or empty."""
    return raw(LOG) or None


def debug() -> bool:
    """Whether ``IPCSHARE_DEBUG`` is set to anything."""
    return bool(raw(DEBUG))


def max_ranks_per_gpu() -> int | None:
    """``IPCSHARE_MAX_RANKS_PER_GPU`` as an int, or None (unlimited) when unset.

    Raises:
        SettingError: the variable is not a positive integer.
    """
    text = _text(MAX_RANKS_PER_GPU)
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        raise SettingError(f"{MAX_RANKS_PER_GPU}={text!r} is not a whole number of ranks",
                           setting=MAX_RANKS_PER_GPU, value=text) from None
    if value < 1:
        raise SettingError(f"{MAX_RANKS_PER_GPU} must be at least 1, got {value}",
                           setting=MAX_RANKS_PER_GPU, value=text)
    return value


def disabled_p2p_pairs() -> set[frozenset[int]]:
    """Device pairs named in ``IPCSHARE_DISABLE_P2P`` (e.g. ``"0-1,2-3"``, ordinals as this
    process sees them), treated as having no peer path. On machines where every pair has
    NVLink this is how the no-peer-access paths are exercised.

    Raises:
        SettingError: a malformed pair.
    """
    pairs: set[frozenset[int]] = set()
    for item in filter(None, (part.strip() for part in _text(DISABLE_P2P).split(","))):
        ends = item.split("-")
        if len(ends) != 2 or not all(end.strip().isdigit() for end in ends):
            raise SettingError(f"{DISABLE_P2P}: {item!r} is not a pair of device numbers like "
                               "0-1", setting=DISABLE_P2P, value=_text(DISABLE_P2P))
        pairs.add(frozenset(int(end) for end in ends))
    return pairs


SHARED_GPU_BARRIERS = ("host", "stream")


def shared_gpu_barrier() -> str:
    """How barriers meet when ranks share a GPU whose contexts take turns in time slices
    (not every one an MPS client), from ``IPCSHARE_SHARED_GPU_BARRIER``:
    ``host`` (default: wait for the stream, then meet on the host) or ``stream`` (stream
    memory operations, as on GPUs of their own; kept to measure the difference).

    Raises:
        SettingError: set to anything else.
    """
    text = _text(SHARED_GPU_BARRIER) or "host"
    if text not in SHARED_GPU_BARRIERS:
        raise SettingError(f"{SHARED_GPU_BARRIER}={text!r}; choose one of: "
                           + ", ".join(SHARED_GPU_BARRIERS), setting=SHARED_GPU_BARRIER, value=text)
    return text


def mpi_cuda_aware() -> bool | None:
    """``IPCSHARE_MPI_CUDA_AWARE``: True (1), False (0), or None when unset (then MPI's
    own answer counts).

    Raises:
        SettingError: set to something other than 0 or 1.
    """
    text = _text(MPI_CUDA_AWARE)
    if not text:
        return None
    if text not in ("0", "1"):
        raise SettingError(f"{MPI_CUDA_AWARE}={text!r}: use 1 (CUDA-aware MPI) or 0 (stage "
                           "device memory through the host)", setting=MPI_CUDA_AWARE, value=text)
    return text == "1"


def socket_dir() -> str | None:
    """``IPCSHARE_SOCKET_DIR``, or None when unset or empty."""
    return raw(SOCKET_DIR) or None


def kernel_cache() -> str | None:
    """``IPCSHARE_KERNEL_CACHE``, or None when unset or empty."""
    return raw(KERNEL_CACHE) or None


def kernel_archs() -> str | None:
    """``IPCSHARE_KERNEL_ARCHS`` (read when the package is built), or None when unset."""
    return _text(KERNEL_ARCHS) or None


def kernel_shipped() -> bool:
    """``IPCSHARE_KERNEL_SHIPPED``: whether the package's shipped CUBINs may serve (True
    unless set to 0).

    Raises:
        SettingError: a value other than 0 or 1.
    """
    value = _text(KERNEL_SHIPPED)
    if value not in ("", "0", "1"):
        raise SettingError(f"{KERNEL_SHIPPED}={value!r}: must be 0 or 1")
    return value != "0"


def kernel_trace() -> bool:
    """``IPCSHARE_KERNEL_TRACE``: whether the collective kernels are built with their phase
    stamps (kernels/include/ipcshare/trace.cuh); False when unset.

    Raises:
        SettingError: set to something other than 0 or 1.
    """
    text = _text(KERNEL_TRACE)
    if text not in ("", "0", "1"):
        raise SettingError(f"{KERNEL_TRACE}={text!r}: use 1 (kernels with phase stamps, for "
                           "tools/probes/timing/kernel_trace.py) or 0", setting=KERNEL_TRACE,
                           value=text)
    return text == "1"


def doctor_test_death() -> tuple[str, str]:
    """The doctor's test hook: (the rank that dies, "" for none; the stage, default
    ``matrix``)."""
    return _text(DOCTOR_TEST_DIE_RANK), _text(DOCTOR_TEST_DIE_STAGE) or "matrix"


def given_source_commit() -> tuple[str, bool] | None:
    """``IPCSHARE_SOURCE_COMMIT`` as (hash, dirty), or None when unset or empty.

    Raises:
        SettingError: not 7 to 40 lowercase hex digits, optionally followed by ``+dirty``.
    """
    import re

    text = _text(SOURCE_COMMIT)
    if not text:
        return None
    match = re.fullmatch(r"([0-9a-f]{7,40})(\+dirty)?", text)
    if match is None:
        raise SettingError(f"{SOURCE_COMMIT}={text!r}: a commit hash (7 to 40 lowercase hex "
                           "digits), followed by +dirty where the tree had changes",
                           setting=SOURCE_COMMIT, value=text)
    return match[1], bool(match[2])
