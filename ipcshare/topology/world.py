"""Who is where: world communicator, node-local communicator, local rank, node count, and
the node leaders' communicator; ``IPCSHARE_VIRTUAL_NODES`` splits one machine into several
simulated nodes."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import socket
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..runtime import settings
from ..runtime.errors import ConfigError, SettingError
from ..runtime.logs import configure_logging
from .arrival import wait_for_every_rank
from .job_ranks import note_ranks
from .mpi_import import mpi
from .process_state import process_start_time

__all__ = ["World", "mpi", "mpi_library_version", "mpi_library_name", "short_library_name",
           "virtual_node_blocks", "VIRTUAL_NODES_ENV", "format_ranks", "parse_ranks",
           "describe_disagreement", "launcher_world_size"]

VIRTUAL_NODES_ENV = settings.VIRTUAL_NODES

# What MPI launchers set for every process they start: Open MPI, MPICH's Hydra, PMIx.
# Communicators of groups where a wait was given up on (``World.close(keep=True)``).
_KEPT_COMMUNICATORS: list[Any] = []
_LAUNCHER_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE")


def launcher_world_size() -> tuple[str, int] | None:
    """``(variable, ranks)`` when a launcher (mpiexec, srun with PMI or PMIx) started this
    process as one of several ranks, read from its environment without starting MPI;
    None for a process of its own or the only rank of a job."""
    for name in _LAUNCHER_SIZE_VARS:
        text = os.environ.get(name, "").strip()
        if text.isdigit() and int(text) > 1:
            return name, int(text)
    return None


def mpi_library_version() -> str:
    """The first line of the MPI library's version string, spaces collapsed. Open MPI ends
    it with a NUL, which would otherwise reach reports and JSON."""
    text = mpi().Get_library_version().replace("\x00", "")
    lines = text.splitlines()
    return " ".join(lines[0].split()) if lines else ""


def mpi_library_name() -> str:
    """The MPI library and its version in a few words, as every output names it:
    ``MPICH 5.0.2``, ``Open MPI 4.1.6``. Reports that show the machine keep the whole
    first line (:func:`mpi_library_version`)."""
    return short_library_name(mpi_library_version())


def short_library_name(line: str) -> str:
    """The library's words up to its version number, without the word "version" and
    colons: ``MPICH Version: 5.0.2`` -> ``MPICH 5.0.2``, ``Open MPI v4.1.6, package: ...``
    -> ``Open MPI 4.1.6``, ``Intel(R) MPI Library 2021.10 for Linux* OS`` -> ``Intel(R)
    MPI Library 2021.10``."""
    words = []
    for word in line.split(",")[0].split():
        if word.rstrip(":").lower() in ("version", ""):
            continue
        if len(word) > 1 and word[0] in "vV" and word[1].isdigit():
            word = word[1:]   # Open MPI writes v4.1.6
        words.append(word)
        if word[0].isdigit():
            break   # the version: what follows is build detail
    return " ".join(words) or "MPI"


@dataclasses.dataclass
class World:
    """The ranks of one job as ipcshare sees them.

    ``comm`` is a duplicate of the communicator the user gave (COMM_WORLD by default),
    which this world owns: the group's traffic never meets the caller's; ``local_comm``
    holds the ranks of this node (``Split_type(COMM_TYPE_SHARED)``), the only ones whose
    memory this rank can map. When the job spans nodes, ``rail_comm`` joins the ranks of
    the same local rank on every node (one "rail" per local rank; nodes with fewer ranks
    are missing from the higher rails); rail 0 is the node leaders' ``leader_comm``. Both
    are None on a one-node job.

    With ``IPCSHARE_VIRTUAL_NODES=K`` the job's ranks (COMM_WORLD) form K simulated nodes
    of consecutive ranks (see :func:`virtual_node_blocks`): node identity, ``local_comm``
    and ``node_count`` follow the split, hostnames stay real.
    """

    comm: Any
    local_comm: Any
    rank: int
    size: int
    local_rank: int
    local_size: int
    node_index: int
    node_count: int
    hostname: str
    hostnames: list[str]
    pids: list[int]
    node_of_rank: list[int]
    local_ranks: list[int]  # world ranks on this node, ordered by local rank
    rail_comm: Any = None
    virtual_nodes: int | None = None  # K when IPCSHARE_VIRTUAL_NODES split the ranks
    # Rank and rank count on this machine, virtual nodes or not: what device binding and
    # core or memory budgets go by.
    host_rank: int = 0
    host_size: int = 1
    _owns_local_comm: bool = True
    # Each rank's process start time (``process_state.process_start_time``; None where it
    # cannot be read), which tells its pid apart from another process's, and its rank in
    # the job (MPI.COMM_WORLD), by rank.
    start_times: list[int | None] = dataclasses.field(default_factory=list)
    job_ranks: list[int] = dataclasses.field(default_factory=list)

    @classmethod
    def from_comm(cls, comm: Any = None, *,
                  host_placement: tuple[int, int] | None = None,
                  warn_after: float | None = None) -> World:
        """Collective over ``comm``: split it into nodes and learn every rank's place.

        ``host_placement`` (rank, rank count on this machine) replaces the one ``comm``'s
        own split gives, for a world over part of a job whose machine placement is known
        (a node's ranks under virtual nodes would otherwise bind the machine's first
        GPUs, not their own).

        The ranks first wait for each other (``arrival.wait_for_every_rank``): a rank
        still waiting after ``warn_after`` seconds (default: the exchange timeout) says
        so, and every rank gives up after ``IPCSHARE_ARRIVAL_TIMEOUT``.

        Raises:
            ConfigError: ``comm`` is not an MPI communicator.
            ExchangeTimeout: not every rank of ``comm`` arrived in time.
        """
        MPI = mpi()
        comm = MPI.COMM_WORLD if comm is None else comm
        if not isinstance(comm, MPI.Intracomm):
            # A misuse on this rank: refused here, before any collective.
            raise ConfigError(f"comm={comm!r} ({type(comm).__name__}) is not an MPI "
                              "communicator: pass an mpi4py.MPI.Intracomm (e.g. "
                              "MPI.COMM_WORLD or one made by its Split), or nothing for "
                              "the whole job")
        rank, size = comm.Get_rank(), comm.Get_size()
        # Logs name the job's rank, also for groups over a sub-communicator.
        configure_logging(MPI.COMM_WORLD.Get_rank())
        wait_for_every_rank(comm, warn_after=warn_after)
        # The group's own traffic goes on a duplicate of the caller's communicator, as MPI
        # libraries do: a collective this rank gives up on (a timeout) then stays pending
        # there, never matched with one of the caller's on ``comm`` (or of a later group).
        comm = comm.Dup()
        try:
            return cls._from_own_comm(comm, rank, size, host_placement)
        except BaseException:
            with contextlib.suppress(Exception):
                comm.Free()
            raise

    @classmethod
    def _from_own_comm(cls, comm: Any, rank: int, size: int,
                       host_placement: tuple[int, int] | None) -> World:
        """``from_comm`` on the duplicate it made (``comm``), which the world then owns."""
        MPI = mpi()
        local_comm = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
        host_rank, host_size = (host_placement if host_placement is not None else
                                (local_comm.Get_rank(), local_comm.Get_size()))
        hostname = socket.gethostname()
        # Rank of each node's first member names the node; order nodes by it.
        leader = local_comm.allreduce(rank, op=MPI.MIN)
        requested = settings.raw(VIRTUAL_NODES_ENV).strip()
        job_rank = MPI.COMM_WORLD.Get_rank()
        facts = comm.allgather((hostname, os.getpid(), leader, requested, job_rank,
                                process_start_time()))
        note_ranks([fact[4] for fact in facts], [fact[0] for fact in facts],
                   [fact[1] for fact in facts], [fact[5] for fact in facts],
                   own_job_rank=job_rank, job_size=MPI.COMM_WORLD.Get_size(), host=hostname)
        leaders = sorted({fact[2] for fact in facts})
        node_of_rank = [leaders.index(fact[2]) for fact in facts]
        virtual_nodes = None
        if any(fact[3] for fact in facts):
            # Every rank sees the same facts, so every rank raises the same error.
            try:
                virtual_nodes = _virtual_node_count([fact[3] for fact in facts])
                node_of_rank = _virtual_split(node_of_rank, virtual_nodes, facts,
                                              MPI.COMM_WORLD.Get_size())
            except ConfigError:
                local_comm.Free()
                raise
            local_comm.Free()
            local_comm = comm.Split(node_of_rank[rank], key=rank)
        node_index = node_of_rank[rank]
        node_count = max(node_of_rank) + 1
        local_ranks = [r for r in range(size) if node_of_rank[r] == node_index]
        local_rank = local_ranks.index(rank)
        # Ordered by rank, so with nodes of consecutive ranks a rail's rank is the node's.
        rail_comm = comm.Split(local_rank, key=rank) if node_count > 1 else None
        # Some MPIs (Open MPI) set up a new communicator's shared-memory collectives on its
        # first use, which can take tens of milliseconds: pay that here, at group setup,
        # not inside the first window's descriptor exchange.
        local_comm.Barrier()
        return cls(
            comm=comm, local_comm=local_comm, rank=rank, size=size,
            local_rank=local_rank, local_size=local_comm.Get_size(),
            node_index=node_index, node_count=node_count, hostname=hostname,
            hostnames=[fact[0] for fact in facts], pids=[fact[1] for fact in facts],
            start_times=[fact[5] for fact in facts], job_ranks=[fact[4] for fact in facts],
            node_of_rank=node_of_rank, local_ranks=local_ranks, rail_comm=rail_comm,
            virtual_nodes=virtual_nodes, host_rank=host_rank, host_size=host_size)

    def where(self, rank: int | None = None) -> str:
        """``'rank 1@node3'`` for ``rank`` (default: this rank)."""
        rank = self.rank if rank is None else rank
        return f"rank {rank}@{self.hostnames[rank]}"

    def is_local(self, rank: int) -> bool:
        """Whether ``rank`` runs on this node (its memory can be mapped here)."""
        return self.node_of_rank[rank] == self.node_index

    def node_ranks(self, node: int) -> list[int]:
        """World ranks of node ``node``, in rank order."""
        return [r for r, n in enumerate(self.node_of_rank) if n == node]

    @property
    def leader_comm(self) -> Any:
        """The node leaders' communicator (rail 0) on a leader of a multi-node job, else
        None."""
        return self.rail_comm if self.is_leader else None

    @property
    def is_leader(self) -> bool:
        """Whether this rank is its node's first (it speaks for the node between nodes)."""
        return self.local_ranks[0] == self.rank

    def local_index(self, rank: int) -> int:
        """Local rank of world rank ``rank``, which must be on this node."""
        return self.local_ranks.index(rank)

    def close(self, *, keep: bool = False) -> None:
        """Free the world's communicators: its duplicate of the caller's, the node-local
        and the rail one (idempotent). ``keep``: a wait on
        them was given up on, here or by a peer: hold them for the life of the process
        instead, so MPI never gives their context to a new communicator while a message
        for them may still arrive."""
        mine = [self.rail_comm]
        if self._owns_local_comm:
            mine.append(self.local_comm)
        mine.append(self.comm)   # the duplicate from_comm made
        for comm in filter(None, mine):
            if keep:
                _KEPT_COMMUNICATORS.append(comm)
            else:
                with contextlib.suppress(Exception):
                    comm.Free()
        self.rail_comm = None
        self.comm = None
        if self._owns_local_comm:
            self.local_comm = None


