"""``--plot`` of the pattern commands (``ipcshare allgather ... --plot run.png``): the
run drawn as the bench draws a suite of one case (busbw and time against size, ours and
the baseline, the ceiling the rows were checked against), by bench/plot.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..runtime.config import PatternOptions

__all__ = ["check_plot", "write_run_plot"]


def check_plot(path: str | None) -> None:
    """Refuse before the run what would fail after it: a file ending that names no format,
    or no matplotlib (each rank alike, so call it inside a collective step).

    Raises:
        ConfigError: naming the formats, or how to install matplotlib.
    """
    if not path:
        return
    from ..bench.plot import plot_format, require_matplotlib

    plot_format(path)
    require_matplotlib()


def _timing(options: PatternOptions) -> str:
    if options.after_kernel:
        return "after-kernel"
    if options.graph and options.timing == "nccl-tests":
        return "graph"
    return options.timing


def write_run_plot(world: Any, command: str, backend: str, options: PatternOptions,
                   result: Any, path: str | Path) -> None:
    """Collective (the machine's facts are gathered from every rank); rank 0 draws
    ``result``, the run of ``command`` on ``backend``, into ``path``.

    Raises:
        ConfigError: the file cannot be written (rank 0).
    """
    import dataclasses

    from ..bench.machine import machine_facts
    from ..bench.plot import write_plot
    from ..bench.runner import BenchResult, CaseResult
    from ..bench.suite import BenchCase, Suite

    facts = machine_facts(world)
    if world.rank != 0:
        return
    baselines = () if options.baseline == "none" else (options.baseline,)
    case = BenchCase(command, backend, options.algo, _timing(options), baselines,
                     dataclasses.replace(options, backend=backend))
    suite = Suite(name=f"ipcshare {command}", source="the command line", cases=(case,))
    write_plot(BenchResult(suite, [CaseResult(case, runs=[result])]), facts, path)
