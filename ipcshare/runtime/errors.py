"""Typed exceptions: every error says which rank, on which host, doing what; and the
facts that readers act on (an errno name, a CUDA error name, the failing rank and step)
travel as typed fields beside the message, never only inside it."""

from __future__ import annotations

import dataclasses
import errno as errno_codes
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "IpcShareError",
    "ConfigError",
    "SettingError",
    "OptionError",
    "ExchangeError",
    "ExchangeTimeout",
    "BackendError",
    "BackendUnavailable",
    "CudaError",
    "PeerUnreachable",
    "WindowError",
    "WindowTooLarge",
    "SignalTimeout",
    "PeerDied",
    "VerificationError",
    "KernelCompileError",
    "CollectiveError",
    "Unsupported",
    "error_class",
    "ErrorFacts",
    "CollectiveFailure",
    "error_facts",
    "errno_name_of",
]


@dataclasses.dataclass(frozen=True)
class ErrorFacts:
    """What an error knows as typed facts, gathered along the errors that caused it, for
    readers that must not parse messages (the doctor's rules): ``errno`` is the kernel's
    name of the OSError behind it (``EMFILE``, ``EPERM``...), ``cuda_error`` the CUDA
    error name of the CudaError behind it (``CUDA_ERROR_NOT_PERMITTED``...),
    ``peer_unreachable`` the PeerUnreachable behind it as plain data (its ``facts()``),
    ``setting`` the SettingError behind it as plain data (``{"name", "value"}``)."""

    errno: str | None = None
    cuda_error: str | None = None
    peer_unreachable: dict[str, Any] | None = None
    setting: dict[str, str] | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class CollectiveFailure:
    """The facts of an error that fail-together agreement raised on every rank
    (``liveness.consensus``): the step, the first failing rank (numbered as the group's
    communicator numbers it) and its host, every rank that failed, and the typed facts of
    the first failing rank's own error."""

    step: str
    rank: int
    host: str
    ranks: tuple[int, ...]
    facts: ErrorFacts


class IpcShareError(Exception):
    """Base class of every error ipcshare raises on purpose.

    ``failure`` is set on the error that fail-together agreement raises on every rank
    (None elsewhere): who failed at which step, and why, as typed facts.
    """

    failure: CollectiveFailure | None = None


class ConfigError(IpcShareError, ValueError):
    """Bad option, flag, size or YAML config."""


class SettingError(ConfigError):
    """A malformed ``IPCSHARE_*`` environment variable: ``setting`` names it and ``value``
    is what it held (typed facts the doctor's rules read instead of the message)."""

    def __init__(self, message: str, *, setting: str = "", value: object = "") -> None:
        # Keywords, so that agreement can rebuild it on every rank from its message alone
        # (the typed facts travel beside it, in ErrorFacts).
        super().__init__(message)
        self.setting = setting
        self.value = str(value)

    def facts(self) -> dict[str, str]:
        return {"name": self.setting, "value": self.value}


class OptionError(ConfigError):
    """A run option's value is refused, said without committing to how the user named it.

    ``template`` is the message with ``{0}``, ``{1}``... where each of ``options`` is named
    with its value; ``options`` are ``(field, value)`` pairs, the field a PatternOptions
    field and the value as this layer saw it, spelled for people (``1M``, not 1048576).
    ``str()`` names them as option keys (``min_bytes 0: must be at least 1 byte``), as a
    YAML file or a library caller writes them; ``render`` lets whoever knows where each
    value came from name it their way (a command line's ``-b/--minbytes 0``).

    Raised again on every rank by fail-together agreement, it is the rendered message
    alone (no ``options``).
    """

    def __init__(self, template: str, *options: tuple[str, str]) -> None:
        self.template = template
        self.options = options
        super().__init__(self.render(lambda field, shown: f"{field} {shown}"))

    def render(self, name: Callable[[str, str], str]) -> str:
        """The message with each option named by ``name(field, value)``."""
        if not self.options:
            return self.template
        return self.template.format(*(name(field, shown) for field, shown in self.options))


class ExchangeError(IpcShareError):
    """A handle or descriptor could not travel between ranks."""


