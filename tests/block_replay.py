"""Thread blocks of a kernel replayed on the host, in an order drawn at random: each block
is a generator that yields what it waits for next (None: nothing, it only lets the others
run), and a block runs on only once ``ready`` says that has come. The replays of the
all-to-all plans (tests/unit/test_all_to_all_*_plan.py) model their kernels' blocks so."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any


def run_in_random_order(blocks: list[Iterator[Any]], ready: Callable[[Any], bool],
                        rng: random.Random) -> None:
    """Step the ``blocks`` to their ends, each step a block drawn from those whose last
    wait ``ready`` accepts. Fails (AssertionError) where every block left waits: the
    protocol replayed deadlocks."""
    waiting: list[tuple[Iterator[Any], Any]] = [(block, None) for block in blocks]
    while waiting:
        runnable = [i for i, (_, need) in enumerate(waiting) if need is None or ready(need)]
        assert runnable, "every block waits: the protocol deadlocks"
        index = rng.choice(runnable)
        block, _ = waiting[index]
        try:
            waiting[index] = (block, next(block))
        except StopIteration:
            waiting.pop(index)