def virtual_node_blocks(size: int, nodes: int) -> list[int]:
    """The node of each of ``size`` ranks split into ``nodes`` blocks of consecutive ranks,
    the first ``size % nodes`` blocks one rank larger: 3 ranks over 2 nodes -> [0, 0, 1].

    Raises:
        SettingError: ``nodes`` is not between 1 and ``size``.
    """
    if nodes < 1:
        raise SettingError(f"{VIRTUAL_NODES_ENV}={nodes}: the job needs at least 1 virtual "
                           "node (unset it for the real nodes)", setting=VIRTUAL_NODES_ENV,
                           value=nodes)
    if nodes > size:
        raise SettingError(f"{VIRTUAL_NODES_ENV}={nodes} asks for more virtual nodes than "
                           f"the {size} rank(s) of the job: each node needs at least one rank",
                           setting=VIRTUAL_NODES_ENV, value=nodes)
    base, extra = divmod(size, nodes)
    node_of_rank: list[int] = []
    for node in range(nodes):
        node_of_rank += [node] * (base + (1 if node < extra else 0))
    return node_of_rank


def format_ranks(ranks: Iterable[int]) -> str:
    """``'rank 3'``, ``'ranks 0-1'``, ``'ranks 0, 2-3'``: the ranks sorted, each run of
    consecutive ranks as one range. :func:`parse_ranks` reads it back."""
    ordered = sorted(set(ranks))
    spans: list[str] = []
    start = 0
    for i in range(1, len(ordered) + 1):
        if i == len(ordered) or ordered[i] != ordered[i - 1] + 1:
            first, last = ordered[start], ordered[i - 1]
            spans.append(str(first) if first == last else f"{first}-{last}")
            start = i
    return ("rank " if len(ordered) == 1 else "ranks ") + ", ".join(spans)


