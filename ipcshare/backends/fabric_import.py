"""Why a cuMem fabric handle did not import, and what fixes it. Fabric handles are what
maps memory across the hosts of one NVLink domain (GB200 NVL72-class systems, through
nvidia-imex); the driver's own error ("invalid resource handle", "not permitted") names
neither the cause nor the fix."""

from __future__ import annotations

__all__ = ["fabric_import_hint"]

_DOMAIN = ("the exporting GPU is not in this GPU's NVLink domain (another NVLink cluster or "
           "clique: `ipcshare doctor` shows each GPU's), or the IMEX daemons of the two "
           "hosts do not know each other")
_CAUSES = {
    "CUDA_ERROR_NOT_PERMITTED": (
        "this process may not import fabric handles: no IMEX channel "
        "(/dev/nvidia-caps-imex-channels/channelN) is visible here",
        "run nvidia-imex on every host of the domain, create channel0 (nvidia-imex-ctl or "
        "the driver's NVreg_CreateImexChannel0=1) and pass it into containers"),
    "CUDA_ERROR_INVALID_HANDLE": (_DOMAIN, "place the ranks that share memory on hosts of "
                                  "one NVLink domain, with one IMEX domain spanning them "
                                  "(nodes_config.cfg lists the same hosts everywhere)"),
    "CUDA_ERROR_INVALID_VALUE": (_DOMAIN, "place the ranks that share memory on hosts of "
                                 "one NVLink domain, with one IMEX domain spanning them"),
    "CUDA_ERROR_NOT_SUPPORTED": (
        "this GPU or driver has no fabric handles (no NVLink domain across hosts)",
        "use posix-fd handles within a node, and NCCL between nodes (--inter nccl)"),
}


def fabric_import_hint(error_name: str, *, exporter: str = "the peer",
                       same_host: bool | None = None) -> str:
    """One sentence of cause and fix for ``cuMemImportFromShareableHandle`` of a fabric
    handle from ``exporter`` failing with ``error_name`` (``CUDA_ERROR_...``)."""
    cause, fix = _CAUSES.get(error_name, (
        "the driver refused the fabric handle", "check `ipcshare doctor` (fabric state, "
        "clique and IMEX channel of every GPU)"))
    where = "" if same_host is None else (" (same host)" if same_host else " (another host)")
    return f"importing the fabric handle of {exporter}{where} failed: {cause}; fix: {fix}"
