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