_RANK_LIST = re.compile(r"^\s*ranks?\s+(\d+(?:-\d+)?(?:,\s*\d+(?:-\d+)?)*)\s*$")


def parse_ranks(text: str) -> list[int]:
    """The ranks :func:`format_ranks` wrote: ``'ranks 0, 2-3'`` -> ``[0, 2, 3]``.

    Raises:
        ValueError: ``text`` is not such a list.
    """
    match = _RANK_LIST.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a list of ranks")
    ranks: list[int] = []
    for span in match.group(1).split(","):
        first, _, last = span.strip().partition("-")
        ranks += range(int(first), int(last or first) + 1)
    return ranks


def describe_disagreement(values: Sequence[Any], *, verb: tuple[str, str] = ("has", "have"),
                          then: str = "", spell: Callable[[Any], str] = str,
                          ranks: Sequence[int] | None = None) -> str:
    """Name every rank's value, ranks whose values read the same together, in the order
    of their first rank: ``"ranks 0-2 have '2', rank 3 '3'"`` from ``['2', '2', '2', '3']``
    with ``spell=repr``.

    ``verb`` is the verb after the first group (singular, plural) and ``then`` the word
    before each later value (``verb=("asks for", "ask for"), then="for"`` gives
    ``'rank 0 asks for -b 1M, rank 1 for -b 2M'``); ``spell`` turns a value into text;
    ``ranks`` holds the rank of each value (default: its index).
    """
    groups: dict[str, list[int]] = {}
    for rank, value in zip(range(len(values)) if ranks is None else ranks, values,
                           strict=True):
        groups.setdefault(spell(value), []).append(rank)
    parts = []
    for text, holders in groups.items():
        word = (verb[0] if len(holders) == 1 else verb[1]) if not parts else then
        parts.append(" ".join(filter(None, (format_ranks(holders), word, text))))
    return ", ".join(parts)


