"""--algo auto for all-gather: the measured table's picks and their edges."""

import pytest

from ipcshare.patterns.choice import (
    ALLGATHER_CHOICES,
    GRAPH_ALLGATHER_CHOICES,
    IN_PLACE_ALLGATHER_CHOICES,
    choose_allgather,
)
from ipcshare.runtime.config import ALGOS


@pytest.mark.parametrize("table", [ALLGATHER_CHOICES, IN_PLACE_ALLGATHER_CHOICES,
                                   GRAPH_ALLGATHER_CHOICES])
def test_every_row_is_ordered_and_names_real_algorithms(table):
    assert set(table) == {2, 4}
    for world_size, row in table.items():
        assert row.world_size == world_size
        assert list(row.limits) == sorted(set(row.limits))
        assert len(row.algos) == len(row.limits) + 1
        assert set(row.algos) <= set(ALGOS) - {"auto"}


@pytest.mark.parametrize("world_size", sorted(ALLGATHER_CHOICES))
def test_limits_are_inclusive(world_size):
    row = ALLGATHER_CHOICES[world_size]
    for index, limit in enumerate(row.limits):
        assert choose_allgather(limit, world_size) == row.algos[index]
        assert choose_allgather(limit + 1, world_size) == row.algos[index + 1]


def test_world_sizes_without_a_row():
    assert choose_allgather(1024, 1) == "copy-engine"       # nothing to gather from
    assert choose_allgather(1024, 16) == "copy-engine"      # kernels name at most 8 ranks
    # 3 ranks use the 2-rank row, 8 the 4-rank row (the nearest measured world at or below).
    assert choose_allgather(1024, 3) == ALLGATHER_CHOICES[2].pick(1024)
    assert choose_allgather(1024, 8) == ALLGATHER_CHOICES[4].pick(1024)
    assert choose_allgather(1 << 30, 4) == "copy-engine"    # bandwidth: the copy engine


@pytest.mark.parametrize("size", [(512 << 10) + 1, 64 << 20, (64 << 20) + 1, 1 << 30])
@pytest.mark.parametrize("world_size", [4, 8])
def test_graphs_of_four_or_more_ranks_push_at_every_size_above_ll(size, world_size):
    # Eager, the copy engine takes the large sizes; captured in a graph it loses its
    # concurrency, so the graph row keeps the kernel.
    assert choose_allgather(size, world_size, graph=True) == "push"
    assert choose_allgather(1 << 30, world_size) == "copy-engine"


def test_graphs_of_two_ranks_follow_the_eager_row():
    for size in (1, 16 << 20, (16 << 20) + 1, 1 << 30):
        assert choose_allgather(size, 2, graph=True) == choose_allgather(size, 2)


@pytest.mark.parametrize("world_size", [4, 8])
def test_four_or_more_ranks_push_up_to_128_mib_out_of_place(world_size):
    # Back to back the two tie at 128 MiB; after a kernel push is ahead (choice.py).
    assert choose_allgather(128 << 20, world_size) == "push"
    assert choose_allgather((128 << 20) + 1, world_size) == "copy-engine"


@pytest.mark.parametrize("size", [(512 << 10) + 1, 128 << 20, 256 << 20, 1 << 30])
@pytest.mark.parametrize("world_size", [4, 8])
def test_four_or_more_ranks_push_in_place_at_every_size_above_ll(size, world_size):
    # In place after a kernel the 4-GPU copy engine loses about 40%; push does not.
    assert choose_allgather(size, world_size, in_place=True) == "push"


@pytest.mark.parametrize("world_size", [2, 3])
def test_two_and_three_ranks_push_in_place_up_to_32_mib(world_size):
    # Out of place the copy engine takes over above 16 MiB; in place push keeps 32 MiB,
    # where it is ahead back to back and after a kernel (choice.py).
    assert choose_allgather(32 << 20, world_size) == "copy-engine"
    assert choose_allgather(32 << 20, world_size, in_place=True) == "push"
    assert choose_allgather((32 << 20) + 1, world_size, in_place=True) == "copy-engine"
    assert choose_allgather(1 << 30, world_size, in_place=True) == "copy-engine"


@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("graph", [False, True])
def test_two_ranks_take_the_low_latency_protocol_up_to_2_mib(graph, in_place):
    for size in (1, 64 << 10, 2 << 20):
        assert choose_allgather(size, 2, graph=graph, in_place=in_place) == "ll"
    assert choose_allgather((2 << 20) + 1, 2, graph=graph, in_place=in_place) == "push"
    # 4 ranks (measured on 4 GPUs): ll up to 512 KiB gathered, then push.
    assert choose_allgather(512 << 10, 4, graph=graph, in_place=in_place) == "ll"
    assert choose_allgather((512 << 10) + 1, 4, graph=graph, in_place=in_place) == "push"


def test_every_registered_algorithm_is_an_option():
    """--algo accepts every name the collectives' registry has, on every memory and op:
    an algorithm missing from the option list is refused before it can run."""
    from ipcshare.collectives.algorithms import _REGISTRY

    registered = {name for names in _REGISTRY.values() for name in names}
    assert registered <= set(ALGOS) - {"auto"}, sorted(registered - set(ALGOS))
