"""What ``pip install`` of the package gives a node without NVRTC: a wheel built from this
tree (once per run; its kernel build reuses the tree's CUBINs where their key matches),
installed into a fresh virtual environment, loads every sm_90 CUBIN it ships (found, read,
key checked, an ELF of sm_90 with its entry points) with NVRTC's bindings unimportable,
and never imports them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import venv
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.nvrtc

_ROOT = Path(__file__).resolve().parents[2]

# Run in the fresh environment: NVRTC's bindings cannot be imported there (a finder ahead
# of every other refuses them), and every kernel source's sm_90 CUBIN must come from the
# package.
_LOAD_WITHOUT_NVRTC = textwrap.dedent("""
    import importlib.abc, sys

    class NoNvrtc(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("cuda", "nvidia"):
                raise ImportError(f"{name} is blocked: this node has no NVRTC")
            return None

    sys.meta_path.insert(0, NoNvrtc())
    from ipcshare.kernels.compiler import KERNEL_SOURCES, compile_kernel_source
    from ipcshare.kernels.shipped import cubin_arch, shipped_dir
    import ipcshare
    assert not ipcshare.__file__.startswith(sys.argv[1]), ipcshare.__file__
    for source, entries in KERNEL_SOURCES.items():
        cubin = compile_kernel_source(source, arch="sm_90")
        assert cubin_arch(cubin) == "sm_90", (source, cubin_arch(cubin))
        for entry in entries:
            assert entry.encode() in cubin, (source, entry)
    assert not [name for name in sys.modules if name.split(".")[0] in ("cuda", "nvidia")]
    print("loaded", len(KERNEL_SOURCES), "from", shipped_dir())
""")


@pytest.fixture(scope="session")
def sm90_wheel(tmp_path_factory) -> Path:
    """A wheel of this tree shipping sm_90, built once per run."""
    out = tmp_path_factory.mktemp("wheel")
    env = {**os.environ, "IPCSHARE_KERNEL_ARCHS": "sm_90"}
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w",
                           str(out), str(_ROOT)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    wheels = list(out.glob("ipcshare-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_the_wheel_ships_the_asked_architectures_alone(sm90_wheel):
    """Whatever the tree or an earlier build left (the tree here ships sm_80 too)."""
    from ipcshare.kernels.compiler import KERNEL_SOURCES

    with zipfile.ZipFile(sm90_wheel) as wheel:
        cubins = sorted(name.rsplit("/", 1)[1] for name in wheel.namelist()
                        if name.startswith("ipcshare/kernels/cubin/") and name.endswith(".cubin"))
        assert "ipcshare/kernels/cubin/manifest.json" in wheel.namelist()
    assert cubins == sorted(f"{source[:-3]}-sm_90.cubin" for source in KERNEL_SOURCES)


def test_a_fresh_install_loads_its_sm90_kernels_without_nvrtc(sm90_wheel, tmp_path):
    env_dir = tmp_path / "fresh"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    installed = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps",
                                "--no-index", str(sm90_wheel)], capture_output=True,
                               text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr[-3000:]
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "IPCSHARE_KERNEL_CACHE")}
    # An empty cache: a CUBIN found there would hide a shipped one that does not serve.
    env["IPCSHARE_KERNEL_CACHE"] = str(tmp_path / "empty-cache")
    loaded = subprocess.run([str(python), "-I", "-c", _LOAD_WITHOUT_NVRTC, str(_ROOT)],
                            capture_output=True, text=True, timeout=120, env=env,
                            cwd=tmp_path)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    assert "loaded" in loaded.stdout and str(env_dir) in loaded.stdout