def _virtual_node_count(texts: list[str]) -> int:
    """K from every rank's ``IPCSHARE_VIRTUAL_NODES``; they must agree."""
    if len(set(texts)) > 1:
        raise SettingError(f"{VIRTUAL_NODES_ENV} differs between ranks: "
                           f"{describe_disagreement(texts, spell=repr)}",
                           setting=VIRTUAL_NODES_ENV, value=" / ".join(sorted(set(texts))))
    text = texts[0]
    if not re.fullmatch(r"[0-9]+", text):
        raise SettingError(f"{VIRTUAL_NODES_ENV}={text!r} is not a number of nodes",
                           setting=VIRTUAL_NODES_ENV, value=text)
    return int(text)


def _virtual_split(real_node_of_rank: list[int], nodes: int, facts: list[tuple],
                   job_size: int) -> list[int]:
    """Node of each rank of a communicator under K virtual nodes. The blocks are cut
    from the job's ranks (COMM_WORLD), so a process keeps its node in every group, also
    in a group over a part of the job; a virtual node may not span two real nodes."""
    job_nodes = virtual_node_blocks(job_size, nodes)
    virtual = [job_nodes[fact[4]] for fact in facts]
    ordered = sorted(set(virtual), key=virtual.index)  # numbered by their first rank here
    node_of_rank = [ordered.index(v) for v in virtual]
    for node in range(len(ordered)):
        members = [r for r, n in enumerate(node_of_rank) if n == node]
        first = members[0]
        other = next((r for r in members if real_node_of_rank[r] != real_node_of_rank[first]),
                     None)
        if other is not None:
            raise SettingError(
                f"{VIRTUAL_NODES_ENV}={nodes}: virtual node {ordered[node]} would hold rank "
                f"{first} on {facts[first][0]} and rank {other} on {facts[other][0]}, two "
                "real nodes; choose K so that every block of consecutive ranks stays on "
                "one host", setting=VIRTUAL_NODES_ENV, value=nodes)
    return node_of_rank
