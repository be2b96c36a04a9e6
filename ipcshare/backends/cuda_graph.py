"""CUDA graphs of ipcshare operations: capture what a callable enqueues on a stream, then
replay it with one launch.

Only work whose every launch is identical can be replayed: ipcshare's kernels and the
device barrier keep their epochs on the device for that reason. Waits on signal values
that the host chose (stream memory operations with host-side epochs) would replay stale
values, so the driver binds graph-safe operations before capturing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..runtime.cuda_driver import check, cuda_error, driver
from ..runtime.errors import CudaError

__all__ = ["CapturedGraph"]

# Thread-local capture: other threads of the process may go on using CUDA meanwhile,
# while this thread's unsafe calls (a synchronize during capture) fail loudly.
_CAPTURE_MODE = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL


class CapturedGraph:
    """The work ``enqueue()`` puts on ``stream``, captured once and launchable many times.

    ``close()`` destroys the graph and its executable (idempotent).

    Raises:
        CudaError: capture or instantiation failed; nothing is left behind.
    """

    def __init__(self, stream: Any, enqueue: Callable[[], None]) -> None:
        self._stream = stream
        self._graph: Any = None
        self._exec: Any = None
        check("cuStreamBeginCapture", driver.cuStreamBeginCapture(stream, _CAPTURE_MODE))
        failure: BaseException | None = None
        try:
            enqueue()
        except BaseException as exc:  # end the capture before anything else
            failure = exc
        err, graph = driver.cuStreamEndCapture(stream)
        if failure is not None:
            if err == 0 and graph:
                driver.cuGraphDestroy(graph)
            raise failure
        if err != 0:
            raise cuda_error("cuStreamEndCapture", err,
                             then=" (an operation in the capture is not capturable)")
        self._graph = graph
        try:
            self._exec = check("cuGraphInstantiate", driver.cuGraphInstantiate(graph, 0))
        except BaseException:
            self.close()
            raise
        self._launch = driver.cuGraphLaunch

    @property
    def node_count(self) -> int:
        """Nodes in the captured graph (diagnostics)."""
        if self._graph is None:
            return 0
        _nodes, count = check("cuGraphGetNodes", driver.cuGraphGetNodes(self._graph, 0))
        return int(count)

    def launch(self) -> None:
        """Enqueue one replay on the stream it was captured from.

        Raises:
            CudaError: the graph is closed or the launch failed.
        """
        if self._exec is None:
            raise CudaError("cuGraphLaunch -> the graph was destroyed")
        err, = self._launch(self._exec, self._stream)
        if err:
            raise cuda_error("cuGraphLaunch", err)

    def close(self) -> None:
        """Destroy the executable and the graph (idempotent)."""
        graph_exec, self._exec = self._exec, None
        graph, self._graph = self._graph, None
        if graph_exec is not None:
            driver.cuGraphExecDestroy(graph_exec)
        if graph is not None:
            driver.cuGraphDestroy(graph)

    def __enter__(self) -> CapturedGraph:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
