"""``ipcshare allreduce | reducescatter`` across virtual nodes with ``--inter``: the
hierarchical collectives verify and name their engine; ``--inter nccl`` where it cannot
run is one clear line on every rank."""

from __future__ import annotations

import json

import pytest

from .test_cli import needs_mpiexec, socket_dir  # noqa: F401
from .test_multinode_cli import run_on_virtual_nodes

pytestmark = needs_mpiexec


@pytest.mark.parametrize("op", ["allreduce", "reducescatter"])
def test_reductions_across_two_nodes_verify_and_name_the_engine(tmp_path, socket_dir, op):  # noqa: F811
    path = tmp_path / "out.json"
    out = run_on_virtual_nodes(2, [op, "--inter", "mpi", "-b", "4", "-e", "64K", "-f", "64",
                                   "-n", "2", "-w", "1", "-c", "2", "-d", "bfloat16",
                                   "--json", str(path)], n=4)
    assert out.returncode == 0, out.stderr
    assert "# between nodes: mpi" in out.stdout and "# Out of bounds values : 0 OK" in out.stdout
    doc = json.loads(path.read_text())
    assert doc["nodes"] == 2 and doc["inter"] == "mpi" and doc["wrong_total"] == 0


def test_inter_nccl_without_gpu_is_one_line_on_every_rank(socket_dir):  # noqa: F811
    out = run_on_virtual_nodes(2, ["allgather", "--backend", "host", "--inter", "nccl",
                                   "-b", "1K", "-e", "1K"], n=2)
    assert out.returncode == 1
    errors = [line for line in out.stderr.splitlines() if line.startswith("ipcshare: error:")]
    assert len(errors) == 2, out.stderr
    assert all("--inter nccl" in e and "needs a GPU backend" in e for e in errors), out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("command", ["allreduce", "alltoall"])
def test_registered_arrays_across_nodes_are_one_line_on_every_rank(socket_dir,  # noqa: F811
                                                                    command):
    out = run_on_virtual_nodes(2, [command, "--backend", "host", "-R", "1", "-b", "1K",
                                   "-e", "1K"], n=2)
    assert out.returncode == 1
    errors = [line for line in out.stderr.splitlines() if line.startswith("ipcshare: error:")]
    assert len(errors) == 2, out.stderr
    assert all("-R 1 registers arrays with a communicator of one node; this job spans 2 "
               "nodes: use -R 0" in e for e in errors), out.stderr
    assert "Traceback" not in out.stderr
