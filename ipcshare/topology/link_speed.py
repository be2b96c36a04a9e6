"""The fastest a rank's bytes can move on this machine: the ceiling that no measured
bandwidth may pass (the harness holds every timed row against it).

Where the figure comes from, most specific first:

- a GPU with NVLink links up: links x per-link rate per direction, from NVML
  (nvidia-ml-py) through the link count and NVLink version (NVLink 4: 18 x 25 GB/s =
  450 GB/s on an H100 / H200);
- a GPU without NVLink: its PCIe link, generation x width from NVML;
- ranks sharing one GPU: that GPU's memory (bus width x memory clock x 2, from CUDA's
  device attributes), through which all their bytes pass;
- no NVML: the GPU's memory, the loosest true bound, said so in the source;
- host memory: what one core copies, measured here on a cache-sized and a DRAM-sized
  buffer, times a margin (there is no datasheet figure to read).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any

import numpy as np

from .nvml_session import handle_by_cuda_bus_id, nvml_session

__all__ = ["Ceiling", "gpu_ceiling", "host_memory_ceiling", "NVLINK_GBPS_PER_LINK", "NVLINK_NAMES",
           "pcie_gbps", "HOST_MARGIN"]

# Per link and direction, by NVML's nvmlNvlinkVersion_t (2: NVLink 2.0 ... 7: 5.0).
NVLINK_GBPS_PER_LINK = {1: 20.0, 2: 25.0, 3: 25.0, 4: 25.0, 5: 25.0, 6: 25.0, 7: 50.0}
NVLINK_NAMES = {1: "1", 2: "2", 3: "2.2", 4: "3", 5: "3.1", 6: "4", 7: "5"}
# GT/s per lane by PCIe generation; from generation 3 on 128b/130b encoding.
_PCIE_GTS = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}
# A host copy's rate depends on caches and on what else the core does; a figure more
# than this many times what one core copied is an error, not a fast run.
HOST_MARGIN = 2.0
_MAX_NVLINKS = 18


@dataclasses.dataclass(frozen=True)
class Ceiling:
    """``gbps`` (GB/s = 1e9 bytes per second, per rank and direction) and where it came
    from, in words."""

    gbps: float
    source: str

    def to_dict(self) -> dict[str, Any]:
        return {"gbps": round(self.gbps, 3), "source": self.source}


def pcie_gbps(generation: int, width: int) -> float:
    """A PCIe link's rate per direction in GB/s (0 for a generation not known)."""
    rate = _PCIE_GTS.get(generation, 0.0)
    encoding = 0.8 if generation <= 2 else 128 / 130
    return rate * width * encoding / 8


def _memory_ceiling(ordinal: int) -> Ceiling:
    from ..runtime import cuda_driver

    khz = cuda_driver.device_attribute(ordinal, "MEMORY_CLOCK_RATE")
    bits = cuda_driver.device_attribute(ordinal, "GLOBAL_MEMORY_BUS_WIDTH")
    gbps = 2 * khz * 1e3 * bits / 8 / 1e9
    return Ceiling(gbps, f"one GPU's memory: {bits}-bit bus x {khz / 1e3:.0f} MHz x 2 "
                         "(CUDA device attributes)")


def _nvml_link_ceiling(ordinal: int) -> Ceiling | None:
    """NVLink (or, with none up, PCIe) of the GPU at CUDA ``ordinal``, from NVML; None
    when NVML is not there or cannot say."""
    from ..runtime import cuda_driver

    with nvml_session() as pynvml:
        if pynvml is None:
            return None
        try:
            handle = handle_by_cuda_bus_id(pynvml, cuda_driver.pci_bus_id(ordinal))
            up, version = 0, 0
            for link in range(_MAX_NVLINKS):
                try:
                    if pynvml.nvmlDeviceGetNvLinkState(handle, link):
                        up += 1
                        version = version or int(pynvml.nvmlDeviceGetNvLinkVersion(handle,
                                                                                   link))
                except pynvml.NVMLError:
                    break  # past the GPU's last link, or no NVLink at all
            if up and version in NVLINK_GBPS_PER_LINK:
                per_link = NVLINK_GBPS_PER_LINK[version]
                return Ceiling(up * per_link, f"NVLink {NVLINK_NAMES[version]}: {up} links x "
                                              f"{per_link:g} GB/s per direction (NVML)")
            generation = int(pynvml.nvmlDeviceGetMaxPcieLinkGeneration(handle))
            width = int(pynvml.nvmlDeviceGetMaxPcieLinkWidth(handle))
        except Exception:  # NVML errors are facts we could not read, nothing more
            return None
        gbps = pcie_gbps(generation, width)
        if gbps <= 0:
            return None
        return Ceiling(gbps, f"PCIe gen {generation} x{width} per direction (NVML)")


def gpu_ceiling(ordinal: int, *, shares_gpu: bool) -> Ceiling:
    """The ceiling of a rank on the GPU at CUDA ``ordinal``: its memory where ranks
    share the GPU (their bytes move inside it), else its NVLink or PCIe links, else
    (NVML missing) its memory.

    Raises:
        CudaError: the device attributes could not be read.
    """
    memory = _memory_ceiling(ordinal)
    if shares_gpu:
        return Ceiling(memory.gbps, memory.source + "; ranks share this GPU")
    links = _nvml_link_ceiling(ordinal)
    if links is None:
        return Ceiling(memory.gbps, memory.source + "; NVML unavailable, so not its links "
                       "(install nvidia-ml-py)")
    return links


@functools.cache
def host_memory_ceiling(*, repeats: int = 3) -> Ceiling:
    """What one core copies between two buffers, the best of a 64 KiB and a 1 MiB
    (caches) and a 64 MiB (memory) copy, best of ``repeats``, times ``HOST_MARGIN``.
    Measured once per process (the machine does not change under it)."""
    best = 0.0
    for nbytes in (64 << 10, 1 << 20, 64 << 20):
        source = np.ones(nbytes, dtype=np.uint8)
        target = np.empty_like(source)
        np.copyto(target, source)  # first touch outside the timing
        for _ in range(repeats):
            started = time.perf_counter()
            np.copyto(target, source)
            seconds = time.perf_counter() - started
            best = max(best, nbytes / seconds / 1e9)
    return Ceiling(best * HOST_MARGIN, f"host memory: one core copied {best:.1f} GB/s here "
                                       f"(measured), x{HOST_MARGIN:g}")
