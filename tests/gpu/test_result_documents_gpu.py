"""Result documents on GPUs: `ipcshare allreduce --graph --result` run by every rank of
the test's job writes one document (rank 0) that names the GPUs it ran on, the driver and
the links, holds graph-mode rows of one launch, and carries the command's exit status."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from ipcshare.cli.main import build_parser
from ipcshare.cli.run_pattern import run_pattern_command
from ipcshare.runtime.result_document import load

pytestmark = [pytest.mark.gpu, pytest.mark.mpi, pytest.mark.nvrtc]


def test_a_graph_run_writes_its_document_with_the_machine(comm):
    folder = comm.bcast(tempfile.mkdtemp(prefix="ipcshare-result-") if comm.rank == 0
                        else None)
    path = str(Path(folder) / "allreduce.json")
    try:
        args = build_parser().parse_args([
            "allreduce", "--backend", "cuda-vmm", "-b", "1K", "-e", "64K", "-f", "8", "-n",
            "5", "-w", "2", "--graph", "--result", path])
        status = run_pattern_command(args)
        document = load(path) if comm.rank == 0 else None
    finally:
        comm.Barrier()
        if comm.rank == 0:
            shutil.rmtree(folder, ignore_errors=True)
    if comm.rank != 0:
        return
    assert document["exit_status"] == status and document["wrong_total"] == 0
    machine = document["machine"]
    assert machine["gpu_count"] >= 1 and machine["gpu_model"] and machine["driver"]
    assert machine["links"], machine   # NVLink or PCIe, from NVML or nvidia-smi
    rows = document["rows"]
    assert rows and {row["mode"] for row in rows} == {"graph"}
    assert {row["world_size"] for row in rows} == {comm.size}
    assert len({row["launch"] for row in rows}) == 1
    assert all(row["ours"]["time_us"] > 0 for row in rows)
    assert document["command"].startswith("ipcshare allreduce" if comm.size == 1
                                          else f"mpiexec -n {comm.size} ipcshare allreduce")
