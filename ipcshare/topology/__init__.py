"""Topology: who the ranks are and how they reach each other.

Modules, one idea each: ``world`` (the user's communicator, the node-local and node-leader
communicators, virtual nodes, every rank's host and pid), ``arrival`` (every rank arrives
before ``world`` splits, or every one is told), ``mpi_import`` (``mpi()``, which loads
mpi4py's ``MPI`` on first use, for both), ``devices`` (device binding, the P2P / NVLink
matrix, handle support), ``peer_paths`` (each pair's path: direct or staged),
``gpu_sharing`` (ranks that share one GPU), ``machine_facts`` (the GPUs, links and
versions a result document names), ``process_state`` (what /proc says of a rank's
process: its start, a stop) and ``job_ranks`` (the job's ranks this process can see).
Importing this package loads nothing heavy: each module is imported by name where it is
needed.
"""
