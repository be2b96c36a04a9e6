"""launch/bind-gpu.sh picks one GPU per local rank from whichever launcher started it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

BIND = Path(__file__).resolve().parents[2] / "launch" / "bind-gpu.sh"
LAUNCHER_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID",
                 "PMIX_LOCAL_RANK", "PALS_LOCAL_RANKID", "CUDA_VISIBLE_DEVICES")


def _visible(env_extra):
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    env.update(env_extra)
    out = subprocess.run(["bash", str(BIND), "bash", "-c", "echo ${CUDA_VISIBLE_DEVICES-unset}"],
                         env=env, capture_output=True, text=True, timeout=30, check=True)
    return out.stdout.strip()


@pytest.mark.parametrize("var", ["OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"])
def test_local_rank_selects_from_the_visible_list(var):
    assert _visible({var: "1", "CUDA_VISIBLE_DEVICES": "4,5,6"}) == "5"
    assert _visible({var: "4", "CUDA_VISIBLE_DEVICES": "4,5,6"}) == "5"  # wraps around


def test_without_a_launcher_nothing_changes():
    assert _visible({"CUDA_VISIBLE_DEVICES": "2,3"}) == "2,3"


LAUNCH = BIND.parent


def _fake_launcher(tmp_path, name, version):
    """A launcher that says ``version`` to --version and prints its arguments otherwise."""
    fake = tmp_path / name
    fake.write_text(f"#!/usr/bin/env bash\n[[ $1 == --version ]] && {{ echo '{version}'; "
                    "exit 0; }\nprintf '%s\\n' \"$@\"\n")
    fake.chmod(0o755)
    return fake


@pytest.mark.parametrize(("version", "expected"), [
    ("mpirun (Open MPI) 5.0.3", ["--hostfile", "HOSTS", "--map-by", "ppr:2:node",
                                 "-x", "IPCSHARE_VIRTUAL_NODES"]),
    ("HYDRA build details: MPICH 4.2", ["-f", "HOSTS", "-ppn", "2"]),
])
def test_hostfile_launch_places_ranks_node_by_node(tmp_path, version, expected):
    hosts = tmp_path / "hosts"
    hosts.write_text("node1\nnode2\n")
    fake = _fake_launcher(tmp_path, "mpiexec", version)
    env = {k: v for k, v in os.environ.items() if not k.startswith("IPCSHARE_")}
    env.update(MPIEXEC=str(fake), RANKS_PER_NODE="2", IPCSHARE_VIRTUAL_NODES="2")
    out = subprocess.run(["bash", str(LAUNCH / "mpirun-hostfile.sh"), str(hosts), "4",
                          "allgather", "-b", "1M"], env=env, capture_output=True, text=True,
                         timeout=30, check=True)
    args = out.stdout.split()
    expected = [str(hosts) if item == "HOSTS" else item for item in expected]
    assert args[:len(expected)] == expected
    assert args[len(expected):] == ["-n", "4", str(BIND), "python3", "-m", "ipcshare",
                                    "allgather", "-b", "1M"]


def test_hostfile_launch_refuses_a_missing_hostfile(tmp_path):
    out = subprocess.run(["bash", str(LAUNCH / "mpirun-hostfile.sh"), str(tmp_path / "none"),
                          "2", "ring"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "cannot read hostfile" in out.stderr


def test_srun_launch_uses_pmix_block_placement_and_gpu_binding(tmp_path):
    fake = _fake_launcher(tmp_path, "srun", "slurm 24.05")
    env = {**os.environ, "SRUN": str(fake), "IPCSHARE_PYTHON": "python3",
           "SRUN_FLAGS": "-N 2 --ntasks-per-node=2"}
    out = subprocess.run(["bash", str(LAUNCH / "srun.sh"), "ring", "-b", "4K"], env=env,
                         capture_output=True, text=True, timeout=30, check=True)
    assert out.stdout.split() == ["--mpi=pmix", "--distribution=block:block", "-N", "2",
                                  "--ntasks-per-node=2", str(BIND), "python3", "-m",
                                  "ipcshare", "ring", "-b", "4K"]


@pytest.mark.parametrize("script", ["srun.sh", "mpirun-hostfile.sh", "mpirun.sh",
                                    "slurm.sbatch"])
def test_launch_scripts_parse(script):
    subprocess.run(["bash", "-n", str(LAUNCH / script)], check=True, timeout=30)
