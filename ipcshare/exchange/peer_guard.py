"""The guard process's program, ``python -m ipcshare.exchange.peer_guard SPEC_JSON``, started
by ``PeerWatch.exit_if_stuck``: the guard loop of ``ipcshare.liveness.guard`` with the
exchange's removal of its socket directory. It lives in the exchange because only a floor
above both liveness and the exchange's socket directory may join them; the exchange package
loads neither MPI nor CUDA, so the guard still starts light."""

from __future__ import annotations

import sys

from ..liveness.guard import run_guard
from .socket_dir import remove_socket_dir

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run the guard; returns its exit status (see ``ipcshare.liveness.guard``)."""
    return run_guard(argv, remove_socket_dir=remove_socket_dir)


if __name__ == "__main__":
    sys.exit(main())
