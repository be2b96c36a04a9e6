"""How far the doctor goes: sizes, bounds, time budgets and the thresholds it judges by.

Every number the doctor uses lives here, so ``--quick`` and the full run differ in one
place and the thresholds in docs/DOCTOR.md have one source.
"""

from __future__ import annotations

import dataclasses

from ..runtime import settings

__all__ = [
    "DoctorPlan",
    "doctor_timeout",
    "EXPECTED_MIN_GBPS",
    "HOST_STAGED_MAX_GBPS",
    "APP_WINDOWS",
    "DESCRIPTOR_MARGIN",
    "MAPPINGS_SLACK",
    "GPU_MEMORY_SLACK",
    "DEFAULT_TIMEOUT_S",
    "SMALL_DEV_SHM",
]

# A GPU pair slower than this for its link type is flagged "correct but slow" (GB/s, 1e9).
# H200 NVLink 4 (NV18) gives ~380 GB/s per direction over the copy engine; PCIe Gen4 x16
# ~25 GB/s; two ranks on one GPU copy inside its memory (over 1 TB/s). The floors are
# far below those figures on purpose: they catch broken or rerouted links, not tuning.
# A link whose type is unknown (no nvidia-smi) is held to the PCIe floor.
EXPECTED_MIN_GBPS = {"nvlink": 200.0, "pcie": 10.0, "same-gpu": 200.0, "unknown": 10.0}
# Peer copies staged through pinned host memory (no peer access) run at host memory and PCIe
# speed; a pair the driver calls P2P-capable measured at or below this over NVLink went so.
HOST_STAGED_MAX_GBPS = 60.0

# Descriptor budget: an application is assumed to hold this many windows at once. A host
# window keeps one descriptor for its memfd and one per mapping on every rank of the
# node (CPython's mmap keeps a duplicate), so a rank needs about (local ranks + 1) per
# window, plus one window being built, plus what is already open, plus a margin.
APP_WINDOWS = 16
DESCRIPTOR_MARGIN = 64

# Leak check tolerances. Descriptors and ipcshare's memfd mappings must come back
# exactly; the total mapping count also moves with the allocator's arenas; freed device
# memory may come back a granule or two late.
MAPPINGS_SLACK = 64
GPU_MEMORY_SLACK = 8 << 20

# Docker's default /dev/shm; MPI and NCCL need more than that (ipcshare's memfd does not).
SMALL_DEV_SHM = 512 << 20

DEFAULT_TIMEOUT_S = 60.0


def doctor_timeout() -> float:
    """``IPCSHARE_DOCTOR_TIMEOUT`` (seconds a rank may be late at a checkpoint), default 60.

    Raises:
        ConfigError: not a positive number.
    """
    return settings.seconds(settings.DOCTOR_TIMEOUT, DEFAULT_TIMEOUT_S)


@dataclasses.dataclass(frozen=True)
class DoctorPlan:
    """Sizes and bounds of one doctor run (``quick`` or full)."""

    quick: bool
    # Capability matrix: bytes each peer writes into each owner's window.
    matrix_slot_bytes: int
    # When a node-wide window fails, retry the path pair by pair to tell which pairs work.
    pairwise_diagnosis: bool
    # Bandwidth matrix: one write of this many bytes per ordered pair, timed `repeats`
    # times after a warm-up, then `latency_writes` 4-byte writes.
    host_bandwidth_bytes: int
    gpu_bandwidth_bytes: int
    bandwidth_repeats: int
    latency_writes: int
    # Limits: windows opened (and held) until failure, this bound or the time budget.
    window_bound: int
    window_time_budget_s: float
    # Largest allocation that exports: doubling up to the cap, then a short bisection.
    host_export_cap: int
    gpu_export_cap: int
    export_bisect_steps: int
    # Virtual-address headroom: cuMemAddressReserve doubling from 1 GiB up to this.
    va_probe_cap: int
    # `lspci -vvv` for PCIe ACS (can take a second on big machines).
    probe_pci_acs: bool
    # Host-staging probe (GPUs 0 and 1 of a node, peer access off and on): bytes per copy,
    # 0 to skip it (a few seconds: CUDA contexts in a process of its own).
    staging_probe_bytes: int = 0
    # Liveness: how late a rank may be at a checkpoint before it is reported.
    timeout_s: float = DEFAULT_TIMEOUT_S

    @classmethod
    def make(cls, *, quick: bool, timeout_s: float | None = None) -> DoctorPlan:
        """The quick or the full plan; ``timeout_s`` defaults to ``doctor_timeout()``.

        Raises:
            ConfigError: a bad IPCSHARE_DOCTOR_TIMEOUT.
        """
        timeout = doctor_timeout() if timeout_s is None else timeout_s
        if quick:
            return cls(quick=True, matrix_slot_bytes=64 << 10, pairwise_diagnosis=False,
                       host_bandwidth_bytes=1 << 20, gpu_bandwidth_bytes=16 << 20,
                       bandwidth_repeats=2, latency_writes=20, window_bound=32,
                       window_time_budget_s=2.0, host_export_cap=16 << 20,
                       gpu_export_cap=256 << 20, export_bisect_steps=0,
                       va_probe_cap=1 << 40, probe_pci_acs=False, timeout_s=timeout)
        return cls(quick=False, matrix_slot_bytes=1 << 20, pairwise_diagnosis=True,
                   host_bandwidth_bytes=16 << 20, gpu_bandwidth_bytes=64 << 20,
                   bandwidth_repeats=5, latency_writes=100, window_bound=1000,
                   window_time_budget_s=15.0, host_export_cap=256 << 20,
                   gpu_export_cap=8 << 30, export_bisect_steps=4,
                   va_probe_cap=1 << 47, probe_pci_acs=True, staging_probe_bytes=64 << 20,
                   timeout_s=timeout)

    @property
    def group_timeout_s(self) -> float:
        """Exchange and signal timeout of the doctor's groups: a working exchange takes
        milliseconds, so a short one keeps a broken path from eating the run."""
        return min(self.timeout_s, 15.0)

    @property
    def stage_budget_s(self) -> float:
        """How long one stage may run before the watchdog ends a stuck rank."""
        return max(5 * self.timeout_s, 30.0)
