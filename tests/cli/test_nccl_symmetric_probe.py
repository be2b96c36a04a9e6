"""tools/probes/baselines/nccl_symmetric_probe.py, NCCL alone on odd-count reduce-scatters
(its runs are on the GPU nodes, tools/gpu_check.py collectives): here, that it refuses bad
counts and says what it needs where nccl4py is missing, in one line, without a traceback."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = (Path(__file__).resolve().parents[2] / "tools" / "probes" / "baselines"
        / "nccl_symmetric_probe.py")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("counts,said", [("3,x", "takes whole numbers"),
                                         ("4099,0", "every count is at least 1")])
def test_bad_counts_are_refused_by_name(counts, said):
    out = _run("--counts", counts)
    assert out.returncode == 2 and said in out.stderr and "Traceback" not in out.stderr


@pytest.mark.skipif(importlib.util.find_spec("nccl") is not None,
                    reason="nccl4py is installed here")
def test_without_nccl4py_it_says_what_it_needs():
    out = _run("--counts", "4099")
    assert out.returncode == 1, out.stderr
    assert out.stderr.startswith("nccl_symmetric_probe: needs nccl4py and torch")
    assert "Traceback" not in out.stderr
