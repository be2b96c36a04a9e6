"""The README as a newcomer meets it, so that it cannot drift from the code: its length and
paragraphs, every code block run as written on host memory (the numpy example at several
world sizes, the command lines, what `make demo` runs), the GPU example held against the
library's names and signatures without a GPU, the commands table against the parser, and
every link of the README and docs/ to a file of the checkout."""

from __future__ import annotations

import ast
import inspect
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import ipcshare
from ipcshare.cli.main import build_parser
from ipcshare.collectives.communicator import Communicator

from ..example_runs import inside_an_mpi_job
from .test_cli import MPIEXEC, needs_mpiexec, socket_dir  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
TEXT = README.read_text()
_BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)

outside_mpi = pytest.mark.skipif(inside_an_mpi_job(), reason="launches mpiexec itself: run "
                                                            "it outside mpiexec")


def _blocks(language: str) -> list[str]:
    return [code for lang, code in _BLOCK.findall(TEXT) if lang == language]


def _python_block(*, gpu: bool) -> str:
    (code,) = [code for code in _blocks("python") if ("import torch" in code) == gpu]
    return code


def _command_lines() -> list[str]:
    """The README's shell lines, comments and `make` lines left out."""
    lines = []
    for code in _blocks("bash"):
        for line in code.splitlines():
            line = line.split("#", 1)[0].strip()
            if line and not line.startswith("make "):
                lines.append(line)
    return lines


def _run(argv: list[str], timeout: float = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=env)


def _as_run_here(line: str) -> list[str]:
    """A README command line with `mpiexec` and `ipcshare` as this checkout runs them."""
    words = []
    for word in shlex.split(line):
        if word == "mpiexec":
            words.append(MPIEXEC)
        elif word == "ipcshare":
            words += [sys.executable, "-m", "ipcshare"]
        else:
            words.append(word)
    return words


# -- what a reader sees --------------------------------------------------------------------
def test_the_readme_reads_in_two_minutes():
    lines = TEXT.splitlines()
    assert len(lines) <= 150
    prose, paragraph, in_code = [], [], False
    for number, line in enumerate(lines, 1):
        if line.startswith("```"):
            in_code = not in_code
        if in_code or line.startswith(("```", "#", "|")) or not line.strip():
            if paragraph:
                prose.append(paragraph)
            paragraph = []
        else:
            paragraph.append(number)
    longest = max(prose, key=len)
    assert len(longest) <= 8, f"the paragraph from line {longest[0]} has {len(longest)} lines"


def test_the_commands_table_is_the_command_lines():
    rows = re.findall(r"^\| `([a-z0-9-]+)` \|", TEXT, re.M)
    parser = build_parser()
    (commands,) = [action for action in parser._actions if action.dest == "command"]
    assert rows == list(commands.choices)


def _links(path: Path) -> list[tuple[str, str]]:
    text = path.read_text()
    return [(target, anchor) for target, anchor in
            re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", text)
            if target and not re.match(r"[a-z]+:", target)]


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors of ``path``'s headings."""
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
            for heading in re.findall(r"^#+ (.*)$", path.read_text(), re.M)}


@pytest.mark.parametrize("page", [README, *sorted((ROOT / "docs").glob("*.md"))],
                         ids=lambda page: page.name)
def test_every_link_to_the_checkout_leads_somewhere(page):
    for target, anchor in _links(page):
        where = (page.parent / target).resolve()
        assert where.exists(), f"{page.name} links to {target}, which is not there"
        if anchor and where == README:
            assert anchor in _anchors(README), f"{page.name} links to README#{anchor}"


# -- the GPU example, without a GPU -----------------------------------------------------------
def test_the_torch_example_calls_what_the_library_has():
    """Every ``ipcshare.X(...)``, ``g.X(...)`` and ``comm.X(...)`` of the GPU example names
    something the library defines and binds to its signature."""
    from ipcshare.window import Group

    tree = ast.parse(_python_block(gpu=True))
    owners = {"ipcshare": ipcshare, "g": Group, "comm": Communicator}
    group_source = inspect.getsource(Group)
    seen = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in owners):
            continue
        owner = owners[node.value.id]
        known = hasattr(owner, node.attr) or (
            owner is Group and f"self.{node.attr} " in group_source)
        assert known, f"{node.value.id}.{node.attr} is not in the library"
        seen.add(f"{node.value.id}.{node.attr}")
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id in owners
                and node.func.value.id != "ipcshare"):
            function = getattr(owners[node.func.value.id], node.func.attr)
            arguments = [None] * len(node.args)
            inspect.signature(function).bind(None, *arguments,
                                             **{k.arg: None for k in node.keywords})
    assert {"ipcshare.Group", "g.communicator", "comm.all_reduce", "comm.bind",
            "comm.synchronize"} <= seen


# -- the blocks that run on host memory -------------------------------------------------------
@needs_mpiexec
@outside_mpi
@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.usefixtures("socket_dir")
def test_the_numpy_example_runs_as_written(n, tmp_path):
    script = tmp_path / "example.py"
    script.write_text(_python_block(gpu=False))
    out = _run([MPIEXEC, "-n", str(n), sys.executable, str(script)])
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"{n} ranks: all_reduce and all_gather verified\n"


@needs_mpiexec
@outside_mpi
@pytest.mark.parametrize("line", _command_lines())
@pytest.mark.usefixtures("socket_dir")
def test_the_command_lines_run_as_written(line):
    out = _run(_as_run_here(line))
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr


@needs_mpiexec
@outside_mpi
@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.usefixtures("socket_dir")
def test_make_demo_runs_what_the_readme_says_it_runs():
    said = re.search(r"^\s+#\s+(mpiexec -n \d+ ipcshare .*)$", _blocks("bash")[0], re.M)[1]
    venv = Path(sys.executable).parent.parent
    planned = _run(["make", "-s", "-n", "demo", f"VENV={venv}", "MPIEXEC=mpiexec"])
    assert planned.returncode == 0, planned.stderr
    demo = planned.stdout.strip().splitlines()[-1].replace(f"{venv}/bin/", "")
    assert demo == said.strip()
    assert _run(["make", "-s", "-n", "test"]).returncode == 0  # the other command is there
    out = _run(_as_run_here(demo))
    assert out.returncode == 0, out.stderr
    assert re.search(r"#wrong|wrong", out.stdout)
