"""The verdicts on what joins a node's ranks (different users cannot be set up as a real
job here: MPICH itself does not start across users on one node, it hangs in MPI_Init)."""

from __future__ import annotations

from ipcshare.exchange.node_reach import (
    ProcessIdentity,
    no_shared_socket_place,
    unreachable_users,
)

ROOT_NET = ProcessIdentity(uid=0, pid_namespace="pid:[1]", net_namespace="net:[7]")


def test_one_user_is_reachable_and_two_are_named_with_the_fix():
    assert unreachable_users([ROOT_NET, ROOT_NET], [0, 1]) is None
    other = ProcessIdentity(uid=1000, pid_namespace="pid:[2]", net_namespace="net:[7]")
    verdict = unreachable_users([ROOT_NET, other, other], [4, 5, 6])
    assert verdict.startswith("ranks of this node run as different users (rank 4 as uid 0; "
                              "ranks 5-6 as uid 1000)")
    assert "fix: run every rank of the node as one user" in verdict


def test_abstract_sockets_rescue_a_blind_rank_only_in_one_network_namespace():
    blind = ProcessIdentity(uid=0, pid_namespace="pid:[2]", net_namespace="net:[7]")
    assert no_shared_socket_place([ROOT_NET, blind], [0, 1], [1], "/tmp/x") is None
    assert no_shared_socket_place([ROOT_NET, ROOT_NET], [0, 1], [], "/tmp/x") is None
    isolated = ProcessIdentity(uid=0, pid_namespace="pid:[2]", net_namespace="net:[9]")
    verdict = no_shared_socket_place([ROOT_NET, isolated], [0, 1], [1], "/tmp/x")
    assert verdict.startswith("rank 1 cannot see /tmp/x (another mount namespace) and the "
                              "node's ranks are in different network namespaces (rank 0 in "
                              "net:[7]; rank 1 in net:[9])")
    assert "IPCSHARE_SOCKET_DIR" in verdict
