"""Where the fault tests find MPICH's launchers (``mpiexec`` = hydra, ``mpiexec.gforker``).

By default next to the interpreter (the mpich package installs them into the venv). On a
node whose MPI is another one (Open MPI on the GPU nodes), the mpich package can be
installed under a prefix of its own: ``IPCSHARE_MPICH_BIN`` names its ``bin`` directory
(with ``MPI4PY_LIBMPI`` pointing mpi4py at that prefix's ``libmpi.so.12``).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

MPICH_BIN_ENV = "IPCSHARE_MPICH_BIN"


def mpich_launcher(name: str) -> str | None:
    """The path of MPICH launcher ``name``, or None where there is none."""
    where = os.environ.get(MPICH_BIN_ENV) or str(Path(sys.executable).parent)
    return shutil.which(name, path=where)
