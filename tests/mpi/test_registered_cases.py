"""``-R 1`` of the reduction cases: the driver's window is registered with each
communicator the sweep makes, so out-of-place calls read their arrays in place; results
stay exact and the result document says so (host backend, any world size)."""

from __future__ import annotations

import pytest

import ipcshare
from ipcshare.patterns import make_pattern
from ipcshare.patterns.driver import run_pattern
from ipcshare.runtime.config import merge_options

pytestmark = pytest.mark.mpi


def _copies_in(name: str, register: int) -> int:
    """Copies in made by the last communicator of a sweep whose communicator grows twice,
    out of place and in place."""
    options = merge_options({"backend": "host", "min_bytes": "4K", "max_bytes": "64K",
                             "step_factor": 4, "iters": 2, "warmup": 1, "checks": 2})
    with ipcshare.Group(backend="host") as group:
        pattern = make_pattern(name, "one-shot", register=register)
        try:
            result = run_pattern(group, pattern, options, emit=lambda _line: None)
            assert result.wrong_total == 0
            assert result.to_dict().get("registered", False) is bool(register)
            return pattern._communicator.copies_in
        finally:
            pattern.close()


@pytest.mark.parametrize("name", ["allreduce", "reducescatter"])
def test_registered_arrays_are_read_in_place_and_stay_exact(comm, name):
    # On host memory a registered input is read in place, in place too (the one-shot
    # writes an aliased output only after every peer has read it).
    assert _copies_in(name, 0) > 0
    assert _copies_in(name, 1) == 0
