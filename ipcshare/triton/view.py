"""``device_view``: a window, a communicator's heap and registered arrays described for a
Triton kernel as one int64 CUDA tensor (the peer table of ``table.py``), and the
refusals of what such a kernel cannot run on, each one line. Needs no Triton to build the
description; the tensor needs torch and a GPU backend."""

from __future__ import annotations

import importlib.metadata
import re
from typing import Any

import numpy as np

from ..runtime.errors import CollectiveError, Unsupported, WindowError
from ..runtime.gpu_names import format_uuid
from ..window.layout import TRITON_BARRIER_RANKS
from .table import FIRST_REGISTRATION_ROW, WINDOW_ROW, TableDescription, pack_table

__all__ = ["MIN_TRITON", "DeviceView", "device_view", "require_triton", "describe",
           "check_can_spin", "addresses"]

# Atomics with ``scope=`` (and ``sem=``) first came with Triton 3.0; the device functions
# need both, and ``tl.inline_asm_elementwise`` with ``pack``.
MIN_TRITON = (3, 0)


def _version_tuple(text: str) -> tuple[int, ...]:
    """``3.1.0rc1+git12`` -> (3, 1, 0): the leading numbers, up to the first that is not
    only a number."""
    parts = []
    for piece in text.split("+")[0].split("."):
        number = re.match(r"\d+", piece)
        if number is None:
            break
        parts.append(int(number[0]))
        if number[0] != piece:
            break
    return tuple(parts)


def require_triton(version: str | None = None) -> str:
    """The installed Triton's version, if it is new enough for ``ipcshare.triton``.
    ``version`` stands in for the installed one (tests).

    Raises:
        Unsupported: Triton is not installed, or older than MIN_TRITON.
    """
    minimum = ".".join(map(str, MIN_TRITON))
    if version is None:
        try:
            version = importlib.metadata.version("triton")
        except importlib.metadata.PackageNotFoundError:
            raise Unsupported(f"ipcshare.triton needs Triton {minimum} or newer, which is not "
                              "installed here (pip install triton)") from None
    if _version_tuple(version) < MIN_TRITON:
        raise Unsupported(f"ipcshare.triton needs Triton {minimum} or newer; Triton {version} "
                          "is installed (pip install -U triton)")
    return version


def _window_of(source: Any) -> tuple[Any, str]:
    """The window a view's pads and row 1 come from, and what to call it in errors."""
    from ..collectives.communicator import Communicator
    from ..window.window import Window

    if isinstance(source, Window):
        if source.closed:
            raise WindowError("device_view of a closed window: a kernel given its table would "
                              "read and write unmapped memory")
        return source, "window"
    if isinstance(source, Communicator):
        if source.closed:
            raise CollectiveError("device_view of a closed communicator: a kernel given its "
                                  "table would read and write unmapped memory")
        return source.window, "communicator"
    raise TypeError(f"device_view takes a Window or a Communicator, not "
                    f"{type(source).__name__}")


def check_can_spin(*, device_memory: bool, time_sliced_gpus: dict[str, list[int]], rank: int,
                   world_size: int) -> None:
    """Refuse, in one line, what a Triton kernel that waits for its peers cannot run on.

    Raises:
        Unsupported: host memory; this rank takes turns on its GPU with others (shared
            without MPS: a spinning kernel would wait for a peer that cannot run).
        WindowError: more ranks than barrier_all has words for.
    """
    if not device_memory:
        raise Unsupported("ipcshare.triton runs Triton kernels on GPU memory: this group "
                          "uses host memory (use a GPU backend: cuda-ipc or cuda-vmm)")
    for uuid, ranks in sorted(time_sliced_gpus.items()):
        if rank in ranks:
            raise Unsupported(f"ranks {', '.join(map(str, ranks))} take turns on GPU "
                              f"{format_uuid(uuid)} "
                              "(shared without MPS): a Triton kernel that waits for a peer "
                              "would spin while that peer cannot run; start MPS "
                              "(nvidia-cuda-mps-control -d) or give each rank its own GPU")
    if world_size > TRITON_BARRIER_RANKS:
        raise WindowError(f"{world_size} ranks: barrier_all has words for at most "
                          f"{TRITON_BARRIER_RANKS}")


def describe(source: Any, *registrations: Any) -> TableDescription:
    """What a view of ``source`` (a Window or a Communicator) and ``registrations`` (of
    that communicator) holds: this rank, the pads, the window's and each registration's
    bases. Refuses what a spinning Triton kernel cannot run on.

    Raises:
        WindowError: a closed window; a rank not mapped here (another node, no peer
            access); more ranks than barrier_all has words for.
        CollectiveError: a closed communicator, or an unregistered array.
        Unsupported: host memory, or ranks taking turns on a GPU (no MPS).
        TypeError: ``source`` or a registration of the wrong type.
    """
    from ..collectives.registry import Registration

    window, _ = _window_of(source)
    if registrations and window is not getattr(source, "window", None):
        raise TypeError("registrations belong to a communicator: device_view(comm, reg, ...)")
    for index, registration in enumerate(registrations):
        if not isinstance(registration, Registration):
            raise TypeError(f"registration {index} is a {type(registration).__name__}, not "
                            "what comm.register() returns")
        if registration.closed:
            raise CollectiveError(f"registration {index} was unregistered: its peers' "
                                  "mappings are gone")
    check_can_spin(device_memory=window.backend.device_memory,
                   time_sliced_gpus=window.time_sliced_gpus, rank=window.rank,
                   world_size=window.world_size)
    return addresses(window, *registrations)


