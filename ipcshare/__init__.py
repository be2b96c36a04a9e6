"""ipcshare: share GPU (or host) memory between MPI ranks, map every peer's buffer, and
run verified ring and all-gather patterns on it.

Importing the package is cheap: MPI and CUDA start only when a Group is created.
"""

from __future__ import annotations

from .runtime import errors
from .runtime.errors import (
    BackendError,
    BackendUnavailable,
    CollectiveError,
    ConfigError,
    CudaError,
    ExchangeError,
    ExchangeTimeout,
    IpcShareError,
    KernelCompileError,
    OptionError,
    PeerDied,
    PeerUnreachable,
    SettingError,
    SignalTimeout,
    Unsupported,
    VerificationError,
    WindowError,
    WindowTooLarge,
)

__version__ = "0.1.0"

# The typed errors are public API (``from ipcshare import SignalTimeout``); they live on the
# ground floor (runtime/errors.py), which imports only the standard library, so naming them
# here stays cheap.
__all__ = ["Group", "Window", "Communicator", "__version__", "errors",
           "IpcShareError", "ConfigError", "SettingError", "OptionError", "ExchangeError",
           "ExchangeTimeout", "BackendError", "BackendUnavailable", "CudaError",
           "PeerUnreachable", "WindowError", "WindowTooLarge", "SignalTimeout", "PeerDied",
           "VerificationError", "KernelCompileError", "CollectiveError", "Unsupported"]


def __getattr__(name: str):
    # Group, Window and Communicator pull in the window and collectives floors: loaded on
    # first use so that importing ipcshare (and `ipcshare --help`) stays light.
    if name in ("Group", "Window"):
        from . import window

        return getattr(window, name)
    if name == "Communicator":
        from .collectives import Communicator

        return Communicator
    raise AttributeError(f"module 'ipcshare' has no attribute {name!r}")
