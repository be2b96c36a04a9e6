"""Host one-shot reductions: each rank reads its part of every rank's input and reduces
it in rank order (all of it for all-reduce, its own block for reduce-scatter)."""

from __future__ import annotations

import numpy as np

from .base import Algorithm, HostCall

__all__ = ["HostOneShotAllReduce", "HostOneShotReduceScatter"]


class HostOneShotAllReduce(Algorithm):
    """All-reduce in one step: every rank reduces the whole array from every input. One
    barrier (the path's) when inputs are staged copies; one more when some input is the
    user's memory, and then an output that is that memory is written after it."""

    name = "one-shot"
    op = "all_reduce"
    memory = "host"

    def run(self, call: HostCall) -> None:
        assert call.reducer is not None
        if not call.aliased:
            call.reducer(call.inputs, call.output)
            if call.hold_inputs:
                call.barrier()
            return
        # Our output is our input, which peers are reading: reduce aside, write after.
        result = np.empty_like(call.output)
        call.reducer(call.inputs, result)
        call.barrier()
        call.output[:] = result


class HostOneShotReduceScatter(Algorithm):
    """Reduce-scatter in one step: rank r reduces block r of every input into its
    output. In place the output is block r of rank r's own input, which no peer reads,
    so it may be written at once."""

    name = "one-shot"
    op = "reduce_scatter"
    memory = "host"

    def run(self, call: HostCall) -> None:
        assert call.reducer is not None
        block = call.output.nbytes
        start = call.rank * block
        call.reducer([source[start:start + block] for source in call.inputs], call.output)
        if call.hold_inputs:
            call.barrier()
