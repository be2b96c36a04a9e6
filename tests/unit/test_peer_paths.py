"""Path planning for pairs of GPUs without peer access (no GPU needed): direct pairs,
relays through the lowest-numbered rank that reaches both ends, host staging where no
relay exists or where it is asked for, and the options that choose between them."""

from __future__ import annotations

import pytest

from ipcshare.runtime.errors import ConfigError
from ipcshare.topology.peer_paths import (
    DEFAULT_CHUNK_BYTES,
    all_direct,
    chunk_bytes_choice,
    fallback_choice,
    plan_paths,
)


def _plan(count: int, disabled: set[frozenset[int]], *, fallback: str = "auto",
          ranks: list[int] | None = None):
    """A node of ``count`` ranks on ``count`` GPUs, the ``disabled`` pairs (by position)
    without peer access, as IPCSHARE_DISABLE_P2P makes them."""
    reach = [[frozenset((i, j)) not in disabled for j in range(count)] for i in range(count)]
    reasons = [["" if reach[i][j] else "disabled by IPCSHARE_DISABLE_P2P"
                for j in range(count)] for i in range(count)]
    return plan_paths(ranks or list(range(count)), [f"cuda:{i}" for i in range(count)],
                      reach, reasons, fallback=fallback)


def test_every_pair_with_peer_access_is_direct():
    plan = _plan(4, set())
    assert not plan.has_fallbacks
    assert plan.matrix() == [["self" if i == j else "direct" for j in range(4)]
                             for i in range(4)]
    assert plan.direct_peers(2) == [0, 1, 3] and plan.indirect_peers(2) == []
    assert plan.most_relayed() == 0 and plan.most_host_staged() == 0


def test_one_disabled_pair_relays_through_the_lowest_rank_reaching_both():
    plan = _plan(4, {frozenset((2, 3))})
    path = plan.path(2, 3)
    assert (path.kind, path.relay) == ("relay", 0)
    assert plan.path(3, 2) == path  # the same answer from both ends
    assert "cuda:2 and cuda:3 have no peer access: disabled by IPCSHARE_DISABLE_P2P" \
        in path.reason
    assert plan.relayed_by(0) == [(2, 3), (3, 2)] and plan.relayed_by(1) == []
    assert plan.most_relayed() == 2
    assert plan.describe(2, 3) == "relay through rank 0 (cuda:0)"
    assert plan.indirect_peers(3) == [2] and plan.direct_peers(3) == [0, 1]


def test_crossed_pairs_on_four_gpus_each_get_their_own_relay():
    plan = _plan(4, {frozenset((0, 2)), frozenset((1, 3))})
    assert plan.path(0, 2).relay == 1 and plan.path(1, 3).relay == 0
    assert plan.matrix()[0] == ["self", "direct", "relay", "direct"]


def test_relays_are_world_ranks_of_the_node():
    plan = _plan(3, {frozenset((0, 1))}, ranks=[4, 5, 6])
    assert plan.path(4, 5).relay == 6 and plan.label(6) == "cuda:2"


def test_without_a_third_gpu_reaching_both_the_pair_stages_through_host_memory():
    two = _plan(2, {frozenset((0, 1))})
    assert two.kind(0, 1) == "host-staged" and two.path(0, 1).relay is None
    # Three GPUs, but the only candidate relay has no peer access to one end either.
    three = _plan(3, {frozenset((0, 1)), frozenset((1, 2))})
    assert three.kind(0, 1) == "host-staged" and three.kind(1, 2) == "host-staged"
    assert three.kind(0, 2) == "direct"
    assert three.host_staged_peers(1) == [0, 2] and three.most_host_staged() == 2


def test_host_staging_can_be_forced_where_a_relay_exists():
    plan = _plan(4, {frozenset((2, 3))}, fallback="host")
    assert plan.kind(2, 3) == "host-staged" and plan.most_relayed() == 0


def test_a_forced_relay_that_cannot_exist_names_the_pair():
    with pytest.raises(ConfigError, match=r"IPCSHARE_P2P_FALLBACK=relay: no rank of the node "
                                          r"reaches both rank 0 \(cuda:0\) and rank 1 "
                                          r"\(cuda:1\).*use auto or host"):
        _plan(2, {frozenset((0, 1))}, fallback="relay")
    assert _plan(3, {frozenset((0, 1))}, fallback="relay").kind(0, 1) == "relay"


def test_one_way_peer_access_is_not_direct():
    reach = [[True, False], [True, True]]
    reasons = [["", "cuDeviceCanAccessPeer -> 0"], ["", ""]]
    plan = plan_paths([0, 1], ["cuda:0", "cuda:1"], reach, reasons)
    assert plan.kind(0, 1) == "host-staged"
    assert "cuDeviceCanAccessPeer -> 0" in plan.path(0, 1).reason


def test_a_pair_disabled_by_the_setting_says_so_as_a_flag():
    reach = [[True, False, True], [False, True, True], [True, True, True]]
    reasons = [["", "disabled by IPCSHARE_DISABLE_P2P", ""],
               ["disabled by IPCSHARE_DISABLE_P2P", "", ""], ["", "", ""]]
    disabled = [[False, True, False], [True, False, False], [False, False, False]]
    plan = plan_paths([0, 1, 2], ["cuda:0", "cuda:1", "cuda:2"], reach, reasons,
                      disabled=disabled)
    assert plan.kind(0, 1) == "relay" and plan.path(0, 1).disabled_by_setting is True
    undisabled = plan_paths([0, 1, 2], ["cuda:0", "cuda:1", "cuda:2"], reach, reasons)
    # the reason's words count for nothing: only the flag says "on purpose"
    assert undisabled.path(0, 1).disabled_by_setting is False


def test_two_ranks_sharing_one_gpu_are_direct():
    plan = all_direct([0, 1], ["cuda:0", "cuda:0"])
    assert plan.kind(0, 1) == "direct" and plan.kind(1, 1) == "self"


@pytest.mark.parametrize("text, expected", [(None, "auto"), ("", "auto"), (" HOST ", "host"),
                                            ("relay", "relay"), ("auto", "auto")])
def test_fallback_choices(text, expected):
    assert fallback_choice(text) == expected


@pytest.mark.parametrize("text", ["staged", "0", "relay,host", "direct"])
def test_a_malformed_fallback_is_refused_naming_the_choices(text):
    with pytest.raises(ConfigError, match=r"IPCSHARE_P2P_FALLBACK=.* choose one of: auto, "
                                          r"relay, host"):
        fallback_choice(text)
    with pytest.raises(ConfigError):
        _plan(2, set(), fallback=text)


def test_chunk_sizes_take_suffixes_and_refuse_nonsense():
    assert chunk_bytes_choice(None) == chunk_bytes_choice("") == DEFAULT_CHUNK_BYTES
    assert chunk_bytes_choice("64K") == 65536 and chunk_bytes_choice(4097) == 4097
    for bad in ("0", "-4K", "lots"):
        with pytest.raises(ConfigError, match="IPCSHARE_P2P_CHUNK"):
            chunk_bytes_choice(bad)


def test_facts_of_the_wrong_shape_are_a_bug():
    with pytest.raises(ValueError):
        plan_paths([0, 1], ["cuda:0"], [[True, True], [True, True]], [["", ""], ["", ""]])
