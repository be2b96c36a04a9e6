"""``ipcshare kernels``: the table of what is shipped, cached or missing per source and
architecture, this node's architecture marked, exit 1 where a kernel of this node's GPUs
would compile on its first call; ``kernels build`` compiles only what is neither shipped
nor cached, a line per kernel; bad flags get one line and status 1. NVRTC is replaced by a
quick fake (tests/unit/test_kernels.py compiles the real thing)."""

from __future__ import annotations

import json

import pytest

from ipcshare.cli import kernels as kernels_cli
from ipcshare.cli.main import main
from ipcshare.kernels import build, compiler, shipped


@pytest.fixture
def fake_nvrtc(tmp_path, monkeypatch):
    """NVRTC 13.0 compiling instantly (names recorded), a package shipping sm_90 of every
    source, an empty cache, and a node with one sm_90 GPU."""
    compiled: list[tuple[str, str]] = []

    def fake_compile(name, text, options, arch):
        compiled.append((name, arch))
        return b"\x7fELF fake cubin of " + name.encode()

    monkeypatch.setattr(compiler, "_compile", fake_compile)
    monkeypatch.setattr(compiler, "nvrtc_version", lambda: (13, 0))
    monkeypatch.setattr(build, "nvrtc_version", lambda: (13, 0))
    monkeypatch.setattr(shipped, "installed_nvrtc", lambda: "13.0")
    monkeypatch.setattr(shipped, "shipped_dir", lambda: tmp_path / "cubin")
    monkeypatch.setenv("IPCSHARE_KERNEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("IPCSHARE_KERNEL_SHIPPED", raising=False)
    build.build_shipped(tmp_path / "cubin", ("sm_90",), jobs=1, progress=lambda line: None)
    del compiled[:]
    monkeypatch.setattr(kernels_cli, "node_archs", lambda: (("sm_90",), None))
    return compiled


def test_status_marks_this_node_and_exits_0_when_its_kernels_are_shipped(fake_nvrtc, capsys,
                                                                        tmp_path):
    out_json = tmp_path / "kernels.json"
    assert main(["kernels", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    head = next(line for line in out.splitlines() if line.startswith("source"))
    assert head.split()[1:] == ["sm_80", "sm_90*", "sm_100"]
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()
            if line.endswith(("shipped", "missing", "cached"))}
    assert set(rows) == set(compiler.KERNEL_SOURCES)
    assert all(row == ["missing", "shipped", "missing"] for row in rows.values())
    facts = json.loads(out_json.read_text())
    assert facts["node_archs"] == ["sm_90"]
    assert facts["states"]["collectives_ll.cu"]["sm_90"] == "shipped"
    assert fake_nvrtc == []


def test_status_exits_1_where_this_nodes_kernels_would_compile(fake_nvrtc, monkeypatch,
                                                               capsys):
    monkeypatch.setattr(kernels_cli, "node_archs", lambda: (("sm_80",), None))
    assert main(["kernels"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"{len(compiler.KERNEL_SOURCES)} of this node's kernels would compile" in err
    assert "ipcshare kernels build --arch sm_80" in err


def test_build_compiles_what_is_missing_once_and_says_so_per_kernel(fake_nvrtc, capsys):
    assert main(["kernels", "build", "--arch", "sm_80,sm_90", "-j", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    sources = len(compiler.KERNEL_SOURCES)
    assert sorted(fake_nvrtc) == sorted((source, "sm_80") for source in compiler.KERNEL_SOURCES)
    assert sum(" sm_90 shipped already" in line for line in lines) == sources
    assert sum(" sm_80 compiled in " in line for line in lines) == sources
    # Now cached: status agrees, and a second build compiles nothing.
    assert main(["kernels", "--arch", "sm_80"]) == 0
    assert capsys.readouterr().out.count(" cached") == sources
    assert main(["kernels", "build", "--arch", "sm_80"]) == 0
    assert len(fake_nvrtc) == sources


@pytest.mark.parametrize(("argv", "said"), [
    (["kernels", "--arch", "hopper"], "architecture 'hopper' is not of the form sm_90"),
    (["kernels", "build", "-j", "0", "--arch", "sm_90"], "--jobs 0: must be at least 1"),
    (["kernels", "-j", "2"], "--jobs is for `ipcshare kernels build`"),
])
def test_bad_flags_get_one_line_and_status_1(fake_nvrtc, capsys, argv, said):
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and said in err


def test_build_without_gpu_or_arch_says_which_to_name(fake_nvrtc, monkeypatch, capsys):
    monkeypatch.setattr(kernels_cli, "node_archs", lambda: ((), "no NVIDIA driver"))
    assert main(["kernels", "build"]) == 1
    err = capsys.readouterr().err
    assert "no GPU here (no NVIDIA driver): name the architectures to build" in err
    assert fake_nvrtc == []
