"""tools/probes/links/line_probe.py without a GPU: its kernels compile to CUBIN with the four entry
points it launches, the buffer it expects after the last round is the kernels' word
layout (a 16-byte line: three data words of round << 16 | place, the flag last; a
128-byte line: fifteen of round << 32 | place, the flag last), a row's verdict fails on a
torn or misplaced word or a wrong buffer, and bad flags are refused before any GPU work."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ipcshare.kernels.compiler import compile_kernel_source
from tests.example_runs import load_example

_TOOLS = Path(__file__).resolve().parents[2] / "tools" / "probes" / "links"
probe = load_example("line_probe", _TOOLS)


def test_the_kernels_compile_with_the_entry_points_the_tool_launches():
    cubin = compile_kernel_source(_TOOLS / "line_probe_kernels.cu", arch="sm_90")
    for width in probe.WIDTHS:
        for role in ("write", "read"):
            assert f"{role}{width}".encode() in cubin


def test_the_final_buffer_is_the_kernels_word_layout():
    text = (_TOOLS / "line_probe_kernels.cu").read_text()
    # The formulas the expected buffer mirrors.
    assert re.search(r"return \(r << 16\) \| \(unsigned\)\(\(line \* 4 \+ \(u64\)w\) & 0xFFFF\);",
                     text)
    assert re.search(r"return \(\(u64\)r << 32\) \| \(\(line \* 16 \+ \(u64\)w\) & "
                     r"0xFFFFFFFFull\);", text)
    short = probe.final_lines(16, 3, 7).view(np.uint32).reshape(3, 4)
    assert short[2].tolist() == [7 << 16 | 8, 7 << 16 | 9, 7 << 16 | 10, 7]
    # Places wrap at 16 bits: line 20000's first word.
    assert probe.final_lines(16, 20001, 1).view(np.uint32)[20000 * 4] == (1 << 16) | (
        80000 & 0xFFFF)
    long = probe.final_lines(128, 2, 5).view(np.uint64).reshape(2, 16)
    assert long[1, 0] == (5 << 32) | 16 and long[1, 14] == (5 << 32) | 30
    assert long[0, 15] == long[1, 15] == 5
    assert probe.final_lines(128, 2, 5).nbytes == 256


def test_a_row_fails_on_a_torn_or_misplaced_word_or_a_wrong_buffer():
    row = {"seen": 10, "torn": 0, "ahead": 3, "misplaced": 0, "final_ok": True}
    assert probe.verdict(row) == "whole"
    assert probe.verdict({**row, "seen": 0}).startswith("INCONCLUSIVE")
    for bad in ({"torn": 1}, {"misplaced": 2}, {"final_ok": False}):
        assert probe.verdict({**row, **bad}) == "FAILED"


@pytest.mark.parametrize(("flags", "said"), [
    (["--widths", "32"], "--widths: each of 16, 128"),
    (["--reloads", "2"], "--reloads: 0 or 1"),
    (["--bytes", "1000"], "--bytes: a multiple of 512"),
    (["--rounds", "70000"], "--rounds: 1 to 65535"),
    (["--budget-ms", "0"], "--budget-ms and --grid: above 0"),
])
def test_bad_flags_are_refused_before_any_gpu_work(flags, said):
    done = subprocess.run([sys.executable, str(_TOOLS / "line_probe.py"), *flags],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert said in done.stderr.strip().splitlines()[-1], done.stderr


def test_the_entries_resolved_up_front_are_the_kernels_entry_points():
    # Lazy loading: a kernel first resolved while its GPU runs a reader waits for it.
    assert sorted(probe.ENTRIES) == ["read128", "read16", "write128", "write16"]
    source = probe.KERNELS.read_text()
    for entry in probe.ENTRIES:
        assert f"__global__ void {entry}(" in source
