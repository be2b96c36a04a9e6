"""Memory backends: host shared memory, legacy cudaIpc, cuMem VMM.

``open_backend`` is the one place that maps a backend name to its class; GPU backends
are imported only when asked for, so a machine without CUDA never loads them.
"""

from __future__ import annotations

from ..runtime.config import BACKENDS, as_typed
from ..runtime.errors import BackendUnavailable, ConfigError, OptionError
from .base import Allocation, Backend, Buffer, Engine, Exported

__all__ = ["open_backend", "gpu_count", "resolve_backend_name", "check_handle", "BACKEND_NAMES",
           "Allocation", "Backend", "Buffer", "Engine", "Exported"]

# The backends by name, without ``auto``: config.BACKENDS is the one list (options are
# checked on the floor below this one, where the names must already be known).
BACKEND_NAMES = tuple(name for name in BACKENDS if name != "auto")


def gpu_count() -> tuple[int, str]:
    """(number of visible CUDA devices, reason when zero). Never raises."""
    try:
        from ..runtime import cuda_driver
    except ImportError as exc:
        return 0, f"cuda-python is not installed ({exc.name or exc})"
    try:
        return cuda_driver.device_count(), "no CUDA device is visible"
    except Exception as exc:
        return 0, str(exc)


def resolve_backend_name(name: str) -> str:
    """``auto`` -> ``cuda-vmm`` when a GPU is visible here, else ``host``."""
    if name != "auto":
        return name
    count, _reason = gpu_count()
    return "cuda-vmm" if count > 0 else "host"


def check_handle(backend: str, handle: str) -> None:
    """Raise unless backend ``backend`` (``auto``: as it resolves here) exports its memory
    by ``handle`` handles: only cuda-vmm has a choice, and the others would ignore it.

    Raises:
        OptionError: a fabric handle asked of another backend than cuda-vmm.
    """
    if handle == "posix-fd":  # every backend's default: a descriptor, or its own handle
        return
    chosen = resolve_backend_name(backend)
    if chosen != "cuda-vmm":
        here = chosen if chosen == backend else f"{chosen} (auto's choice here)"
        raise OptionError(f"{{0}}: {handle} handles export cuMem allocations of GPU memory: "
                          f"they need a GPU backend, cuda-vmm, and the backend is {here}",
                          ("handle", as_typed(handle)))


def open_backend(name: str, *, local_rank: int = 0, local_size: int = 1,
                 handle: str = "posix-fd") -> Backend:
    """Create the backend called ``name`` (``auto`` must be resolved by the caller).

    Raises:
        ConfigError: unknown name.
        OptionError: a ``handle`` the backend does not export by (``check_handle``).
        BackendUnavailable: the backend cannot run here (e.g. no GPU), with the reason.
    """
    check_handle(name, handle)
    if name == "host":
        from .host import HostBackend

        return HostBackend(local_size=local_size)
    if name in ("cuda-ipc", "cuda-vmm"):
        count, reason = gpu_count()
        if count == 0:
            raise BackendUnavailable(
                f"backend {name!r} needs a GPU, but {reason}; use backend='host' or "
                "backend='auto'")
        if name == "cuda-ipc":
            from .cuda_ipc import CudaIpcBackend

            return CudaIpcBackend(local_rank=local_rank, local_size=local_size)
        from .cuda_vmm import CudaVmmBackend

        return CudaVmmBackend(local_rank=local_rank, local_size=local_size, handle=handle)
    raise ConfigError(f"unknown backend {name!r}; choose one of: auto, {', '.join(BACKEND_NAMES)}")
