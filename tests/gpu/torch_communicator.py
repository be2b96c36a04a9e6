"""A communicator whose calls run on a torch stream that is also torch's current stream,
as they would in an application, for the GPU tests of the collectives (torch is imported
by the caller, which skips without it)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import ipcshare


@contextlib.contextmanager
def torch_communicator(backend: str, max_bytes: int) -> Iterator[tuple[Any, Any, Any]]:
    """``(group, communicator, stream)``: a group on ``backend`` whose device is torch's,
    a communicator of ``max_bytes``, and a fresh torch stream made current for the block."""
    import torch

    with ipcshare.Group(backend=backend) as group:
        device = group.backend.device
        torch.cuda.set_device(device)
        stream = torch.cuda.Stream(device=device)
        with group.communicator(max_bytes=max_bytes) as communicator, torch.cuda.stream(stream):
            yield group, communicator, stream
