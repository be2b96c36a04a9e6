"""Where ranks run against where their GPUs sit (read from fake sysfs trees), the rule that
flags ranks far from their GPU, and the driver / CUDA / GPU-model comparison between nodes."""

from __future__ import annotations

import pytest

from ipcshare.doctor import affinity, cluster, consistency, rules

from .test_doctor_parts import rank_result
from .test_doctor_rules import node, rank_facts


def two_socket_machine(root, *, gpu_node="1", gpu_cpus="8-15"):
    """Two NUMA nodes of 8 CPUs; the GPU 0000:1b:00.0 on ``gpu_node``."""
    for index, cpus in enumerate(("0-7", "8-15")):
        folder = root / "sys" / "devices" / "system" / "node" / f"node{index}"
        folder.mkdir(parents=True)
        (folder / "cpulist").write_text(cpus + "\n")
    (root / "sys" / "devices" / "system" / "node" / "online").write_text("0-1\n")
    device = root / "sys" / "bus" / "pci" / "devices" / "0000:1b:00.0"
    device.mkdir(parents=True)
    (device / "numa_node").write_text(gpu_node + "\n")
    if gpu_cpus is not None:
        (device / "local_cpulist").write_text(gpu_cpus + "\n")
    status = root / "proc" / "self"
    status.mkdir(parents=True)
    (status / "status").write_text("Name:\tpython\nMems_allowed_list:\t0-1\nCpus_allowed:\tff\n")
    return root


@pytest.mark.parametrize(("text", "cpus"), [("0-3,8,10-11\n", [0, 1, 2, 3, 8, 10, 11]),
                                            ("5", [5]), ("", [])])
def test_cpulists_parse_and_format_back(text, cpus):
    assert affinity.parse_cpulist(text) == cpus
    assert affinity.format_cpulist(cpus) == text.strip()


def test_pci_addresses_of_cuda_and_nvml_are_spelled_as_sysfs_does():
    assert affinity.normalize_bus_id("0000:1B:00.0") == "0000:1b:00.0"
    assert affinity.normalize_bus_id("00000000:C1:1f.3") == "0000:c1:1f.3"
    with pytest.raises(ValueError):
        affinity.normalize_bus_id("GPU-1234")


def test_a_rank_on_the_other_socket_is_read_as_far_from_its_gpu(tmp_path):
    root = two_socket_machine(tmp_path)
    facts = affinity.collect_affinity("0000:1B:00.0", root=root, cpus={0, 1, 2, 3},
                                      use_nvml=False)
    assert facts == {"cpus": "0-3", "cpu_count": 4, "numa_nodes": 2, "cpu_numa_nodes": [0],
                     "mems_allowed": [0, 1], "gpu_pci": "0000:1b:00.0", "gpu_numa_node": 1,
                     "gpu_local_cpus": "8-15", "cpus_near_gpu": 0, "source": "sysfs"}


def test_a_rank_bound_to_its_gpus_node_is_near(tmp_path):
    root = two_socket_machine(tmp_path, gpu_cpus=None)  # local_cpulist missing: node's CPUs
    facts = affinity.collect_affinity("0000:1b:00.0", root=root, cpus=set(range(8, 16)),
                                      use_nvml=False)
    assert facts["gpu_local_cpus"] == "8-15" and facts["cpus_near_gpu"] == 8
    assert facts["cpu_numa_nodes"] == [1]


def test_a_platform_that_does_not_place_the_gpu_gives_no_numa_node(tmp_path):
    root = two_socket_machine(tmp_path, gpu_node="-1", gpu_cpus=None)
    facts = affinity.collect_affinity("0000:1b:00.0", root=root, cpus={0}, use_nvml=False)
    assert facts["gpu_numa_node"] is None and facts["cpus_near_gpu"] is None
    assert facts["source"] is None


def test_missing_sysfs_is_not_an_error(tmp_path):
    facts = affinity.collect_affinity("0000:1b:00.0", root=tmp_path, cpus={0, 1},
                                      use_nvml=False)
    assert facts["numa_nodes"] == 0 and facts["cpu_numa_nodes"] == []
    assert facts["mems_allowed"] is None and facts["gpu_numa_node"] is None
    assert affinity.collect_affinity("not-an-address", root=tmp_path, cpus={0},
                                     use_nvml=False)["error"].startswith("GPU PCI address")


def test_this_process_has_an_affinity():
    facts = affinity.collect_affinity(None)
    assert facts["cpu_count"] >= 1 and "gpu_pci" not in facts


def placed(rank, cpus, near, *, count=None, gpu_node=1, numa_nodes=2):
    count = count if count is not None else len(affinity.parse_cpulist(cpus))
    return rank_facts(rank, gpu={"count": 2, "bound": rank},
                      affinity={"cpus": cpus, "cpu_count": count, "numa_nodes": numa_nodes,
                                "cpu_numa_nodes": [0], "gpu_pci": f"0000:{rank + 0x1b:02x}:00.0",
                                "gpu_numa_node": gpu_node, "gpu_local_cpus": "8-15",
                                "cpus_near_gpu": near})


def test_a_rank_on_cores_far_from_its_gpu_is_flagged_with_the_binding_fix():
    findings = rules.cpus_far_from_gpu(node(ranks=[placed(0, "8-15", 8), placed(1, "0-3", 0)]))
    assert len(findings) == 1
    (finding,) = findings
    assert finding.severity == "warn" and finding.check == "affinity"
    assert finding.cause.startswith("rank 1 on CPUs 0-3 (NUMA node(s) 0), its GPU cuda:1 "
                                    "(0000:1c:00.0) on NUMA node 1")
    assert "bind-gpu.sh" in finding.fix and "numactl --cpunodebind" in finding.fix


