"""How errors name ranks and their values: rank ranges, disagreements, the fail-together
suffix (no MPI: a stand-in communicator answers the all-gather)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ipcshare.cli.main import build_parser
from ipcshare.cli.run_pattern import _run_facts, check_same_run, resolve_options
from ipcshare.doctor.paths import translate_ranks
from ipcshare.liveness.consensus import agree, failure_suffix
from ipcshare.runtime.errors import (
    BackendError,
    CollectiveFailure,
    ConfigError,
    ErrorFacts,
    WindowError,
)
from ipcshare.topology.world import World, describe_disagreement, format_ranks, parse_ranks
from ipcshare.window.group import (
    _check_same_arguments,
    _check_same_backend,
    _check_same_p2p_choices,
)
from ipcshare.window.window import _spell_nbytes


@pytest.mark.parametrize(("ranks", "text"), [
    ([3], "rank 3"), ([0, 1], "ranks 0-1"), ([0, 2, 3], "ranks 0, 2-3"),
    ([5, 0, 1, 2, 7, 6], "ranks 0-2, 5-7"), ([1, 3, 5], "ranks 1, 3, 5"),
])
def test_rank_lists_are_compressed_into_ranges(ranks, text):
    assert format_ranks(ranks) == text
    assert parse_ranks(text) == sorted(ranks)


@given(st.sets(st.integers(0, 300), min_size=1))
def test_rank_ranges_read_back(ranks):
    assert parse_ranks(format_ranks(ranks)) == sorted(ranks)


def test_a_text_that_is_no_rank_list_is_refused():
    with pytest.raises(ValueError, match="not a list of ranks"):
        parse_ranks("ranks per node")


def test_disagreements_group_the_ranks_of_each_value():
    assert describe_disagreement(["2", "2", "2", "3"], spell=repr) == (
        "ranks 0-2 have '2', rank 3 '3'")
    assert describe_disagreement(["-b 1M", "-b 2M", "-b 1M"], verb=("asks for", "ask for"),
                                 then="for") == "ranks 0, 2 ask for -b 1M, rank 1 for -b 2M"
    # Values that do not hash (a bad argument) still get named; ranks may be given.
    assert describe_disagreement([[1], [2]]) == "rank 0 has [1], rank 1 [2]"
    assert describe_disagreement(["a", "b", "a"], ranks=[4, 6, 7]) == "ranks 4, 7 have a, rank 6 b"


def test_the_suffix_names_the_ranks_that_reported_the_failure():
    assert failure_suffix([2]) == ""
    assert failure_suffix([0, 1]) == " (reported by ranks 0-1)"
    assert failure_suffix([0, 2, 3]) == " (reported by ranks 0, 2-3)"


class _Gathered:
    """A communicator whose all-gather hands back the given statuses (this rank's
    own is put in its place)."""

    def __init__(self, statuses):
        self.statuses = statuses

    def allgather(self, mine):
        tag, (rank, status) = mine   # every rank in the same step
        return [(tag, (r, status if r == rank else s)) for r, s in enumerate(self.statuses)]


def _world(rank: int, size: int) -> World:
    return World(comm=None, local_comm=None, rank=rank, size=size, local_rank=rank,
                 local_size=size, node_index=0, node_count=1, hostname="h",
                 hostnames=["h"] * size, pids=list(range(size)), node_of_rank=[0] * size,
                 local_ranks=list(range(size)))


def test_agree_names_every_rank_that_failed_not_a_count():
    failed = ("BackendError", "cuMemMap -> CUDA_ERROR_X", ErrorFacts(cuda_error="CUDA_ERROR_X"),
              False)
    comm = _Gathered([None, failed, None, failed, failed])
    with pytest.raises(BackendError) as caught:
        agree(_world(0, 5), "import", None, comm=comm)
    assert str(caught.value) == ("import failed on rank 1@h: cuMemMap -> CUDA_ERROR_X "
                                 "(reported by ranks 1, 3-4)")
    assert "more rank" not in str(caught.value)


def test_agree_on_one_failing_rank_has_no_suffix():
    comm = _Gathered([None, ("WindowError", "bad", ErrorFacts(), False)])
    with pytest.raises(WindowError, match=r"^step failed on rank 1@h: bad$"):
        agree(_world(0, 2), "step", None, comm=comm)


def test_agree_carries_the_failure_as_typed_facts():
    failed = ("BackendError", "cuMemMap -> CUDA_ERROR_X", ErrorFacts(cuda_error="CUDA_ERROR_X"),
              False)
    comm = _Gathered([None, failed, None, failed])
    with pytest.raises(BackendError) as caught:
        agree(_world(0, 4), "import", None, comm=comm)
    assert caught.value.failure == CollectiveFailure(
        step="import", rank=1, host="h", ranks=(1, 3), facts=ErrorFacts(cuda_error="CUDA_ERROR_X"))


def test_an_agreed_error_of_an_inner_step_is_not_wrapped_twice():
    inner = ConfigError("checking the socket directory failed on rank 0@h: no such "
                        "directory (reported by ranks 0-1)")
    inner.failure = CollectiveFailure(step="checking the socket directory", rank=0, host="h",
                                      ranks=(0, 1), facts=ErrorFacts())
    agreed = ("ConfigError", str(inner), ErrorFacts(), True)
    with pytest.raises(ConfigError) as caught:
        agree(_world(1, 2), "descriptor exchange", inner, comm=_Gathered([agreed, agreed]))
    assert caught.value is inner  # every rank raised it: the message stays as it was
    # Where some rank failed otherwise, the outer step names the first as usual.
    other = ("BackendError", "bad", ErrorFacts(), False)
    with pytest.raises(BackendError, match=r"^descriptor exchange failed on rank 0@h: bad "):
        agree(_world(1, 2), "descriptor exchange", inner, comm=_Gathered([other, agreed]))
    # So also where the ranks' agreed errors differ (steps agreed per node).
    elsewhere = ("ConfigError", "node step failed on rank 0@h: other cause", ErrorFacts(),
                 True)
    with pytest.raises(ConfigError, match=r"^descriptor exchange failed on rank 0@h: node "):
        agree(_world(1, 2), "descriptor exchange", inner, comm=_Gathered([elsewhere, agreed]))


def test_the_failing_rank_sends_the_facts_of_its_own_error():
    error = BackendError("allocate: out of descriptors")
    error.__cause__ = OSError(24, "Too many open files")  # as `raise ... from exc` sets it
    with pytest.raises(BackendError) as caught:
        agree(_world(1, 2), "allocate", error, comm=_Gathered([None, None]))
    assert caught.value.failure.rank == 1 and caught.value.failure.facts.errno == "EMFILE"


def test_window_sizes_are_named_as_the_nbytes_each_rank_passed():
    assert _spell_nbytes(2 << 20) == "nbytes=2097152 (2M)"
    assert _spell_nbytes(1000) == "nbytes=1000"
    assert _spell_nbytes(4.5) == "nbytes=4.5"


def test_group_arguments_must_match_and_the_message_names_them():
    same = {"backend": "auto", "exchange": "auto", "handle": "posix-fd"}
    _check_same_arguments([same, dict(same, backend="host")])  # backends may differ
    with pytest.raises(ConfigError, match=r"^ranks disagree on the exchange: rank 0 passes "
                       r"exchange='socket', ranks 1-2 exchange='auto'$"):
        _check_same_arguments([dict(same, exchange="socket"), same, same])


def test_different_backends_name_the_argument_before_the_choice():
    _check_same_backend([("auto", "host"), ("host", "host")])
    with pytest.raises(ConfigError, match=r"^ranks chose different backends: rank 0 passes "
                       r"backend='auto', which chose 'host', rank 1 backend='auto', which "
                       r"chose 'cuda-vmm' \(a GPU missing on one node\?\)$"):
        _check_same_backend([("auto", "host"), ("auto", "cuda-vmm")])
    with pytest.raises(ConfigError, match=r"passes backend='host', rank 1 backend='cuda-vmm'$"):
        _check_same_backend([("host", "host"), ("cuda-vmm", "cuda-vmm")])


def _facts(argv: list[str]):
    args = build_parser().parse_args(argv)
    return _run_facts(args, resolve_options(args))


def test_ranks_asking_for_other_sizes_are_named_with_the_flags_they_gave():
    with pytest.raises(ConfigError, match=r"^ranks disagree on the sizes to run: rank 0 asks "
                       r"for -b 1M -e 1M, rank 1 for -b 2M -e 2M$"):
        check_same_run([_facts(["ring", "-b", "1M", "-e", "1M"]),
                        _facts(["ring", "-b", "2M", "-e", "2M"])])


def test_sizes_spelled_differently_but_alike_agree():
    check_same_run([_facts(["ring", "-b", "1M", "-e", "1M", "-f", "2"]),
                    _facts(["ring", "-b", "1024K", "-e", "1M", "-f", "4"])])


def test_every_difference_is_named_with_the_sweep_factor_where_it_counts():
    with pytest.raises(ConfigError) as caught:
        check_same_run([_facts(["ring", "-b", "1K", "-e", "4K", "-n", "5"]),
                        _facts(["allgather", "-b", "1K", "-e", "4K", "-f", "4", "-n", "5"]),
                        _facts(["allgather", "-b", "1K", "-e", "4K", "-f", "4", "--graph"])])
    assert str(caught.value) == (
        "ranks disagree on the operation, the sizes to run, the iterations and graph mode: "
        "rank 0 asks for ring -b 1K -e 4K -f 2 -n 5 no --graph, "
        "rank 1 for allgather -b 1K -e 4K -f 4 -n 5 no --graph, "
        "rank 2 for allgather -b 1K -e 4K -f 4 -n 20 --graph")


def test_sizes_from_a_config_are_spelled_as_sizes(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("min_bytes: 2097152\nmax_bytes: 2M\n")
    with pytest.raises(ConfigError, match=r"rank 0 asks for -b 1M -e 1M, rank 1 for -b 2M -e 2M"):
        check_same_run([_facts(["ring"]), _facts(["ring", "--config", str(config)])])


def test_the_doctor_translates_rank_lists_to_the_job_s_ranks():
    text = ("import failed on rank 1@n3: X (reported by ranks 0-1); ranks 0-1 pass "
            "nbytes=1, rank 2 nbytes=2; local rank 1 refused")
    assert translate_ranks(text, [4, 6, 7]) == (
        "import failed on rank 6@n3: X (reported by ranks 4, 6); ranks 4, 6 pass nbytes=1, "
        "rank 7 nbytes=2; local rank 1 refused")


def test_p2p_choices_of_a_node_name_the_world_ranks_and_what_they_set():
    _check_same_p2p_choices([("relay", ""), ("relay", "")], [4, 5])
    with pytest.raises(ConfigError, match=r"^ranks of a node disagree on p2p_fallback \(the "
                       r"argument, else IPCSHARE_P2P_FALLBACK\): ranks 4, 6 have nothing, "
                       r"rank 5 'relay'$"):
        _check_same_p2p_choices([("", ""), ("relay", ""), ("", "")], [4, 5, 6])
    with pytest.raises(ConfigError, match=r"disagree on p2p_chunk .*IPCSHARE_P2P_CHUNK\): "
                       r"rank 0 has '1M', rank 1 '2M'$"):
        _check_same_p2p_choices([("", "1M"), ("", "2M")], [0, 1])


def test_ranks_in_different_steps_are_named_not_matched():
    # One rank's "window rendezvous" met another's "group barrier": before, their
    # payloads were read as each other's (EOFError, "nbytes=(0, None)").
    from ipcshare.liveness.consensus import check_same_step
    from ipcshare.runtime.errors import WindowError

    close = ("collective", "closing a window")
    check_same_step([close] * 3, [0, 1, 2])
    with pytest.raises(WindowError) as caught:
        check_same_step([("collective", "window rendezvous"), ("collective", "group barrier"),
                         ("collective", "window rendezvous")], [0, 1, 2])
    assert str(caught.value) == (
        "ranks are in different collective steps: ranks 0, 2 are in 'window rendezvous', "
        "rank 1 in 'group barrier': every rank must make the group's collective calls "
        "(window, communicator, register, barrier, close) in the same order")
    # a fail-together step and a plain collective of the same name are different steps
    with pytest.raises(WindowError, match="different collective steps"):
        check_same_step([("step", "peer access"), ("collective", "peer access")], [0, 1])
