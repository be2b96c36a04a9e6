"""``ipcshare`` under mpiexec with virtual nodes: the hierarchical all-gather and the ring
across nodes verify, JSON reports the node count, bad node counts fail cleanly."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from .test_cli import IPCSHARE, MPIEXEC, needs_mpiexec, shm_entries, socket_dir  # noqa: F401

pytestmark = needs_mpiexec


def run_on_virtual_nodes(nodes, args, n, timeout=120):
    env = {**os.environ, "IPCSHARE_VIRTUAL_NODES": str(nodes)}
    return subprocess.run([MPIEXEC, "-n", str(n)] + IPCSHARE + args, capture_output=True,
                          text=True, timeout=timeout, env=env)


@pytest.mark.parametrize("op", ["allgather", "ring"])
def test_four_ranks_as_two_nodes_verify_and_report_two_nodes(tmp_path, socket_dir, op):  # noqa: F811
    path = tmp_path / "out.json"
    out = run_on_virtual_nodes(2, [op, "-b", "1K", "-e", "256K", "-f", "16", "-n", "3",
                                   "-w", "1", "-c", "2", "--baseline", "mpi",
                                   "--json", str(path)], n=4)
    assert out.returncode == 0, out.stderr
    assert "nodes: 2" in out.stdout and "# Out of bounds values : 0 OK" in out.stdout
    doc = json.loads(path.read_text())
    assert doc["nodes"] == 2 and doc["world_size"] == 4 and doc["wrong_total"] == 0
    assert len(doc["rows"]) == 3 and all(row["wrong"] == 0 for row in doc["rows"])
    assert list(socket_dir.iterdir()) == []


def test_too_many_virtual_nodes_fail_cleanly_on_every_rank(socket_dir):  # noqa: F811
    before = shm_entries()
    out = run_on_virtual_nodes(4, ["allgather", "-b", "1K", "-e", "1K"], n=2)
    assert out.returncode == 1
    errors = [line for line in out.stderr.splitlines() if line.startswith("ipcshare: error:")]
    assert len(errors) == 2, out.stderr
    assert all("IPCSHARE_VIRTUAL_NODES=4 asks for more virtual nodes than the 2" in line
               for line in errors), out.stderr
    assert "Traceback" not in out.stderr
    assert shm_entries() == before and list(socket_dir.iterdir()) == []


def test_the_single_copy_algorithm_across_nodes_is_a_clear_error(socket_dir):  # noqa: F811
    out = run_on_virtual_nodes(2, ["allgather", "--algo", "copy-engine", "-b", "1K",
                                   "-e", "1K"], n=2)
    assert out.returncode == 1
    errors = [line for line in out.stderr.splitlines() if line.startswith("ipcshare: error:")]
    assert len(errors) == 2 and all("use --algo hierarchical" in e for e in errors), out.stderr
    assert "Traceback" not in out.stderr


def test_info_shows_the_nodes_and_the_path_of_every_pair(tmp_path):
    path = tmp_path / "info.json"
    out = run_on_virtual_nodes(2, ["info", "--json", str(path)], n=3)
    assert out.returncode == 0, out.stderr
    assert "3 rank(s) on 2 node(s) (virtual: IPCSHARE_VIRTUAL_NODES=2)" in out.stdout
    doc = json.loads(path.read_text())
    assert doc["nodes"] == 2 and doc["virtual_nodes"] == 2
    assert [f["node"] for f in doc["ranks"]] == [0, 0, 1]
    assert doc["paths"] == [["-", "direct", "mpi"], ["direct", "-", "mpi"], ["mpi", "mpi", "-"]]
