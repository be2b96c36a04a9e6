"""What both GPU backends share: device binding, the retained primary context, the
stream engine, the kernels loaded in that context, the peer-mapping cache, capacity."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from ..runtime import cuda_driver
from ..runtime.cuda_driver import check, driver
from ..runtime.errors import BackendError, PeerUnreachable
from ..runtime.gpu_names import format_uuid
from ..runtime.owned_fd import OwnedFd
from ..topology import devices
from .base import Backend, Exported
from .cuda_engine import CudaEngine
from .device_buffer import DeviceAllocation, ImportCache

if TYPE_CHECKING:
    from .ipc_handle import IpcHandleInfo

__all__ = ["DeviceBackend"]


class DeviceBackend(Backend):
    """What the GPU backends share: this rank's device (``local_rank % device_count``),
    a retained primary context made current, one CudaEngine, the peer-mapping cache.

    Raises:
        BackendUnavailable: no device visible.
        ConfigError: too many ranks per GPU (IPCSHARE_MAX_RANKS_PER_GPU).
        CudaError: the driver failed.
    """

    device_memory = True
    has_kernels = True

    def __init__(self, *, local_rank: int = 0, local_size: int = 1) -> None:
        self._closed = False
        self._engine: CudaEngine | None = None
        self._imports = ImportCache()
        self._kernels: dict[str, Any] = {}  # source file -> LoadedKernels in our context
        self._collectives: Any = None  # CollectiveKernels over the units in _kernels
        self.device = devices.bind_device(local_rank, local_size)
        self._sharing = devices.ranks_sharing(self.device, local_size, cuda_driver.device_count())
        self._local_size = local_size
        self._context = cuda_driver.PrimaryContext(self.device)
        try:
            self.uuid = cuda_driver.device_uuid(self.device)
            self.under_mps = cuda_driver.mps_client(self.device)
            self._label = (f"cuda:{self.device} {cuda_driver.device_name(self.device)} "
                           f"{format_uuid(self.uuid)[:12]}")
            self._peer_ordinals: dict[bytes, int] | None = None
            self._engine = CudaEngine(self.device)
        except BaseException:
            self._context.close()
            raise

    def engine(self) -> CudaEngine:
        if self._engine is None:
            raise BackendError(f"{self.name} backend is closed")
        return self._engine

    def kernels(self, source: str) -> Any:
        """ipcshare's kernels from ``source`` (a file of kernels/src, or ``collectives.cu``:
        every collective unit, each loaded at its first entry), loaded into this backend's
        context once: the package's shipped CUBIN for this device's architecture where it
        matches, else compiled with NVRTC (and cached).

        Raises:
            KernelCompileError: NVRTC missing or the source does not compile.
            CudaError: the CUBIN does not load.
        """
        if self._closed:
            raise BackendError(f"{self.name} backend is closed")
        from ..kernels.compiler import COLLECTIVES

        if source == COLLECTIVES:
            if self._collectives is None:
                from ..kernels.launcher import CollectiveKernels

                self._collectives = CollectiveKernels(self.kernels)
            return self._collectives
        if source not in self._kernels:
            from ..kernels.compiler import compile_kernel_source, device_arch
            from ..kernels.launcher import LoadedKernels
            from ..kernels.trace import build_options

            cubin = compile_kernel_source(source, arch=device_arch(self.device),
                                          options=build_options(source))
            self._context.make_current()
            self._kernels[source] = LoadedKernels(cubin)
        return self._kernels[source]

    def allocate_private(self, nbytes: int, *,
                         what: str = "private device allocation") -> DeviceAllocation:
        """cuMemAlloc ``nbytes`` (256-byte aligned or better): memory the legacy IPC path
        exports, or that never leaves this process (tables the kernels read).

        Raises:
            CudaError: out of memory, or another driver failure.
        """
        self._context.make_current()
        ptr = int(check("cuMemAlloc", driver.cuMemAlloc(nbytes)))
        return DeviceAllocation(ptr, nbytes, self.device, functools.partial(_free_private, ptr),
                                what=what)

    @property
    def imports_mapped(self) -> int:
        """Distinct peer allocations mapped by this backend right now."""
        return len(self._imports)

    @property
    def ranks_per_device(self) -> int:
        """Ranks of this node bound to this rank's device (this one included).

        Computed assuming every rank of the node sees the same devices; a caller that
        knows better (ranks compared device UUIDs) sets it, and capacity follows.
        """
        return self._sharing

    @ranks_per_device.setter
    def ranks_per_device(self, ranks: int) -> None:
        if ranks < 1:
            raise ValueError(f"ranks_per_device must be at least 1, got {ranks}")
        self._sharing = ranks

    def capacity_bytes(self) -> int | None:
        """Free device memory, scaled so that the window's per-node check
        (bytes per rank x ranks on the node) compares against what one GPU holds.

        Raises:
            CudaError: the query failed.
        """
        self._context.make_current()
        free, _total = cuda_driver.mem_get_info()
        return free * self._local_size // self._sharing

    def describe_device(self) -> str:
        return self._label

    def _check_peer_reachable(self, peer_uuid: bytes) -> None:
        # The driver would fail later with a bare error; name the two GPUs instead.
        if peer_uuid == self.uuid:
            return
        if self._peer_ordinals is None:
            self._peer_ordinals = {cuda_driver.device_uuid(o): o
                                   for o in range(cuda_driver.device_count())}
        peer = self._peer_ordinals.get(peer_uuid)
        if peer is None:
            return
        access = devices.peer_access(self.device, peer)
        if not access.ok:
            raise PeerUnreachable(
                f"cuda:{self.device} cannot reach the memory of cuda:{peer} "
                f"({format_uuid(peer_uuid)}) peer-to-peer: {access.why}",
                device=f"cuda:{self.device}", peer=f"cuda:{peer}", reason=access.why,
                disabled_by_setting=access.disabled_by_setting)

    def open_legacy_ipc(self, info: IpcHandleInfo, nbytes: int, *,
                        what: str) -> DeviceAllocation:
        """Open a peer's cuIpcMemHandle here (once per distinct handle; later opens
        share the mapping), viewing its first ``nbytes``.

        Raises:
            PeerUnreachable: GPUs without P2P (a BackendError).
            CudaError: cuIpcOpenMemHandle failed.
        """
        self._context.make_current()
        self._check_peer_reachable(info.device_uuid)

        def open_mapping() -> tuple[int, int, functools.partial]:
            handle = driver.CUipcMemHandle()
            handle.reserved = info.handle
            flags = int(driver.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
            ptr = int(check("cuIpcOpenMemHandle", driver.cuIpcOpenMemHandle(handle, flags)))
            return ptr, info.nbytes, functools.partial(_close_ipc, ptr)

        return self._imports.acquire(info.handle, open_mapping, nbytes, self.device, what=what)

    def share_existing(self, ptr: int, nbytes: int) -> tuple[Exported, int]:
        """Device memory the user allocated (a cudaMalloc block by legacy IPC, a cuMem
        allocation by POSIX FD); device_existing says what qualifies.

        Raises:
            BackendError: memory that cannot be shared, naming why.
            CudaError: the export failed.
        """
        from .device_existing import export_device_range

        self._context.make_current()
        return export_device_range(self, ptr, nbytes)

    def open_existing(self, payload: bytes, fd: OwnedFd | None) -> DeviceAllocation:
        """Map a peer's registered allocation here.

        Raises:
            BackendError: malformed payload, no P2P, missing descriptor.
            CudaError: the import or map failed (undone).
        """
        from .device_existing import open_device_range

        self._context.make_current()
        return open_device_range(self, payload, fd)

    def close(self) -> None:
        """Unmap peers still mapped, destroy the stream, release the context
        (idempotent).

        Raises:
            CudaError: a release failed (every step is still attempted).
        """
        if self._closed:
            return
        self._closed = True
        engine, self._engine = self._engine, None
        try:
            self._context.make_current()
            self._collectives = None
            for loaded in self._kernels.values():
                loaded.close()
            self._kernels.clear()
            self._imports.close()
        finally:
            try:
                if engine is not None:
                    engine.close()
            finally:
                self._context.close()



def _free_private(ptr: int) -> None:
    check("cuMemFree", driver.cuMemFree(ptr))


def _close_ipc(ptr: int) -> None:
    check("cuIpcCloseMemHandle", driver.cuIpcCloseMemHandle(ptr))
