"""A communicator whose calls run on a torch stream that is also torch's current stream,
as they would in an application, for the GPU tests of the collectives (torch is imported
by the caller, which skips without it)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import ipcshare

from ..sizing import max_bytes_for


@contextlib.contextmanager
def torch_communicator(backend: str, max_bytes: int, *,
                       per_rank_bytes: int = 0) -> Iterator[tuple[Any, Any, Any]]:
    """``(group, communicator, stream)``: a group on ``backend`` whose device is torch's,
    a communicator of ``max_bytes`` or more: enough for ``per_rank_bytes`` from every rank
    of the group (the test's largest all-gather output or reduce-scatter input, which
    grows with the world size), and a fresh torch stream made current for the block."""
    import torch

    with ipcshare.Group(backend=backend) as group:
        device = group.backend.device
        torch.cuda.set_device(device)
        stream = torch.cuda.Stream(device=device)
        sized = max_bytes_for(group.size, per_rank_bytes, at_least=max_bytes)
        with group.communicator(max_bytes=sized) as communicator, torch.cuda.stream(stream):
            yield group, communicator, stream
