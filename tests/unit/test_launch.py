"""launch/bind-gpu.sh picks one GPU per local rank from whichever launcher started it."""

from __future__ import annotations

import os
import shutil
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


BASH = shutil.which("bash")


def _numa_machine(tmp_path, *, tools, numa_node="1", local_cpus="8-15"):
    """A fake sysfs tree with the GPU at 0000:1b:00.0 on ``numa_node``, and a bin folder
    with nvidia-smi and the binding ``tools`` (each prints its arguments)."""
    device = tmp_path / "sys" / "bus" / "pci" / "devices" / "0000:1b:00.0"
    device.mkdir(parents=True)
    (device / "numa_node").write_text(numa_node + "\n")
    if local_cpus is not None:
        (device / "local_cpulist").write_text(local_cpus + "\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scripts = {"nvidia-smi": 'echo "00000000:1B:00.0"'}
    for tool in tools:
        # The script probes each binding with `true`, then execs the command under it.
        scripts[tool] = f'[[ ${{@: -1}} == true ]] && exit 0; echo "{tool} $*"'
    for name, body in scripts.items():
        script = bin_dir / name
        script.write_text(f"#!{BASH}\n{body}\n")
        script.chmod(0o755)
    env = {"PATH": str(bin_dir), "IPCSHARE_SYSFS_ROOT": str(tmp_path / "sys"),
           "OMPI_COMM_WORLD_LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": "3"}
    return env


def _bound(env):
    out = subprocess.run([BASH, str(BIND), BASH, "-c", "echo unbound"], env=env,
                         capture_output=True, text=True, timeout=30, check=True)
    return out.stdout.strip(), out.stderr.strip()


def test_numactl_binds_cpus_and_memory_to_the_gpus_node(tmp_path):
    stdout, _ = _bound(_numa_machine(tmp_path, tools=("numactl", "taskset")))
    assert stdout == f"numactl --cpunodebind=1 --membind=1 {BASH} -c echo unbound"


def test_taskset_binds_the_gpus_local_cpus_when_numactl_is_missing(tmp_path):
    stdout, stderr = _bound(_numa_machine(tmp_path, tools=("taskset",)))
    assert stdout == f"taskset -c 8-15 {BASH} -c echo unbound"
    assert "memory not bound to node 1" in stderr


def test_without_binding_tools_the_rank_runs_unbound_and_says_why(tmp_path):
    stdout, stderr = _bound(_numa_machine(tmp_path, tools=()))
    assert stdout == "unbound"
    assert "neither numactl nor taskset" in stderr and "node 1" in stderr


def test_a_gpu_without_a_numa_node_is_left_unbound(tmp_path):
    stdout, stderr = _bound(_numa_machine(tmp_path, tools=("numactl", "taskset"),
                                          numa_node="-1", local_cpus=None))
    assert stdout == "unbound" and "no NUMA node" in stderr


def test_numa_binding_can_be_turned_off(tmp_path):
    env = _numa_machine(tmp_path, tools=("numactl",))
    stdout, stderr = _bound({**env, "IPCSHARE_BIND_NUMA": "0"})
    assert stdout == "unbound" and stderr == ""
