"""What tools/gpu_check.py runs, as data: a step (commands under one time limit, the
result documents it writes), a note, a phase (its name, the fewest GPUs it needs, the
function that lists its steps for a machine), the machine and run a phase table reads
(``Context``), and what became of a step (``Outcome``)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["Step", "Note", "Phase", "Context", "Outcome"]

REPO = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class Step:
    """One step: ``commands`` run in order (the first that fails ends the step) within
    ``limit_s`` seconds in all.

    ``env``: variables added for it; ``results``: the result documents it writes (paths),
    each read after it ends; ``json_tags``: ``(path, tags)`` pairs of ``--json`` documents
    it writes, moved into results.jsonl with the tags added; ``mps``: run under the MPS
    daemon (started by the runner if none runs; the step is skipped where it cannot
    start); ``drop``: a pattern of output lines kept out of the log; ``tee``: a file under
    the output folder that gets the step's output too; ``needs``: a file that must exist
    when the step starts (else it is skipped: what makes it failed before).
    """

    name: str
    commands: tuple[tuple[str, ...], ...]
    limit_s: int
    env: tuple[tuple[str, str], ...] = ()
    results: tuple[str, ...] = ()
    json_tags: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()
    mps: bool = False
    drop: str | None = None
    tee: str | None = None
    needs: str | None = None
    cwd: str | None = None

    @classmethod
    def of(cls, name: str, *commands: Sequence[str], limit_s: int,
           env: dict[str, str] | None = None, results: Sequence[str] = (),
           json_tags: dict[str, dict[str, str]] | None = None, mps: bool = False,
           drop: str | None = None, tee: str | None = None, needs: str | None = None,
           cwd: str | None = None) -> Step:
        """A step from plain lists and dicts (the phase table's spelling)."""
        return cls(name, tuple(tuple(str(a) for a in c) for c in commands), int(limit_s),
                   tuple((env or {}).items()), tuple(results),
                   tuple((path, tuple(tags.items())) for path, tags in
                         (json_tags or {}).items()), mps, drop, tee, needs, cwd)


@dataclasses.dataclass(frozen=True)
class Note:
    """A line for the log between steps (why something is left out)."""

    text: str


@dataclasses.dataclass(frozen=True)
class Phase:
    """A phase: its name, one line on what it checks, the fewest GPUs it needs, and the
    function that lists its steps (and notes) for a machine (``Context``)."""

    name: str
    about: str
    min_gpus: int
    steps: Callable[[Context], list[Step | Note]]


@dataclasses.dataclass
class Outcome:
    """What became of one step: ``verdict`` is ``ok``, ``FAILED ...``, ``TIMEOUT ...`` or
    ``skipped ...``; ``failed`` says whether it counts against the run."""

    phase: str
    name: str
    verdict: str
    seconds: float
    failed: bool
    rc: int | None = None
    documents: int = 0


@dataclasses.dataclass
class Context:
    """The machine and the run, as the phase table reads them: GPUs visible, the
    python and mpiexec to use, the output folder, a scratch folder of this run (outside
    the output: intermediate files), the knobs (environment variables as the old script
    read them), and whether the MPS daemon runs (the runner's)."""

    gpus: int
    out: Path
    scratch: Path
    python: str = "python3"
    mpiexec: str = "mpiexec"
    knobs: dict[str, str] = dataclasses.field(default_factory=dict)
    repo: Path = REPO
    mpich_prefix: str = "/tmp/mpich"
    _counter: list[int] = dataclasses.field(default_factory=lambda: [0])

    def knob(self, name: str, default: str) -> str:
        """The knob ``name`` (an environment variable), or ``default``."""
        value = self.knobs.get(name)
        return default if value is None or value == "" else value

    def scratch_file(self, stem: str, suffix: str = ".json") -> str:
        """A fresh path in the scratch folder, named after ``stem``."""
        self._counter[0] += 1
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", stem).strip("-")[:80]
        return str(self.scratch / f"{self._counter[0]:03d}-{safe}{suffix}")
