"""One sweep of a pattern across (virtual) nodes with an engine between them, for the MPI
and GPU tests of the hierarchical collectives."""

from __future__ import annotations

from typing import Any

import ipcshare
from ipcshare.patterns import make_pattern
from ipcshare.patterns.driver import run_pattern
from ipcshare.runtime.config import merge_options


def run_across_nodes(name: str, backend: str, inter: str, *, algo: str = "auto",
                     **options: Any) -> Any:
    """Collective: ``run_pattern`` of op ``name`` over a fresh group, 3 iterations, 1
    warm-up, 2 checks unless ``options`` say otherwise; the pattern closed after."""
    opts = merge_options({"backend": backend, "iters": 3, "warmup": 1, "checks": 2,
                          **options})
    pattern = make_pattern(name, algo, op=opts.op, datatype=opts.datatype, inter=inter)
    try:
        with ipcshare.Group(backend=backend) as g:
            return run_pattern(g, pattern, opts, emit=lambda _line: None)
    finally:
        pattern.close()
