"""How the example tests load and launch the scripts of ``examples/``: imported as
modules (for their helpers), or run under ``mpiexec -n N`` as a user would."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
# The launcher beside the interpreter (the mpich wheel's) first, else the system's.
MPIEXEC = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which(
    "mpiexec")
# Open MPI refuses root and more ranks than cores without these; MPICH ignores them.
_OPEN_MPI_PERMISSIONS = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                         "OMPI_MCA_rmaps_base_oversubscribe": "1"}


def inside_an_mpi_job() -> bool:
    """Whether this process is a rank of an MPI job (its launcher set these): a test that
    launches mpiexec itself must not run there, once per rank."""
    return any(name in os.environ for name in (
        "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK", "PMIX_RANK", "MPI_LOCALNRANKS"))


def load_example(name: str, folder: Path = EXAMPLES) -> ModuleType:
    """``examples/<name>.py`` (or ``<folder>/<name>.py``: a tool) as a module (its
    ``main`` is not run)."""
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    # Registered first, as an import would: dataclasses look their module up by name.
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def run_example(name: str, *args: str, n: int, timeout: float = 120,
                ) -> subprocess.CompletedProcess:
    """``mpiexec -n n python examples/<name>.py args``, with this checkout on PYTHONPATH."""
    return run_script(EXAMPLES / f"{name}.py", *args, n=n, timeout=timeout)


def run_script(script: Path, *args: str, n: int, timeout: float = 120,
               ) -> subprocess.CompletedProcess:
    """``mpiexec -n n python script args``, with this checkout and ``examples/`` on
    PYTHONPATH (a test's own driver of an example imports it as a user's script would)."""
    root = str(EXAMPLES.parent)
    path = os.pathsep.join(filter(None, (root, str(EXAMPLES), os.environ.get("PYTHONPATH"))))
    env = {**os.environ, **_OPEN_MPI_PERMISSIONS, "PYTHONPATH": path}
    cmd = [MPIEXEC, "-n", str(n), sys.executable, str(script), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
