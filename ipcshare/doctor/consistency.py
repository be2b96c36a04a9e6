"""Driver, CUDA and GPU-model differences between the nodes of one job: each node that
differs is named with its value and the value of the other nodes (the most common one).

Mixed drivers or CUDA versions between nodes are a classic cause of P2P and IPC failing on
some nodes only; mixed GPU models make per-node bandwidths incomparable.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

__all__ = ["node_software", "node_differences"]

_FIELDS = (("driver", "driver"), ("cuda", "CUDA"), ("gpu_model", "GPU model"))


def node_software(node: Mapping[str, Any]) -> dict[str, str | None]:
    """``{'driver', 'cuda', 'gpu_model'}`` of one node's verdict; ``gpu_model`` joins the
    distinct names of the devices its ranks see (``'none'`` on a node without GPUs)."""
    names = sorted({device.get("name", "?") for facts in node.get("ranks", [])
                    for device in (facts.get("gpu") or {}).get("devices", [])})
    return {"driver": node.get("driver"), "cuda": node.get("cuda"),
            "gpu_model": " + ".join(names) if names else "none"}


def _label(node: Mapping[str, Any]) -> str:
    ranks = ",".join(map(str, node.get("world_ranks", [])))
    return f"{node.get('host', '?')} (ranks {ranks})"


def node_differences(nodes: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One line per node and field that differs from the other nodes, e.g.
    ``'node3 (ranks 8,9): driver 570.86.15, while 3 other node(s) have 580.159.04'``.

    Only GPU nodes are compared for the driver and CUDA (a node without a GPU has neither);
    the GPU model is compared as soon as one node has a GPU, so a node that lost its GPUs
    is named too. Ties name the value of the first node as the reference.
    """
    software = [(node, node_software(node)) for node in nodes.values()]
    gpu_nodes = [(node, facts) for node, facts in software if node.get("gpu_node")]
    lines = []
    for field, label in _FIELDS:
        compared = software if field == "gpu_model" else gpu_nodes
        compared = [(node, facts[field]) for node, facts in compared
                    if facts[field] is not None]
        if not gpu_nodes or len({value for _node, value in compared}) < 2:
            continue
        counts = Counter(value for _node, value in compared)
        first = compared[0][1]
        reference = max(counts, key=lambda value: (counts[value], value == first))
        for node, value in compared:
            if value != reference:
                lines.append(f"{_label(node)}: {label} {value}, while "
                             f"{counts[reference]} other node(s) have {reference}")
    return lines