def test_unbound_ranks_are_information_and_bound_ones_say_nothing():
    findings = rules.cpus_far_from_gpu(node(ranks=[placed(0, "0-15", 8), placed(1, "8-15", 8)]))
    assert [(f.severity, f.check) for f in findings] == [("info", "affinity")]
    assert findings[0].cause.startswith("1 rank(s) may run")
    assert "rank 0 on CPUs 0-15" in findings[0].evidence
    # one NUMA node, or a GPU the platform does not place: nothing to say
    assert rules.cpus_far_from_gpu(node(ranks=[placed(0, "0-15", 8, numa_nodes=1)])) == []
    assert rules.cpus_far_from_gpu(node(ranks=[placed(0, "0-3", 0, gpu_node=None)])) == []


def test_the_rule_runs_in_diagnose():
    found = rules.diagnose(node(ranks=[placed(0, "0-3", 0), placed(1, "8-15", 8)]))
    assert [f.check for f in found] == ["affinity"]


def gpu_node(host, *, driver="580.159.04", cuda="13.0", model="NVIDIA H200", ranks=(0, 1)):
    devices = [{"index": 0, "name": model}] if model else []
    return {"host": host, "driver": driver if model else None, "cuda": cuda if model else None,
            "gpu_node": bool(model), "world_ranks": list(ranks),
            "ranks": [{"gpu": {"devices": devices}} for _ in ranks]}


def test_nodes_that_agree_have_no_differences():
    nodes = {f"n{i}": gpu_node(f"n{i}", ranks=(2 * i, 2 * i + 1)) for i in range(3)}
    assert consistency.node_differences(nodes) == []
    cpu_only = {f"n{i}": gpu_node(f"n{i}", model=None) for i in range(2)}
    assert consistency.node_differences(cpu_only) == []


def test_the_node_that_differs_is_named_with_what_the_others_have():
    nodes = {"a": gpu_node("n1", ranks=(0, 1)), "b": gpu_node("n2", ranks=(2, 3)),
             "c": gpu_node("n3", driver="570.86.15", cuda="12.8", ranks=(4, 5)),
             "d": gpu_node("n4", model="NVIDIA H100 80GB HBM3", ranks=(6, 7)),
             "e": gpu_node("n5", model=None, ranks=(8,))}
    assert consistency.node_differences(nodes) == [
        "n3 (ranks 4,5): driver 570.86.15, while 3 other node(s) have 580.159.04",
        "n3 (ranks 4,5): CUDA 12.8, while 3 other node(s) have 13.0",
        "n4 (ranks 6,7): GPU model NVIDIA H100 80GB HBM3, while 3 other node(s) have "
        "NVIDIA H200",
        "n5 (ranks 8): GPU model none, while 3 other node(s) have NVIDIA H200",
    ]


def test_a_tie_between_two_nodes_names_the_second_against_the_first():
    nodes = {"a": gpu_node("n1"), "b": gpu_node("n2", driver="570.86.15", ranks=(2, 3))}
    assert consistency.node_differences(nodes) == [
        "n2 (ranks 2,3): driver 570.86.15, while 1 other node(s) have 580.159.04"]


def test_the_cluster_summary_and_the_document_carry_the_differences():
    from ipcshare.doctor import verdict

    results = [rank_result(0), rank_result(1), rank_result(0, node=1, host="n2"),
               rank_result(1, node=1, host="n2")]
    for result in results:
        env = result["environment"]
        driver = "570.86.15" if env["host"] == "n2" else "580.159.04"
        env["gpu"] = {"count": 1, "driver": driver, "cuda": "13.0", "bound": 0,
                      "devices": [{"index": 0, "name": "NVIDIA H200",
                                   "uuid": "GPU-" + env["host"]}],
                      "bound_uuid": "GPU-" + env["host"]}
    document = verdict.build_document(results, version="9.9", quick=True, mpi_library="MPI",
                                      elapsed_s=1.0)
    expected = "n2 (ranks 2,3): driver 570.86.15, while 1 other node(s) have 580.159.04"
    assert document["differences"] == [expected]
    summary = cluster.render_summary(document)
    assert summary[-2].startswith("  nodes differ") and summary[-1] == f"    {expected}"


def staged_node(gbps, *, access=True, link="nvlink"):
    def gpu(rank):
        return {"count": 2, "bound": rank, "bound_uuid": f"GPU-{rank}",
                "p2p": [{"src": rank, "dst": 1 - rank, "src_uuid": f"GPU-{rank}",
                         "dst_uuid": f"GPU-{1 - rank}", "access": access}]}
    rows = [{"writer": w, "owner": 1 - w, "gbps": gbps if w == 0 else 380.0, "link": link}
            for w in (0, 1)]
    return node(ranks=[rank_facts(0, gpu=gpu(0)), rank_facts(1, gpu=gpu(1))],
                bandwidth={"host": None, "gpu": {"path": "cuda-vmm/pidfd", "rows": rows}})


def test_an_nvlink_pair_at_host_staged_speed_with_p2p_reported_is_flagged():
    (finding,) = rules.host_staged_speed(staged_node(11.5))
    assert finding.severity == "warn" and finding.check == "bandwidth"
    assert "1 GPU pair(s) over NVLink copy at host-staged speed" in finding.cause
    assert "0->1 11.5 GB/s" in finding.cause and "cuCtxEnablePeerAccess" in finding.fix
    assert rules.host_staged_speed(staged_node(250.0)) == []             # direct speed
    assert rules.host_staged_speed(staged_node(11.5, access=False)) == []  # no P2P: expected
    assert rules.host_staged_speed(staged_node(11.5, link="pcie")) == []   # PCIe is that slow
