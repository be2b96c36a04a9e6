"""NVLink domains across hosts, tested as what can be tested without such a system: NVML's
fabric answers parsed from fixtures (as pynvml returns them on a GB200 NVL72 tray, on an
H100 / H200 node and mid-registration), ranks grouped by clique, the doctor's findings,
and the cause and fix a failed fabric import gets."""

from __future__ import annotations

import pytest

from ipcshare.backends.fabric_import import fabric_import_hint
from ipcshare.doctor.fabric import (
    describe_fabric_domains,
    fabric_domain_findings,
    fabric_domains,
    parse_fabric_info,
)

CLUSTER = bytes.fromhex("6d1f4e0a9b2c4e3f8a7b6c5d4e3f2a1b")
# nvmlGpuFabricInfo_t fields as pynvml names them.
NVL72_GPU = {"clusterUuid": CLUSTER, "status": 0, "cliqueId": 3, "state": 3}
HOPPER_GPU = {"clusterUuid": bytes(16), "status": 0, "cliqueId": 0, "state": 0}
REGISTERING_GPU = {"clusterUuid": CLUSTER, "status": 0, "cliqueId": 3, "state": 2}
FAILED_GPU = {"clusterUuid": CLUSTER, "status": 999, "cliqueId": 3, "state": 3}


def test_a_registered_gpu_is_in_its_cluster_and_clique():
    facts = parse_fabric_info(NVL72_GPU)
    assert facts == {"state": "completed", "status": 0,
                     "cluster_uuid": "6d1f4e0a-9b2c-4e3f-8a7b-6c5d4e3f2a1b", "clique": 3,
                     "in_domain": True}


@pytest.mark.parametrize("raw,state", [(HOPPER_GPU, "not-supported"),
                                       (REGISTERING_GPU, "in-progress"),
                                       (FAILED_GPU, "completed"),
                                       ({"state": 7}, "unknown (7)")])
def test_gpus_outside_a_domain_are_not_in_one(raw, state):
    facts = parse_fabric_info(raw)
    assert facts["state"] == state and facts["in_domain"] is False


def _rank(host, fabric, channels=("channel0",)):
    return {"host": host, "fabric": parse_fabric_info(fabric),
            "imex_channels": list(channels)}


def test_ranks_group_by_clique_across_hosts_not_by_host():
    ranks = {0: _rank("tray1", NVL72_GPU), 1: _rank("tray1", NVL72_GPU),
             2: _rank("tray2", NVL72_GPU), 3: _rank("tray2", {**NVL72_GPU, "cliqueId": 4}),
             4: _rank("h200", HOPPER_GPU), 5: _rank("tray3", NVL72_GPU, channels=())}
    domain = "6d1f4e0a-9b2c-4e3f-8a7b-6c5d4e3f2a1b"
    assert fabric_domains(ranks) == {f"{domain}/3": [0, 1, 2], f"{domain}/4": [3],
                                     "host:h200": [4], "host:tray3": [5]}
    line = describe_fabric_domains(ranks)
    assert f"ranks 0-2 on 2 host(s) share NVLink domain {domain}/3" in line
    assert "rank 4 on h200: no NVLink domain across hosts" in line


def test_the_doctor_names_gpus_that_cannot_take_part_yet():
    ranks = {0: _rank("tray1", NVL72_GPU), 1: _rank("tray1", REGISTERING_GPU),
             2: _rank("tray2", FAILED_GPU), 3: _rank("tray2", NVL72_GPU, channels=()),
             4: _rank("h200", HOPPER_GPU, channels=())}
    found = fabric_domain_findings(ranks)
    assert [problem.split("'")[0] for _s, problem, _f in found] == ["rank 1", "rank 2",
                                                                   "rank 3"]
    assert "fabric state in-progress" in found[0][1] and "nvidia-fabricmanager" in found[0][2]
    assert "NVML status 999" in found[1][1]
    assert "sees no IMEX channel" in found[2][1] and "channel0" in found[2][2]


@pytest.mark.parametrize("error,cause,fix", [
    ("CUDA_ERROR_NOT_PERMITTED", "no IMEX channel", "run nvidia-imex"),
    ("CUDA_ERROR_INVALID_HANDLE", "not in this GPU's NVLink domain", "one NVLink domain"),
    ("CUDA_ERROR_NOT_SUPPORTED", "no fabric handles", "--inter nccl"),
    ("CUDA_ERROR_UNKNOWN", "refused the fabric handle", "ipcshare doctor"),
])
def test_a_failed_fabric_import_gets_a_cause_and_a_fix(error, cause, fix):
    hint = fabric_import_hint(error, exporter="GPU GPU-1234", same_host=False)
    assert hint.startswith("importing the fabric handle of GPU GPU-1234 (another host) "
                           "failed: ")
    head, _, tail = hint.partition("; fix: ")
    assert cause in head and fix in tail
