"""The doctor's host-staging probe (full runs, nodes with 2 or more GPUs): one rank per node
times peer copies between GPUs 0 and 1 with peer access off and on, in a process of its own
(``python -m ipcshare.p2p.staging_probe``), so the node report shows what host staging
costs there (bandwidth, and a second stream's copy waiting behind a kernel) and the rules
can flag copies that stay host-staged even with peer access enabled (an IOMMU or PCIe ACS
routing peer traffic through the CPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

__all__ = ["run_staging_probe"]


def run_staging_probe(*, nbytes: int, timeout_s: float) -> dict[str, Any]:
    """The probe's result, or ``{"error": why}`` when it could not run or gave up."""
    command = [sys.executable, "-m", "ipcshare.p2p.staging_probe", "--bytes", str(nbytes)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s,
                              check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"the staging probe did not finish within {timeout_s:.0f} s"}
    except OSError as exc:
        return {"error": f"could not start the staging probe: {exc}"}
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return {"error": reason}
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"error": f"the staging probe printed no result: {done.stdout[-200:]!r}"}
