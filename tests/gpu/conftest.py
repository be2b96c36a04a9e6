"""GPU tests: every one skips, with the driver's reason, where no CUDA device is visible."""

from __future__ import annotations

import pytest

from ipcshare.backends import gpu_count


@pytest.fixture(autouse=True)
def _needs_a_gpu():
    count, reason = gpu_count()
    if count == 0:
        pytest.skip(f"needs a CUDA GPU: {reason}")


@pytest.fixture
def gpus() -> int:
    """Number of CUDA devices visible to this process."""
    return gpu_count()[0]
