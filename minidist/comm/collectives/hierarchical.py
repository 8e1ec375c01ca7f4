"""Hierarchical all-reduce: keep the bytes on the fast links inside a node.

On a two-level machine (K nodes of L ranks; fast links inside a node, slow
ones between nodes, link.py) a flat ring of N = K * L ranks sends
2(N-1)/N * M bytes per rank, and some of its steps cross the slow links. The
hierarchical all-reduce does three phases instead:

    1. intra-node ring reduce-scatter    rank (node k, local i) ends with chunk i
                                         summed over its node      (L-1)/L * M, fast
    2. inter-node ring all-reduce of     the L rings (one per local index i) run
       that chunk across the K nodes     side by side               2(K-1)/K * M/L, slow
    3. intra-node ring all-gather        every rank gets every chunk (L-1)/L * M, fast

so each rank sends 2(K-1)/K * M / L bytes over inter-node links, L times fewer
than a flat ring puts on each of its slowest links:

    T = 2(L-1)/L * M / beta_intra + 2(K-1)/K * (M/L) / beta_inter + 2(L-1 + K-1) * alpha

(calc/comm.py has the cost and ``minidist calc allreduce`` compares it with the
flat ring). Each chunk's final value is computed once, by the inter-node ring
of phase 2, and then only copied: the result has the same bits on every rank.
The sum is the same as the flat ring's up to the order of additions (exactly
the same for integers). ``group.stats.inter_node_bytes`` counts phase 2's bytes.
"""
from __future__ import annotations

from typing import Any

from minidist.comm.collectives.ring import chunk_bounds, ring_all_gather, ring_reduce_scatter
from minidist.comm.transport.reduce_op import ReduceOp, finish


class SubRing:
    """Some ranks of a group, seen as a group of their own by the ring functions
    (``size``, ``rank``, ``sendrecv`` in positions of ``members``)."""

    def __init__(self, group: Any, members: list[int]):
        self.group, self.members = group, members
        self.size, self.rank = len(members), members.index(group.rank)

    def sendrecv(self, send_arr: Any, dst: int, recv_arr: Any, src: int, tag: int,
                 op: Any = None, what: str = "") -> None:
        self.group.sendrecv(send_arr, self.members[dst], recv_arr, self.members[src], tag,
                            op=op, what=what)


def node_layout(group: Any) -> tuple[list[int], list[int]]:
    """(the group ranks of my node, the group ranks with my local index on every
    node), from the world's topology: found under MPI from the host names, declared
    on a local world by ``World(node_size=...)`` (transport/topology.py)."""
    topo = getattr(group.transport, "topology", None)
    if topo is None:
        raise ValueError("all_reduce(algorithm='hierarchical') needs a two-level topology: "
                         "start the world with World(n, node_size=L, ...) or set "
                         "MINIDIST_NODE_SIZE=L (under mpiexec the nodes are found)")
    nodes: dict[int, list[int]] = {}
    for i, global_rank in enumerate(group.ranks):
        nodes.setdefault(topo.node_of[global_rank], []).append(i)
    sizes = {len(members) for members in nodes.values()}
    if len(sizes) != 1:
        counts = ", ".join(f"node {k} ({topo.hosts[group.ranks[m[0]]]}): {len(m)}"
                           for k, m in sorted(nodes.items()))
        raise ValueError(f"hierarchical all-reduce: group {group.ranks} has different numbers "
                         f"of ranks on its nodes ({counts}); use a group with the same "
                         "number of ranks on every node")
    mine = next(m for m in nodes.values() if group.rank in m)
    local = mine.index(group.rank)
    peers = [members[local] for _, members in sorted(nodes.items())]
    return mine, peers


def hierarchical_all_reduce(group: Any, flat: Any, op: ReduceOp, tag: int) -> None:
    """In place on the 1-D ``flat``: the three phases of the module docstring."""
    mine, peers = node_layout(group)
    intra, inter = SubRing(group, mine), SubRing(group, peers)
    bounds = chunk_bounds(flat.size, intra.size)
    if intra.size > 1:
        ring_reduce_scatter(intra, flat, bounds, op, tag)            # 1. inside the node
    lo, hi = bounds[intra.rank]
    chunk = flat[lo:hi]                                              # (~M/L,) my node's sum
    before = group.stats.bytes_sent
    if inter.size > 1:                                               # 2. between nodes
        inner = chunk_bounds(chunk.size, inter.size)
        ring_reduce_scatter(inter, chunk, inner, op, tag)
        a, b = inner[inter.rank]
        finish(op, chunk[a:b], group.size)                           # AVG: / N, once
        ring_all_gather(inter, chunk, inner, tag)
    else:
        finish(op, chunk, group.size)
    group.stats.inter_node_bytes += group.stats.bytes_sent - before
    if intra.size > 1:
        ring_all_gather(intra, flat, bounds, tag)                    # 3. inside the node
