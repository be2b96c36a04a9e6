"""The old home of fail-together agreement, kept because tests name it: see
``ipcshare.liveness.consensus``."""

from .liveness.consensus import Rendezvous, agree, collective_step, failure_suffix

__all__ = ["agree", "collective_step", "failure_suffix", "Rendezvous"]
