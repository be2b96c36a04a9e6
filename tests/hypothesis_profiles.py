"""The suite's Hypothesis profiles, and how many examples a property test tries.

``quick`` (the default: `make test`): each property test tries a fifth of the examples it
asks for (at least 10), a new draw on every run, so runs add up to what one thorough run
covers. ``thorough`` (`make test-slow` runs the property tests again with
``--hypothesis-profile thorough``): every example each test asks for.
"""

from __future__ import annotations

from hypothesis import settings

__all__ = ["QUICK", "THOROUGH", "examples"]

QUICK, THOROUGH = "quick", "thorough"
_QUICK_SHARE = 5
_MIN_EXAMPLES = 10

# Tests that ask for no number get Hypothesis's 100 examples, or a fifth of them.
settings.register_profile(THOROUGH, max_examples=100)
settings.register_profile(QUICK, max_examples=100 // _QUICK_SHARE)


def examples(asked: int) -> int:
    """How many examples a property test that asks for ``asked`` tries under the profile
    loaded now: all of them under ``thorough``, a fifth (at least 10) otherwise."""
    if settings.get_current_profile_name() == THOROUGH:
        return asked
    return max(_MIN_EXAMPLES, asked // _QUICK_SHARE)
