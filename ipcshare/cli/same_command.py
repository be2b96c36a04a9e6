"""Under a launcher, every rank learns whether every other rank parsed its command line and
runs the same command before any of them starts it.

Without this, a rank stopped by a usage error (or running another command) leaves the rest
waiting for ever in their first collective, since each command starts with its own.
"""

from __future__ import annotations

import socket

from ..liveness.deadline_waits import watched_allgather
from ..runtime.errors import ConfigError
from ..topology.arrival import arrival_timeout
from ..topology.world import describe_disagreement, format_ranks, mpi

__all__ = ["CommandLineError", "agree_on_command", "PATTERN_COMMANDS"]

# These compare their operation with the rest of their options in one step of their own
# (run_pattern.check_same_run), naming every difference at once: here they count as one.
PATTERN_COMMANDS = ("ring", "allgather", "allreduce", "reducescatter", "alltoall")


class CommandLineError(Exception):
    """A command line that argparse could not parse: ``line`` is the one line to print,
    ``prog`` (``ipcshare allreduce``) and ``message`` (argparse's) what it says."""

    def __init__(self, prog: str, message: str, *, line: str | None = None) -> None:
        # An argument may hold a newline (found by fuzzing): the error stays one line.
        message = message.replace("\r", "\\r").replace("\n", "\\n")
        self.prog, self.message = prog, message
        self.line = line or f"{prog}: error: {message} (see {prog} --help)"
        super().__init__(self.line)


def agree_on_command(command: str | None, usage_error: CommandLineError | None) -> None:
    """Collective over MPI's world: raise on every rank when some rank's command line
    failed to parse (``usage_error``; ``command`` is then None) or names another command
    than this rank's.

    Raises:
        CommandLineError: some rank's command line failed to parse: its own error on that
            rank; on the others, one naming the first such rank, its host and its error.
        ExchangeTimeout: not every rank came within ``IPCSHARE_ARRIVAL_TIMEOUT``.
        ConfigError: the ranks parsed different commands (a run needs them all alike).
    """
    comm = mpi().COMM_WORLD
    if comm.Get_size() == 1:
        return
    facts = (socket.gethostname(), command,
             None if usage_error is None else (usage_error.prog, usage_error.message))
    # The job's first meeting: ranks may arrive late (imports), so the arrival timeout;
    # no rank's pid is known yet, so a stopped one cannot be told from a late one.
    lines = watched_allgather(comm, facts, watch=None, timeout=arrival_timeout(),
                              what="comparing the ranks' command lines")
    failed = [rank for rank, (_host, _command, error) in enumerate(lines) if error]
    if failed:
        if usage_error is not None:
            raise usage_error
        host, _command, (prog, message) = lines[failed[0]]
        others = f" (and {format_ranks(failed[1:])})" if len(failed) > 1 else ""
        raise CommandLineError(prog, message, line=(
            f"ipcshare: error: the command line of rank {failed[0]}@{host}{others} is "
            f"wrong: {message} (see {prog} --help)"))
    commands = [name for _host, name, _error in lines]
    kinds = ["a pattern" if name in PATTERN_COMMANDS else name for name in commands]
    if any(kind != kinds[0] for kind in kinds):
        raise ConfigError("ranks disagree on the command: " + describe_disagreement(
            commands, verb=("asks for", "ask for"), then="for"))