class ExchangeTimeout(ExchangeError, TimeoutError):
    """A peer did not show up in time at a descriptor exchange."""


class BackendError(IpcShareError):
    """Allocate, export, import or map failed in a memory backend."""


class BackendUnavailable(BackendError):
    """The requested backend cannot run here (no GPU, no driver, no memfd...)."""


class CudaError(BackendError):
    """A CUDA driver call failed; the message starts with the call and the error name.

    ``call`` and ``error_name`` (``CUDA_ERROR_...``) hold the same as fields, where the
    checked call knew them (``runtime.cuda_driver.cuda_error``).
    """

    def __init__(self, message: str, *, call: str | None = None,
                 error_name: str | None = None) -> None:
        super().__init__(message)
        self.call = call
        self.error_name = error_name


class PeerUnreachable(BackendError):
    """This rank's GPU may not map a peer GPU's memory: no peer-to-peer path between
    them, or the pair was disabled on purpose (``disabled_by_setting``: the user's
    IPCSHARE_DISABLE_P2P named it). The other ranks of a group raise it with the message
    alone; the fields then travel in ``failure``."""

    def __init__(self, message: str, *, device: str | None = None, peer: str | None = None,
                 reason: str | None = None, disabled_by_setting: bool | None = None) -> None:
        super().__init__(message)
        self.device = device
        self.peer = peer
        self.reason = reason
        self.disabled_by_setting = disabled_by_setting

    def facts(self) -> dict[str, Any]:
        """The error as plain data: device, peer, reason, disabled_by_setting, message."""
        return {"device": self.device, "peer": self.peer, "reason": self.reason,
                "disabled_by_setting": self.disabled_by_setting, "message": str(self)}


class WindowError(IpcShareError):
    """A collective window operation was misused (size mismatch, closed window...)."""


class WindowTooLarge(WindowError):
    """A window needs more memory than the node has for it (the message says how much
    each side is); callers that chose its size from an option say which to lower."""


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
    IpcShareError, ConfigError, SettingError, OptionError, ExchangeError, ExchangeTimeout,
    BackendError, BackendUnavailable, CudaError, PeerUnreachable, WindowError, WindowTooLarge,
    SignalTimeout, VerificationError, KernelCompileError, PeerDied, CollectiveError,
    Unsupported)}


def error_class(name: str) -> type[IpcShareError]:
    """The ipcshare error class called ``name`` (IpcShareError when unknown).

    Used to re-raise on every rank the same type that one rank hit.
    """
    return _BY_NAME.get(name, IpcShareError)


def _causes(error: BaseException) -> Iterator[BaseException]:
    """``error`` and the errors behind it, as Python's traceback shows them: the
    explicit cause, else the error being handled unless ``from None`` hid it."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        if current.__cause__ is not None:
            current = current.__cause__
        elif not current.__suppress_context__:
            current = current.__context__
        else:
            current = None


def error_facts(error: BaseException) -> ErrorFacts:
    """The typed facts of ``error`` and the errors behind it: the nearest of each kind
    wins; an error that agreement raised contributes its failing rank's facts."""
    found: dict[str, Any] = {field.name: None for field in dataclasses.fields(ErrorFacts)}
    for seen in _causes(error):
        candidates: dict[str, Any] = {}
        if isinstance(seen, IpcShareError) and seen.failure is not None:
            candidates = seen.failure.facts.to_dict()
        if isinstance(seen, OSError) and seen.errno is not None:
            candidates["errno"] = errno_codes.errorcode.get(seen.errno, str(seen.errno))
        if isinstance(seen, CudaError) and seen.error_name:
            candidates["cuda_error"] = seen.error_name
        if isinstance(seen, PeerUnreachable):
            candidates["peer_unreachable"] = seen.facts()
        if isinstance(seen, SettingError) and seen.setting:
            candidates["setting"] = seen.facts()
        for key, value in candidates.items():
            if found[key] is None and value is not None:
                found[key] = value
    return ErrorFacts(**found)


def errno_name_of(error: BaseException) -> str | None:
    """The errno name of the OSError behind ``error`` (itself or along its causes), or
    None when no system call failed."""
    return error_facts(error).errno
