"""How each pair of a node's ranks reaches the other's window: ``direct`` (mapped, the GPUs
have peer access), ``relay`` (through the window of a third rank whose GPU reaches both) or
``host-staged`` (through pinned host memory), planned from facts every rank gathered, so
that every rank computes the same plan. Pure: no driver, no MPI."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ..runtime import settings
from ..runtime.config import parse_size
from ..runtime.errors import ConfigError, SettingError

__all__ = ["PairPath", "PathPlan", "plan_paths", "all_direct", "fallback_choice",
           "chunk_bytes_choice", "env_choices", "PATH_KINDS", "FALLBACKS", "FALLBACK_ENV",
           "CHUNK_ENV", "DEFAULT_CHUNK_BYTES"]

# What ``Window.path(r)`` answers: this rank itself, a mapped window, one of the two
# fallbacks inside a node, or a rank of another node (reached through MPI).
PATH_KINDS = ("self", "direct", "relay", "host-staged", "mpi")
# ``IPCSHARE_P2P_FALLBACK``: how pairs without peer access move bytes. ``auto`` relays
# where a third GPU reaches both ends and stages through host memory elsewhere.
FALLBACKS = ("auto", "relay", "host")
FALLBACK_ENV = settings.P2P_FALLBACK
# ``IPCSHARE_P2P_CHUNK``: bytes per staged chunk (each fallback pair double-buffers two).
CHUNK_ENV = settings.P2P_CHUNK
DEFAULT_CHUNK_BYTES = 4 << 20


def fallback_choice(text: str | None, *, argument: str | None = None) -> str:
    """The fallback kind named by ``text`` (empty or None means auto): the environment's
    value, or the caller's argument called ``argument`` (``p2p_fallback``).

    Raises:
        SettingError: the environment's value is not one of FALLBACKS.
        ConfigError: the argument's value is not (named as the argument).
    """
    value = (text or "").strip().lower() or "auto"
    if value not in FALLBACKS:
        choices = f"choose one of: {', '.join(FALLBACKS)}"
        if argument is not None:
            raise ConfigError(f"{argument}={text!r} is not a fallback; {choices}")
        raise SettingError(f"{FALLBACK_ENV}={text!r} is not a fallback; {choices}",
                           setting=FALLBACK_ENV, value=text)
    return value


def chunk_bytes_choice(text: str | int | None, *, argument: str | None = None) -> int:
    """Bytes per staged chunk from ``text`` (``4M``, ``65536``; empty or None: 4 MiB): the
    environment's value, or the caller's argument called ``argument`` (``p2p_chunk``).

    Raises:
        SettingError: the environment's value is not a positive size.
        ConfigError: the argument's value is not (named as the argument).
    """
    if text is None or (isinstance(text, str) and not text.strip()):
        return DEFAULT_CHUNK_BYTES
    if argument is not None:
        return parse_size(text, what=argument)
    try:
        return parse_size(text, what=CHUNK_ENV)
    except ConfigError as exc:
        raise SettingError(str(exc), setting=CHUNK_ENV, value=text) from None


def env_choices() -> tuple[str, str]:
    """The raw ``(IPCSHARE_P2P_FALLBACK, IPCSHARE_P2P_CHUNK)`` of this process, for ranks
    to compare before planning."""
    return settings.raw(FALLBACK_ENV), settings.raw(CHUNK_ENV)


@dataclasses.dataclass(frozen=True)
class PairPath:
    """How two ranks of one node reach each other. ``relay`` is the world rank whose
    window stages their bytes (relay paths only); ``reason`` says why the pair is not
    direct (empty when it is); ``disabled_by_setting`` whether that is because the user's
    IPCSHARE_DISABLE_P2P named the pair."""

    kind: str
    relay: int | None = None
    reason: str = ""
    disabled_by_setting: bool = False


@dataclasses.dataclass(frozen=True)
class PathPlan:
    """The path of every pair of one node's ranks (world ranks ``ranks``, in local-rank
    order; ``labels`` name each rank's device, e.g. ``cuda:0``)."""

    ranks: tuple[int, ...]
    labels: tuple[str, ...]
    fallback: str
    chunk_bytes: int
    # frozenset({a, b}) -> PairPath, for every pair that is not direct.
    indirect: dict[frozenset[int], PairPath] = dataclasses.field(default_factory=dict)

    def path(self, a: int, b: int) -> PairPath:
        """The path between world ranks ``a`` and ``b`` (both on this node)."""
        if a == b:
            return PairPath("self")
        return self.indirect.get(frozenset((a, b)), PairPath("direct"))

    def kind(self, a: int, b: int) -> str:
        return self.path(a, b).kind

    def label(self, rank: int) -> str:
        """The device of world rank ``rank`` as its own process names it."""
        return self.labels[self.ranks.index(rank)]

    @property
    def has_fallbacks(self) -> bool:
        """Whether some pair of the node is not direct."""
        return bool(self.indirect)

    def direct_peers(self, rank: int) -> list[int]:
        """The other ranks whose windows ``rank`` maps."""
        return [r for r in self.ranks if r != rank and self.kind(rank, r) == "direct"]

    def indirect_peers(self, rank: int) -> list[int]:
        """The other ranks that ``rank`` reaches through a relay or host memory."""
        return [r for r in self.ranks if r != rank and self.kind(rank, r) != "direct"]

    def host_staged_peers(self, rank: int) -> list[int]:
        """The ranks whose pair with ``rank`` is host-staged, in rank order."""
        return [r for r in self.ranks if r != rank and self.kind(rank, r) == "host-staged"]

    def relayed_by(self, relay: int) -> list[tuple[int, int]]:
        """Directed pairs (sender, receiver) whose bytes stage in ``relay``'s window, in
        a fixed order every rank agrees on."""
        pairs = []
        for pair, path in sorted(self.indirect.items(), key=lambda item: sorted(item[0])):
            if path.kind == "relay" and path.relay == relay:
                low, high = sorted(pair)
                pairs += [(low, high), (high, low)]
        return pairs

    def most_relayed(self) -> int:
        """The largest number of directed pairs any one rank relays (its window staging
        area is sized for it; every window of the node gets the same size)."""
        return max((len(self.relayed_by(r)) for r in self.ranks), default=0)

    def most_host_staged(self) -> int:
        """The largest number of host-staged peers of any one rank."""
        return max((len(self.host_staged_peers(r)) for r in self.ranks), default=0)

    def describe(self, a: int, b: int) -> str:
        """One phrase on how ``a`` and ``b`` move bytes, for errors and tables."""
        path = self.path(a, b)
        if path.kind == "relay":
            assert path.relay is not None
            return f"relay through rank {path.relay} ({self.label(path.relay)})"
        if path.kind == "host-staged":
            return "host-staged through pinned host memory"
        return path.kind

    def matrix(self) -> list[list[str]]:
        """``[i][j]``: the kind of path between the i-th and j-th rank of the node."""
        return [[self.kind(a, b) for b in self.ranks] for a in self.ranks]


