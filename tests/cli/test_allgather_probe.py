"""tools/probes/timing/allgather_probe.py, the tuning probe, on host windows: it runs whole
all-gathers and their parts under mpiexec and checks the whole ones' bytes (GPU variants
need a GPU)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ipcshare.runtime.result_document import load

from .test_cli import MPIEXEC, needs_mpiexec

PROBE = Path(__file__).resolve().parents[2] / "tools" / "probes" / "timing" / "allgather_probe.py"


@needs_mpiexec
def test_the_probe_times_and_checks_host_all_gathers(tmp_path):
    result = tmp_path / "result.json"
    done = subprocess.run(
        [MPIEXEC, "-n", "2", sys.executable, str(PROBE), "--backend", "host",
         "--variants", "full,in-place,copies,barriers", "--sizes", "64K,1M", "--iters", "3",
         "--warmup", "1", "--result", str(result)], capture_output=True, text=True,
        timeout=120)
    assert done.returncode == 0, done.stderr
    # Its result document: every variant and size, checked where the bytes were.
    document = load(result)
    figures = {(row["algorithm"], row["size"]): row for row in document["rows"]}
    assert set(figures) == {(v, s) for v in ("full", "in-place", "copies", "barriers")
                            for s in (64 << 10, 1 << 20)}
    assert {figures["full", 1 << 20]["wrong"], figures["copies", 1 << 20]["wrong"]} == {0, None}
    assert document["tool"] == "tools/probes/timing/allgather_probe.py"
    assert document["world_size"] == 2 and document["exit_status"] == 0
    rows = {line.split()[0]: line for line in done.stdout.splitlines()
            if line and not line.startswith(("#", "variant"))}
    assert set(rows) == {"full", "in-place", "copies", "barriers"}
    # Whole all-gathers were checked: a "!" would mark wrong bytes.
    assert "!" not in done.stdout
    for line in rows.values():
        assert line.count("(") == 2   # one (time) cell per size
