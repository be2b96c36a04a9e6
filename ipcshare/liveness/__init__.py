"""Liveness: ranks fail together and nobody waits forever for a dead peer.

Modules, one idea each: ``pidfd_watch`` (the thread that notices a node peer's exit),
``deadline_waits`` (MPI waits with a deadline and the one watched collective),
``consensus`` (fail-together agreement after each collective step), ``failure_notice``
(surviving the launcher's SIGUSR1), ``guard`` (the process that ends a rank stuck in a
blocking MPI call), ``exit_policy`` (the grace and the exit without MPI_Finalize) and
``mpi_segments`` (MPI's shared-memory files left by dead ranks).
"""
