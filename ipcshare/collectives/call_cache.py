"""Repeated calls without the checks: a GPU communicator remembers the launch of each
recent call by what identifies its arrays (pointer, which also names the device, length,
dtype, layout) and its other arguments, so a loop that calls ``comm.all_reduce(t)`` on
the same tensor pays a lookup and a launch, close to a bound call
(``Communicator.bind``), instead of describing and checking its arrays every time.

Only torch tensors are recognised this cheaply (their attributes are C calls); other
arrays take the checked path every call. Keys hold integers and dtypes, never the arrays,
so the cache keeps no user memory alive; two arrays with the same key describe the same
memory the same way, so the remembered launch is right for either.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

__all__ = ["CallCache"]

# Launches remembered per communicator: a step of a training loop makes a handful of
# distinct calls; more than this means the arrays change every call.
_LIMIT = 64


class CallCache:
    """Remembered launches by call key (see ``key``)."""

    def __init__(self) -> None:
        self._launches: dict[tuple, Callable[[], None]] = {}
        self.hits = 0
        # torch's tensor and stream classes, looked up once torch is imported.
        self._tensor_type: Any = None
        self._stream_type: Any = None

    def _identity(self, obj: Any) -> tuple | None:
        # The pointer names the device too: CUDA's unified addressing gives every
        # allocation of the process an address no other device's allocation has.
        if not isinstance(obj, self._tensor_type) or not obj.is_cuda:
            return None
        return (obj.data_ptr(), obj.numel(), obj.dtype, obj.is_contiguous())

    def key(self, op: str, redop: str | None, algo: str, first: Any, second: Any,
            stream: Any) -> tuple | None:
        """The key of a call on ``first`` (and ``second``, or None), or None where an
        argument is not one this cache recognises (the call then takes the checked path).
        Every call pays this, so it asks the tensors only what identifies them."""
        if self._tensor_type is None:
            torch = sys.modules.get("torch")
            if torch is None:
                return None
            self._tensor_type, self._stream_type = torch.Tensor, torch.cuda.Stream
        one = self._identity(first)
        if one is None:
            return None
        two = None
        if second is not None:
            two = self._identity(second)
            if two is None:
                return None
        if stream is None:
            handle = None
        elif type(stream) is self._stream_type:
            handle = stream.cuda_stream
        else:
            from ..backends.cuda_streams import stream_handle

            handle = stream_handle(stream)
        return (op, redop, algo, one, two, handle)

    def get(self, key: tuple) -> Callable[[], None] | None:
        launch = self._launches.get(key)
        if launch is not None:
            self.hits += 1
        return launch

    def put(self, key: tuple, launch: Callable[[], None]) -> None:
        if len(self._launches) >= _LIMIT:
            self._launches.pop(next(iter(self._launches)))  # the oldest
        self._launches[key] = launch

    def clear(self) -> None:
        self._launches.clear()
