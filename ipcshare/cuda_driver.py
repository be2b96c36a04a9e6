"""The old home of the CUDA driver wrapper, kept because tests and tools name it: see
``ipcshare.runtime.cuda_driver``."""

from .runtime.cuda_driver import *  # noqa: F403
from .runtime.cuda_driver import __all__  # noqa: F401
