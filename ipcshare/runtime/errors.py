"""Typed exceptions: every error says which rank, on which host, doing what."""

from __future__ import annotations

__all__ = [
    "IpcShareError",
    "ConfigError",
    "ExchangeError",
    "ExchangeTimeout",
    "BackendError",
    "BackendUnavailable",
    "CudaError",
    "WindowError",
    "SignalTimeout",
    "PeerDied",
    "VerificationError",
    "KernelCompileError",
    "CollectiveError",
    "Unsupported",
    "error_class",
]


class IpcShareError(Exception):
    """Base class of every error ipcshare raises on purpose."""


class ConfigError(IpcShareError, ValueError):
    """Bad option, flag, size or YAML config."""


class ExchangeError(IpcShareError):
    """A handle or descriptor could not travel between ranks."""


class ExchangeTimeout(ExchangeError, TimeoutError):
    """A peer did not show up in time at a descriptor exchange."""


class BackendError(IpcShareError):
    """Allocate, export, import or map failed in a memory backend."""


class BackendUnavailable(BackendError):
    """The requested backend cannot run here (no GPU, no driver, no memfd...)."""


class CudaError(BackendError):
    """A CUDA driver call failed; the message starts with the call and the error name."""


class WindowError(IpcShareError):
    """A collective window operation was misused (size mismatch, closed window...)."""


class SignalTimeout(IpcShareError, TimeoutError):
    """A peer never raised the signal that this rank waited for."""


class PeerDied(IpcShareError):
    """A rank of the group exited (was killed, crashed) while the group was open."""


class KernelCompileError(IpcShareError):
    """NVRTC is missing or a kernel does not compile (the message carries NVRTC's log)."""


class CollectiveError(IpcShareError, ValueError):
    """A collective call was misused (array, dtype, op, size, algorithm), or its ranks
    disagree on what they call."""


class Unsupported(IpcShareError, NotImplementedError):
    """What was asked exists in the API but not (yet) for this backend; the message
    names what is missing."""


class VerificationError(IpcShareError):
    """A pattern produced bytes that differ from the expected ones."""


_BY_NAME = {cls.__name__: cls for cls in (
    IpcShareError, ConfigError, ExchangeError, ExchangeTimeout, BackendError,
    BackendUnavailable, CudaError, WindowError, SignalTimeout, VerificationError,
    KernelCompileError, PeerDied, CollectiveError, Unsupported)}


def error_class(name: str) -> type[IpcShareError]:
    """The ipcshare error class called ``name`` (IpcShareError when unknown).

    Used to re-raise on every rank the same type that one rank hit.
    """
    return _BY_NAME.get(name, IpcShareError)
