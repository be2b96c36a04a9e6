"""tools/gpu-check.sh's 2G-1 and 2G-2 parts: the two halves of the GPU test files together
run every file once (8 ranks on 4 GPUs outlast one device call whole)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = (ROOT / "tools/gpu-check.sh").read_text()


def _half(number: int, files: str | None = None) -> list[str]:
    function = re.search(r"^test_files_half\(\) \{.*?^\}$", SCRIPT, re.M | re.S).group(0)
    env = f"TESTS_FILES={files!r} " if files is not None else ""
    out = subprocess.run(["bash", "-c", f"{function}\n{env}test_files_half {number}"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return out.split()


def test_the_halves_cover_every_gpu_test_file_once():
    first, second = _half(1), _half(2)
    every = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests/gpu").glob("test_*.py"))
    assert sorted(first + second) == every
    assert not set(first) & set(second)
    assert abs(len(first) - len(second)) <= 1


def test_the_halves_of_named_files_keep_their_order():
    files = ("tests/gpu/test_examples.py tests/gpu/test_shared_gpu.py "
             "tests/gpu/test_line_probe_gpu.py")
    assert _half(1, files) == ["tests/gpu/test_examples.py", "tests/gpu/test_line_probe_gpu.py"]
    assert _half(2, files) == ["tests/gpu/test_shared_gpu.py"]


def test_both_halves_are_parts_of_the_tests_phase():
    assert 'tests_part "2G-$half"' in SCRIPT and "2G-1 2G-2" in SCRIPT
