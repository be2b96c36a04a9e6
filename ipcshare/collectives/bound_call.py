"""A collective call bound once to its arrays, stream and algorithm
(``Communicator.bind``): calling it enqueues the call again with nothing resolved
anew, for loops that call the same collective on the same buffers (a training step's
gradient bucket, a decoder layer's activations) and want the launch cost alone."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..runtime.errors import CollectiveError

__all__ = ["BoundCollective"]


class BoundCollective:
    """``bound()`` runs the call it was bound to on the same arrays (whatever they hold
    then) and returns what the call returns. On GPUs it enqueues one kernel launch with
    an argument block filled at bind time; on host memory it runs the call through the
    host path. Raises CollectiveError once the communicator is closed.

    It keeps the arrays alive: their memory must not be freed while the call may run.
    """

    __slots__ = ("collective", "description", "_enqueue", "_check", "_result", "_keep")

    def __init__(self, collective: str, description: str, enqueue: Callable[[], None],
                 check: Callable[[], None], result: Any, keep: tuple) -> None:
        """``check`` raises CollectiveError when the communicator takes no more calls
        (closed, or an earlier call failed on this rank)."""
        self.collective = collective
        self.description = description
        self._enqueue = enqueue
        self._check = check
        self._result = result
        self._keep = keep

    def __call__(self) -> Any:
        try:
            self._check()
        except CollectiveError as exc:
            raise CollectiveError(f"{self.description}: the communicator it was bound to takes "
                                  f"no more calls ({exc}); bind the call again on an open "
                                  "communicator") from None
        self._enqueue()
        return self._result

    @property
    def blocks(self) -> int | None:
        """The thread blocks of its largest kernel launch (GPUs), or None (host memory,
        or steps that are not one rank's kernels)."""
        return getattr(self._enqueue, "blocks", None)

    def __repr__(self) -> str:
        return f"BoundCollective({self.description})"
