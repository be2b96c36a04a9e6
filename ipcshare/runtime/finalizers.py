"""The one way ipcshare's finalizers end an unclosed resource: release it first, then
warn, and never raise.

Release comes before the warning because a warning filter set to ``error`` (as the test
suite sets for ResourceWarning) turns the warning into an exception, which must not stop
the release. A finalizer holds plain values and the release callable, never the owner.
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Callable

__all__ = ["release_then_warn", "finalize_unclosed", "release_now"]


def release_then_warn(release: Callable[[], object], message: str) -> None:
    """Run ``release``, then warn ``ResourceWarning(message)``; swallow every failure
    (a finalizer runs at collection or at exit, where nobody could catch it)."""
    try:
        release()
    except Exception:  # a finalizer warns, never raises
        pass
    with contextlib.suppress(Exception):
        warnings.warn(message, ResourceWarning, stacklevel=1)


def finalize_unclosed(owner: object, release: Callable[[], object],
                      message: str) -> weakref.finalize:
    """A finalizer that runs ``release`` and warns ``message`` if ``owner`` is collected
    before its ``close()`` detached it. ``close()`` calls ``finalizer.detach()`` and then
    releases by itself, so that its own errors still reach the caller."""
    return weakref.finalize(owner, release_then_warn, release, message)


def release_now(finalizer: weakref.finalize, release: Callable[[], object]) -> None:
    """What an owner's ``close()`` does: disarm ``finalizer`` and run ``release``, once
    (idempotent: nothing happens after the first call). ``release``'s errors reach the
    caller; the resource counts as released either way."""
    if finalizer.alive:
        finalizer.detach()
        release()