def all_direct(ranks: Sequence[int], labels: Sequence[str] | None = None) -> PathPlan:
    """The plan of a node whose every pair is direct (host memory, one GPU...)."""
    labels = tuple(labels) if labels is not None else tuple("host" for _ in ranks)
    return PathPlan(tuple(ranks), labels, "auto", DEFAULT_CHUNK_BYTES)


def plan_paths(ranks: Sequence[int], labels: Sequence[str], reach: Sequence[Sequence[bool]],
               reasons: Sequence[Sequence[str]], *, fallback: str = "auto",
               chunk_bytes: int = DEFAULT_CHUNK_BYTES,
               disabled: Sequence[Sequence[bool]] | None = None) -> PathPlan:
    """Plan the path of every pair of a node's ranks.

    ``reach[i][j]`` says whether the i-th rank's GPU may map the j-th rank's memory
    (``reasons[i][j]`` why not; ``disabled[i][j]`` whether IPCSHARE_DISABLE_P2P is why,
    none by default). A pair is direct when both directions work; otherwise
    it relays through the lowest-numbered rank that is direct with both ends, or, where
    none is or ``fallback`` is ``host``, stages through pinned host memory.

    Raises:
        ConfigError: an unknown ``fallback``; or ``fallback`` is ``relay`` and some pair
            has no rank to relay through.
    """
    fallback = fallback_choice(fallback)
    count = len(ranks)
    if len(labels) != count or len(reach) != count or any(len(row) != count for row in reach):
        raise ValueError(f"path facts of {len(reach)} ranks for a node of {count}")
    if chunk_bytes < 1:
        raise ConfigError(f"{CHUNK_ENV} must be at least 1 byte, got {chunk_bytes}")

    def direct(i: int, j: int) -> bool:
        return i == j or (bool(reach[i][j]) and bool(reach[j][i]))

    indirect: dict[frozenset[int], PairPath] = {}
    for i in range(count):
        for j in range(i + 1, count):
            if direct(i, j):
                continue
            a, b = (i, j) if not reach[i][j] else (j, i)  # the direction that failed
            why = reasons[a][b]
            on_purpose = bool(disabled[a][b]) if disabled is not None else False
            reason = f"{labels[i]} and {labels[j]} have no peer access: {why or 'unknown'}"
            relays = [k for k in range(count) if k not in (i, j) and direct(i, k)
                      and direct(j, k)]
            # Ranks are in local-rank order, which is world-rank order: the first is the
            # lowest-numbered rank, on every rank alike.
            if relays and fallback != "host":
                indirect[frozenset((ranks[i], ranks[j]))] = PairPath(
                    "relay", ranks[relays[0]], reason, on_purpose)
            elif fallback == "relay":
                raise ConfigError(
                    f"{FALLBACK_ENV}=relay: no rank of the node reaches both rank {ranks[i]} "
                    f"({labels[i]}) and rank {ranks[j]} ({labels[j]}) peer-to-peer ({reason}); "
                    "use auto or host")
            else:
                indirect[frozenset((ranks[i], ranks[j]))] = PairPath("host-staged", None, reason,
                                                                     on_purpose)
    return PathPlan(tuple(ranks), tuple(labels), fallback, chunk_bytes, indirect)

