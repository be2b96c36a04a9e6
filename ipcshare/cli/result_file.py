"""``--result FILE``: the result document (runtime/result_document.py) of a timed command,
with the commit and the machine gathered here, written by rank 0 once the exit status is
known. The examples and the probes write theirs through ``write_result`` too."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .. import __version__
from ..runtime.errors import ConfigError
from ..runtime.result_document import DocumentError, command_line, make_document, write

__all__ = ["add_result_flag", "write_result", "RESULT_HELP"]

RESULT_HELP = ("write the result document: every figure with its commit, machine, launch "
               "and exit status (rank 0; docs/CLI.md, Result documents)")


def add_result_flag(parser: argparse.ArgumentParser) -> None:
    """``--result FILE`` on ``parser``."""
    parser.add_argument("--result", metavar="FILE", help=RESULT_HELP)


def write_result(path: str, *, tool: str, world_size: int, rows: Iterable[Mapping[str, Any]],
                 exit_status: int, measurement_errors: Iterable[str] = (),
                 extra: Mapping[str, Any] | None = None,
                 argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Gather the commit and this host's facts, make the document and write it to
    ``path`` atomically; returns the document. ``argv`` is the command as typed (the
    ``ipcshare`` command's by default).

    Raises:
        ConfigError: the file cannot be written, or the document breaks the schema (a
            bug of the caller, said with the field).
    """
    from ..runtime.source_commit import source_commit
    from ..topology.machine_facts import machine_facts_here

    argv = list(argv) if argv is not None else ["ipcshare", *sys.argv[1:]]
    try:
        document = make_document(
            tool=tool, version=__version__, commit=source_commit(),
            machine=machine_facts_here(), command=command_line(argv, world_size),
            exit_status=exit_status, world_size=world_size, rows=rows,
            measurement_errors=measurement_errors, extra=extra)
        write(path, document)
    except DocumentError as exc:
        raise ConfigError(f"result document {path!r}: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"cannot write {path!r}: {exc.strerror}") from None
    return document
