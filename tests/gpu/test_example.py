"""The custom all-reduce example, built only from public building blocks, agrees with NCCL."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.mpi]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "allreduce_oneshot.py"


def test_one_shot_allreduce_example_matches_nccl(comm, gpus):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or comm.size > gpus:
        pytest.skip("needs torch with CUDA and one GPU per rank (NCCL refuses shared GPUs)")
    spec = importlib.util.spec_from_file_location("allreduce_oneshot", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert example.main(["--count", str((1 << 18) + 7), "--iters", "3"]) == 0
