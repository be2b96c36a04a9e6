"""Every setting a group may read, parsed at once: a malformed ``IPCSHARE_*`` value is
refused when a ``Group`` is made (and by ``ipcshare info``), on every rank, whatever the
backend; not ignored on host memory and refused later on a GPU node."""

from __future__ import annotations

from ..exchange.socket_dir import check_socket_dir_setting
from ..runtime import settings
from ..topology.peer_paths import chunk_bytes_choice, env_choices, fallback_choice

__all__ = ["check_settings"]


def check_settings(fallback: str | None = None, chunk: int | str | None = None) -> None:
    """Parse every setting a group may read later, whatever the backend and whatever the
    arguments override: the fallback arguments (or the variables they stand for), the GPU
    settings, the timeouts and the socket directory. A malformed value is refused on
    every rank (SETTINGS.md's promise), not ignored here and refused later elsewhere.

    Raises:
        SettingError: the first malformed variable, named with its value.
        ConfigError: a malformed ``p2p_fallback`` / ``p2p_chunk`` argument.
    """
    env_fallback, env_chunk = env_choices()
    if fallback is None:
        fallback_choice(env_fallback)
    else:
        fallback_choice(fallback, argument="p2p_fallback")
    if chunk is None:
        chunk_bytes_choice(env_chunk)
    else:
        chunk_bytes_choice(chunk, argument="p2p_chunk")
    settings.max_ranks_per_gpu()
    settings.disabled_p2p_pairs()
    settings.shared_gpu_barrier()
    settings.mpi_cuda_aware()
    settings.seconds(settings.SIGNAL_TIMEOUT, 1.0)
    settings.seconds(settings.EXCHANGE_TIMEOUT, 1.0)
    settings.seconds(settings.ARRIVAL_TIMEOUT, 1.0)
    check_socket_dir_setting()
