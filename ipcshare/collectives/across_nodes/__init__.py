"""Collectives for groups that span nodes: IPC inside each node, an engine between nodes
on rails (rail j = local rank j of every node): NCCL through nccl4py or MPI."""
