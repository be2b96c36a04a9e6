"""tools/checks/collective_sweep.py, the correctness sweep of the collectives through the public
API: on host windows under mpiexec it runs every host algorithm, dtype and reduction at
odd sizes and checks every byte; in one process it finds a call that leaves one wrong
element (GPU cases run on the GPU nodes, tools/gpu_check.py csweep)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ipcshare.collectives.algorithms import algorithm_names
from tests.example_runs import load_example

from .test_cli import MPIEXEC, needs_mpiexec

TOOL = Path(__file__).resolve().parents[2] / "tools" / "checks" / "collective_sweep.py"


def _tool():
    return load_example("collective_sweep", TOOL.parent)


def test_sizes_run_from_one_block_to_the_largest_with_an_odd_one_before_it():
    counts = _tool().element_counts
    assert counts(1000, 9) == [1, 9, 81, 729, 999, 1000]
    assert counts(1000, 9, multiple=3) == [3, 27, 243, 996, 999]  # whole blocks of 3 ranks
    assert counts(2, 9, multiple=3) == []
    assert counts(3, 9, multiple=3) == [3]


@needs_mpiexec
@pytest.mark.parametrize("n", [2, 3])
def test_every_host_algorithm_dtype_and_reduction_is_checked_at_odd_sizes(tmp_path,
                                                                          socket_base, n):
    report = tmp_path / "sweep.json"
    done = subprocess.run(
        [MPIEXEC, "-n", str(n), sys.executable, str(TOOL), "--backend", "host",
         "--max-bytes", "4K", "--json", str(report)],
        capture_output=True, text=True, timeout=180,
        env={**os.environ, "IPCSHARE_SOCKET_DIR": str(socket_base)})
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(report.read_text())
    assert doc["world_size"] == n and doc["wrong_total"] == 0
    cases = doc["cases"]
    for op in ("all_reduce", "reduce_scatter", "all_gather"):
        ran = {c["algo"] for c in cases if c["op"] == op}
        assert ran == {*algorithm_names("host", op), "auto"}, (op, ran)
    reductions = [c for c in cases if c["op"] != "all_gather"]
    assert {(c["dtype"], c["reduction"]) for c in reductions} == {
        (d, r) for d in ("float32", "float16", "bfloat16", "int32")
        for r in ("sum", "max", "min")}
    # out of place, in place, and on arrays from empty()
    assert all(c["calls"] == 3 and "refused" not in c for c in cases)
    # Blocks of reduce-scatter and all-gather are whole: multiples of the ranks, odd ones too.
    for c in cases:
        if c["op"] != "all_reduce":
            assert c["count"] % n == 0, c
    assert any(c["count"] % 2 for c in cases if c["op"] == "all_reduce")
    assert max(c["count"] for c in cases if c["dtype"] == "float16") == 2048  # 4 KiB
    assert f"# collective_sweep: {n} ranks, host" in done.stdout


def test_one_wrong_element_fails_the_sweep(monkeypatch, socket_base, capsys):
    monkeypatch.setenv("IPCSHARE_SOCKET_DIR", str(socket_base))
    from ipcshare.collectives.communicator import Communicator

    honest = Communicator.all_reduce

    def off_by_one(self, tensor, *, output=None, **kwargs):
        written = honest(self, tensor, output=output, **kwargs)
        if written.size > 3:  # the last element of larger calls only
            written[-1] += 1
        return written

    monkeypatch.setattr(Communicator, "all_reduce", off_by_one)
    status = _tool().main(["--backend", "host", "--ops", "all_reduce", "--algos", "one-shot",
                           "--dtypes", "int32", "--reductions", "max", "--max-bytes", "64"])
    out = capsys.readouterr().out
    assert status == 1
    # 16 elements at most (counts 1, 9, 15, 16): the last three are wrong by one element
    # in each of the three modes.
    assert "all_reduce      one-shot        4 cases up to     64, 9 wrong" in out, out


def test_an_algorithm_refusing_even_the_smallest_call_fails_the_sweep(monkeypatch,
                                                                      socket_base, capsys):
    monkeypatch.setenv("IPCSHARE_SOCKET_DIR", str(socket_base))
    from ipcshare.collectives.communicator import Communicator
    from ipcshare.runtime.errors import CollectiveError

    def refuse(self, output, input, **kwargs):
        raise CollectiveError("refused for the test")

    monkeypatch.setattr(Communicator, "reduce_scatter", refuse)
    status = _tool().main(["--backend", "host", "--ops", "reduce_scatter", "--algos",
                           "one-shot", "--dtypes", "int32", "--reductions", "sum",
                           "--max-bytes", "64"])
    out = capsys.readouterr().out
    assert status == 1, out
    assert "FAILED 1x, first: int32 sum 1 elements: refused for the test" in out, out


def test_a_misspelt_algorithm_is_refused_rather_than_swept_as_nothing(capsys):
    with pytest.raises(SystemExit) as stopped:
        _tool().main(["--backend", "host", "--algos", "one_shot"])
    assert stopped.value.code == 2
    assert "--algos: unknown one_shot" in capsys.readouterr().err
