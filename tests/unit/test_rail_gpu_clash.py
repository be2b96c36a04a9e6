"""Rails whose ranks share a GPU: NCCL refuses them, so --inter auto must not pick it and
--inter nccl must say why (ipcshare.collectives.across_nodes.choice.rail_gpu_clash)."""

from __future__ import annotations

from ipcshare.collectives.across_nodes.choice import rail_gpu_clash


def test_two_virtual_nodes_on_one_gpu_clash_on_rail_zero():
    places = [(0, "vm", "GPU-0d52a412-66d3"), (0, "vm", "GPU-0d52a412-66d3")]
    assert rail_gpu_clash(places) == "ranks 0 and 1 of rail 0 both use GPU 0d52a412 on vm"


def test_rails_with_their_own_gpus_do_not_clash():
    # 2 x 2 virtual nodes on 2 GPUs: rail 0 = ranks 0, 2 (GPU a, b), rail 1 = ranks 1, 3.
    places = [(0, "vm", "GPU-a"), (1, "vm", "GPU-b"), (0, "vm", "GPU-b"), (1, "vm", "GPU-a")]
    assert rail_gpu_clash(places) is None


def test_the_same_uuid_on_two_hosts_or_rails_is_not_a_clash():
    assert rail_gpu_clash([(0, "a", "GPU-x"), (0, "b", "GPU-x")]) is None
    assert rail_gpu_clash([(0, "a", "GPU-x"), (1, "a", "GPU-x")]) is None


def test_host_memory_has_no_gpu_to_clash_on():
    assert rail_gpu_clash([(0, "vm", None), (0, "vm", None)]) is None


def test_the_first_clash_names_both_ranks_and_the_rail():
    places = [(0, "h", "GPU-a"), (1, "h", "GPU-b"), (0, "h", "GPU-c"), (1, "h", "GPU-b")]
    assert rail_gpu_clash(places) == "ranks 1 and 3 of rail 1 both use GPU b on h"
