"""The guard process's program, ``python -m ipcshare.peer_guard SPEC_JSON``, started by
``PeerWatch.exit_if_stuck``: the guard loop of ``ipcshare.liveness.guard`` with the
exchange's removal of its socket directory, which only a module above both may join."""

from __future__ import annotations

import sys

from .liveness.guard import run_guard

__all__ = ["main"]


def _remove_socket_dir(directory: str, token: str) -> bool:
    # Imported only when a stuck rank is ended: the guard starts light (no MPI, no CUDA).
    from .exchange.socket_dir import remove_socket_dir

    return remove_socket_dir(directory, token)


def main(argv: list[str] | None = None) -> int:
    """Run the guard; returns its exit status (see ``ipcshare.liveness.guard``)."""
    return run_guard(argv, remove_socket_dir=_remove_socket_dir)


if __name__ == "__main__":
    sys.exit(main())