def addresses(window: Any, *registrations: Any) -> TableDescription:
    """The addresses a table of ``window`` and ``registrations`` holds, in this process,
    whatever memory they are (``describe`` refuses what a kernel cannot use first).

    Raises:
        WindowError: a rank not mapped here (another node, no peer access).
    """
    memories = (tuple(window.buffer_ptrs),
                *(tuple(r.buffer_ptrs) for r in registrations))
    # Half the group's timeout, as ipcshare's kernels: the kernel names a silent peer
    # before the host gives up on the whole job.
    timeout_ns = int(window.signal_timeout * 0.5e9)
    try:
        return TableDescription(window.rank, tuple(window.signal_pad_ptrs), memories,
                                timeout_ns)
    except ValueError as error:
        raise WindowError(f"device_view: {error}") from None


class DeviceView:
    """A window (or a communicator's heap) and registered arrays as a Triton kernel
    addresses them: ``table`` is an int64 tensor on this rank's GPU holding the rank,
    the world size, each rank's signal pad and, per memory, each rank's base (see
    ``ipcshare.triton.table``). Pass ``*view.args()`` (table, rank, world size) to a
    ``@triton.jit`` kernel. Not collective; cheap to make once and reuse, in CUDA graphs
    too (the table does not change). Keep the view as long as a kernel or a captured
    graph may still use its table, and run none after the window, the communicator or a
    registration of it is closed.
    """

    def __init__(self, source: Any, registrations: tuple[Any, ...],
                 description: TableDescription, tensor: Any) -> None:
        self._source = source
        self._window, self._kind = _window_of(source)
        self._registrations = registrations
        self.description = description
        self.host_table: np.ndarray = pack_table(description)
        self._tensor = tensor

    @property
    def rank(self) -> int:
        return self.description.rank

    @property
    def world_size(self) -> int:
        return self.description.world_size

    @property
    def table(self) -> Any:
        """The peer table on this rank's GPU (a torch int64 tensor).

        Raises:
            WindowError / CollectiveError: the window or communicator was closed, or a
                registration dropped, since the view was made.
        """
        _window_of(self._source)   # refuses a closed window or communicator
        for index, registration in enumerate(self._registrations):
            if registration.closed:
                raise CollectiveError(f"registration {index} of this view was unregistered: "
                                      "its peers' mappings are gone")
        return self._tensor

    def args(self) -> tuple[Any, int, int]:
        """``(table, rank, world_size)``, the arguments a kernel takes for this view."""
        return self.table, self.rank, self.world_size

    def row(self, registration: Any) -> int:
        """The table row of ``registration`` (the ``row`` argument of the device
        functions); the window's row is ``table.WINDOW_ROW`` (1).

        Raises:
            ValueError: ``registration`` is not in this view.
        """
        for index, mine in enumerate(self._registrations):
            if mine is registration:
                return FIRST_REGISTRATION_ROW + index
        raise ValueError("this registration is not in the view: "
                         "device_view(comm, registration, ...)")

    def alignment(self, row: int = WINDOW_ROW) -> int:
        """Bytes (1 to 16, a power of two) by which this rank's base of ``row`` and every
        peer's differ, at the least: pass it as the ``align`` of ``translate``, ``load``,
        ``store``, ``get`` and ``put`` (a ``tl.constexpr`` of the kernel) so that Triton
        vectorises the accesses they make. 16 for the window and the heap on mapped
        memory; smaller for a registered array an allocator placed at such an address.

        Raises:
            ValueError: no such row in this view.
        """
        return self.description.alignment(row)

    def raise_kernel_error(self) -> None:
        """Raise SignalTimeout if a ``barrier_all`` on this rank gave up on a peer (call it
        after the kernel's stream finished)."""
        self._window.raise_kernel_error("a Triton kernel's barrier_all")

    def __repr__(self) -> str:
        return (f"DeviceView(rank {self.rank} of {self.world_size}, {self._kind}, "
                f"{len(self._registrations)} registration(s))")


def device_view(source: Any, *registrations: Any) -> DeviceView:
    """A device-side view for Triton kernels of ``source`` (a ``Window``, or a
    ``Communicator`` whose ``empty()`` arrays lie in its window) and of ``registrations``
    of that communicator (rows 2, 3, ... of the table, in this order). Not collective.

    Raises:
        Unsupported: Triton missing or older than MIN_TRITON; torch missing; host memory;
            ranks taking turns on a GPU (no MPS).
        WindowError / CollectiveError: closed, unregistered or unmapped memory.
    """
    require_triton()
    description = describe(source, *registrations)
    try:
        import torch
    except ImportError:
        raise Unsupported("ipcshare.triton hands Triton its table as a torch tensor: torch is "
                          "not importable here (pip install torch)") from None
    window, _ = _window_of(source)
    table = torch.from_numpy(pack_table(description)).to(f"cuda:{window.backend.device}")
    torch.cuda.synchronize(window.backend.device)
    return DeviceView(source, tuple(registrations), description, table)
