"""Load compiled kernels into the current CUDA context and launch them on a stream.

Kernel arguments travel as one ctypes structure passed by value, mirroring the C++
``struct`` the kernel takes, so Python and CUDA agree on the layout in one place each.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

from ..runtime.cuda_driver import check, driver

__all__ = ["LoadedKernels", "CollectiveKernels", "AllGatherArgs", "BarrierArgs", "ScatterArgs",
           "CollectiveArgs", "MAX_KERNEL_RANKS"]

MAX_KERNEL_RANKS = 8  # kMaxRanks in signal.cuh


class AllGatherArgs(ctypes.Structure):
    """``AllGatherArgs`` of kernels/src/allgather.cu."""

    _fields_ = [
        ("outputs", ctypes.c_void_p * MAX_KERNEL_RANKS),
        ("inputs", ctypes.c_void_p * MAX_KERNEL_RANKS),
        ("pads", ctypes.c_void_p * MAX_KERNEL_RANKS),
        ("block_bytes", ctypes.c_ulonglong),
        ("timeout_ns", ctypes.c_ulonglong),
        ("rank", ctypes.c_int),
        ("nranks", ctypes.c_int),
        ("slot_base", ctypes.c_int),
        ("epoch_word", ctypes.c_int),
    ]


class ScatterArgs(ctypes.Structure):
    """``ScatterArgs`` of kernels/src/allgather.cu."""

    _fields_ = [
        ("outputs", ctypes.c_void_p * MAX_KERNEL_RANKS),
        ("inputs", ctypes.c_void_p * MAX_KERNEL_RANKS),
        ("block_bytes", ctypes.c_ulonglong),
        ("nranks", ctypes.c_int),
        ("sources", ctypes.c_uint),
    ]


class CollectiveArgs(ctypes.Structure):
    """``CollectiveArgs`` of kernels/src/collectives/args.cuh."""

    _fields_ = [
        ("windows", ctypes.c_void_p * MAX_KERNEL_RANKS),
        ("pads", ctypes.c_void_p * MAX_KERNEL_RANKS),
        ("input", ctypes.c_void_p),
        ("output", ctypes.c_void_p),
        ("count", ctypes.c_ulonglong),
        ("digest", ctypes.c_ulonglong),
        ("input_offset", ctypes.c_ulonglong),
        ("staging_offset", ctypes.c_ulonglong * 2),
        ("result_offset", ctypes.c_ulonglong * 2),
        ("timeout_ns", ctypes.c_ulonglong),
        ("rank", ctypes.c_int),
        ("nranks", ctypes.c_int),
        ("zero_copy", ctypes.c_int),
        ("slot_base", ctypes.c_int),
        ("header_base", ctypes.c_int),
        ("epoch_word", ctypes.c_int),
        ("ll_epoch_word", ctypes.c_int),
        ("ll_cleaned_word", ctypes.c_int),
        ("ll_offset", ctypes.c_ulonglong * 2),
        ("ll_slot_bytes", ctypes.c_ulonglong),
        ("ll_clean_every", ctypes.c_ulonglong),
        ("registrations", ctypes.c_void_p),
        ("registration_row", ctypes.c_ulonglong),
        ("guest", ctypes.c_void_p),
        ("push_tile_bytes", ctypes.c_ulonglong),
        ("output_mapped", ctypes.c_int),
        ("output_offset", ctypes.c_ulonglong),
        ("output_registration_row", ctypes.c_ulonglong),
        ("guest_mask", ctypes.c_ulonglong),
        ("send_splits", ctypes.c_void_p),
        ("receive_splits", ctypes.c_void_p),
        ("splits_inline", (ctypes.c_longlong * MAX_KERNEL_RANKS) * 2),
        ("splits_offset", ctypes.c_ulonglong * 2),
        ("output_count", ctypes.c_ulonglong),
        ("send_splits_itemsize", ctypes.c_int),
        ("receive_splits_itemsize", ctypes.c_int),
        ("expect_receives", ctypes.c_int),
        ("itemsize", ctypes.c_int),
        ("ll128_offset", ctypes.c_ulonglong * 2),
        ("ll128_slot_bytes", ctypes.c_ulonglong),
    ]


class BarrierArgs(ctypes.Structure):
    """``BarrierArgs`` of kernels/src/barrier.cu."""

    _fields_ = [
        ("pads", ctypes.c_void_p * MAX_KERNEL_RANKS),
        ("timeout_ns", ctypes.c_ulonglong),
        ("rank", ctypes.c_int),
        ("nranks", ctypes.c_int),
        ("slot_base", ctypes.c_int),
        ("epoch_word", ctypes.c_int),
    ]


class LoadedKernels:
    """A CUBIN loaded with ``cuModuleLoadData`` into the current context.

    ``close()`` unloads it (idempotent); entry points are looked up once.

    Raises:
        CudaError: the image does not load (e.g. built for another architecture).
    """

    def __init__(self, cubin: bytes) -> None:
        self._module: Any = check("cuModuleLoadData", driver.cuModuleLoadData(cubin))
        self._functions: dict[str, Any] = {}

    def function(self, name: str) -> Any:
        """The ``CUfunction`` called ``name``.

        Raises:
            CudaError: no such entry point (CUDA_ERROR_NOT_FOUND).
        """
        if self._module is None:
            raise ValueError("kernels were unloaded")
        if name not in self._functions:
            self._functions[name] = check(
                "cuModuleGetFunction", driver.cuModuleGetFunction(self._module, name.encode()))
        return self._functions[name]

    def global_array(self, name: str) -> tuple[int, int]:
        """``(device address, bytes)`` of the module's ``__device__`` variable ``name``
        (one with C linkage, such as trace.cuh's ``ipcshare_trace``).

        Raises:
            CudaError: no such variable (CUDA_ERROR_NOT_FOUND), e.g. a build without it.
        """
        if self._module is None:
            raise ValueError("kernels were unloaded")
        ptr, nbytes = check("cuModuleGetGlobal",
                            driver.cuModuleGetGlobal(self._module, name.encode()))
        return int(ptr), int(nbytes)

    def launcher(self, name: str, args: ctypes.Structure, *, grid: int, block: int,
                 stream: Any):
        """A callable launching ``name`` with the current contents of ``args``.

        The driver copies the arguments at launch (a graph capture keeps the copy), so
        the caller may change ``args`` between launches; epochs live on the device.
        """
        function = self.function(name)
        params = (ctypes.c_void_p * 1)(ctypes.addressof(args))
        address = ctypes.addressof(params)
        launch = driver.cuLaunchKernel

        def run() -> None:
            check("cuLaunchKernel",
                  launch(function, grid, 1, 1, block, 1, 1, 0, stream, address, 0))
            run.keep = (args, params)  # both must outlive every launch
        run.keep = (args, params)
        return run

    def close(self) -> None:
        if self._module is not None:
            module, self._module = self._module, None
            self._functions.clear()
            check("cuModuleUnload", driver.cuModuleUnload(module))


class CollectiveKernels:
    """Every collective kernel behind one object, as if one module: ``function(entry)``
    loads (through ``load``, once) the translation unit that defines ``entry``
    (compiler.COLLECTIVE_UNITS), so a process loads only the families it calls;
    ``global_array`` reads the unit whose kernels carry the phase stamps (trace.py).
    ``load`` owns the units: closing them is its business.

    Raises:
        KernelCompileError: (from ``function``) no collective is called so, or its unit
            does not compile.
    """

    def __init__(self, load: Callable[[str], LoadedKernels]) -> None:
        self._load = load

    def function(self, name: str) -> Any:
        from .compiler import collective_unit

        return self._load(collective_unit(name)).function(name)

    def load_all(self, first: int = 0) -> None:
        """Load every unit now, starting at the ``first``-th (modulo their number): ranks
        of a node that pass their rank compile different units side by side where
        nothing is shipped or cached (each waits for the others' files after), and no
        unit loads later, during a graph capture.

        Raises:
            KernelCompileError: a unit does not compile.
            CudaError: a CUBIN does not load.
        """
        from .compiler import COLLECTIVE_UNITS

        units = list(COLLECTIVE_UNITS)
        start = first % len(units)
        for unit in units[start:] + units[:start]:
            self._load(unit)

    def global_array(self, name: str) -> tuple[int, int]:
        from .trace import TRACED_UNIT

        return self._load(TRACED_UNIT).global_array(name)
