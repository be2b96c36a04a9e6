"""What a GPU test expects of a call its own rank's checks refuse (every rank of the test
refusing alike): the call raises on this rank, naming the lowest refusing rank and the
argument where the call could be made marked, and what the check said in the error or its
note (collectives/call_marks.py)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from ipcshare.runtime.errors import CollectiveError


def assert_refused(call: Callable[[], Any], said: str) -> CollectiveError:
    """Make ``call``, which this rank's checks refuse, and assert that it raises with
    ``said`` (a pattern) in the error's message or its notes; return the error."""
    with pytest.raises(CollectiveError) as caught:
        call()
    text = " ".join([str(caught.value), *getattr(caught.value, "__notes__", ())])
    assert re.search(said, text), text
    return caught.value
