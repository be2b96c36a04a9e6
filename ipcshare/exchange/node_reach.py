"""What the ranks of one node share, and so which descriptor paths can join them.

Containers per rank (one Kubernetes pod or Docker container per GPU) give each rank its
own PID namespace, sometimes its own network and mount namespaces, rarely another user.
Each of those closes one path:

- different PID namespaces: a peer's pid means another process here (or none), so
  ``pidfd_getfd`` cannot reach it and SO_PEERCRED cannot confirm it by pid. Sockets still
  work: peers are then authenticated by uid plus a MAC keyed with the job's secret,
  which only ranks of this job received (over MPI).
- a socket directory that some rank cannot see (another mount namespace, no shared
  /tmp): abstract sockets instead, which need one network namespace.
- different users: nothing passes descriptors between them (SO_PEERCRED refuses other
  uids by design, pidfd_getfd needs ptrace rights over the peer).

Every rank of the node gathers the same facts, so every rank reaches the same verdict
at once, with the same cause and fix as ``ipcshare doctor``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

from ..topology.world import format_ranks

__all__ = ["ProcessIdentity", "grouped_by", "layout", "unreachable_users",
           "no_shared_socket_place", "PID_NAMESPACE_FIX"]

PID_NAMESPACE_FIX = ("run every rank of a node in one PID namespace to use pidfd_getfd: one "
                     "container per node, docker --pid=host / --pid=container:<first>, or "
                     "one Kubernetes pod with shareProcessNamespace: true")


def _namespace(kind: str) -> str | None:
    try:
        return os.readlink(f"/proc/self/ns/{kind}")
    except OSError:
        return None


@dataclasses.dataclass(frozen=True)
class ProcessIdentity:
    """The facts of one rank's process that decide how descriptors can reach it."""

    uid: int
    pid_namespace: str | None
    net_namespace: str | None

    @classmethod
    def of_this_process(cls) -> ProcessIdentity:
        return cls(uid=os.getuid(), pid_namespace=_namespace("pid"),
                   net_namespace=_namespace("net"))


def grouped_by(values: Sequence[object], ranks: Sequence[int]) -> dict[object, list[int]]:
    """``{value: [world ranks holding it]}`` in the order values first appear."""
    groups: dict[object, list[int]] = {}
    for value, rank in zip(values, ranks, strict=True):
        groups.setdefault(value, []).append(rank)
    return groups


def layout(groups: dict[object, list[int]], what: str) -> str:
    """``'ranks 0-1 in pid:[4026531836]; rank 2 in pid:[4026532301]'``."""
    return "; ".join(f"{format_ranks(ranks)} {what} {value}" for value, ranks in groups.items())


def unreachable_users(identities: Sequence[ProcessIdentity],
                      ranks: Sequence[int]) -> str | None:
    """Cause and fix when the node's ranks run as different users, else None."""
    users = grouped_by([identity.uid for identity in identities], ranks)
    if len(users) < 2:
        return None
    return (f"ranks of this node run as different users ({layout(users, 'as uid')}): no "
            "descriptor can pass between users (SO_PEERCRED refuses other uids, pidfd_getfd "
            "needs ptrace rights over the peer); fix: run every rank of the node as one user "
            "(same runAsUser in every pod)")


def no_shared_socket_place(identities: Sequence[ProcessIdentity], ranks: Sequence[int],
                           blind: Sequence[int], directory: str | None) -> str | None:
    """Cause and fix when neither the socket directory nor abstract sockets join the
    node's ranks, else None. ``blind`` are the ranks that cannot see ``directory``."""
    nets = grouped_by([identity.net_namespace for identity in identities], ranks)
    if not blind or len(nets) < 2:
        return None
    where = directory or "the socket directory"
    return (f"{format_ranks(blind)} cannot see {where} (another mount namespace) and the "
            f"node's ranks are in different network namespaces ({layout(nets, 'in')}), so "
            "abstract unix sockets do not join them either; fix: mount one directory into "
            "every rank's container and set IPCSHARE_SOCKET_DIR to it, or share the network "
            "namespace (docker --network=container:<first>, or one Kubernetes pod)")
