"""Which ranks share a machine: the topology, found from host names or declared.

torchrun hands every rank ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``, and NCCL finds
the nodes by itself. Under MPI minidist finds them the same way: at
``init_process_group`` every rank all-gathers every rank's host name, and the
ranks with the same name are one node::

    hosts       = ("a", "a", "b", "b")   # host name of each global rank
    node_of     = (0, 0, 1, 1)           # nodes numbered in the order of their first rank
    local_ranks = (0, 1, 0, 1)           # place among the ranks of its node
    node_size   = 2                      # ranks per node (LOCAL_WORLD_SIZE)

The ranks of a node need not be consecutive (``mpiexec -hosts a,b -n 4``
places them round-robin: a, b, a, b); the hierarchical all-reduce and the
device mesh go by ``node_of``, not by ``rank // node_size``.

``MINIDIST_NODE_SIZE=L`` overrides what was found with nodes of L ranks: L
consecutive local ranks of one host. It is checked: L must divide the number
of ranks on every host (a node cannot span two machines), or ``ValueError``
says which host holds how many. Smaller nodes than the host's are allowed, as
on one machine a node may be one socket, or an emulated node for a test.

A local world (``minidist run``, ``World``) has one host; ``World(node_size=L)``
declares nodes of L consecutive ranks there, and without it the local world has
no two-level topology at all (``declared`` returns None).

The hierarchical all-reduce needs the same number of ranks on every node:
``node_size`` raises with the count on each host otherwise.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass

NODE_SIZE_ENV = "MINIDIST_NODE_SIZE"


@dataclass(frozen=True)
class Topology:
    """Host, node and local rank of every global rank (see the module docstring)."""
    hosts: tuple[str, ...]
    node_of: tuple[int, ...]
    local_ranks: tuple[int, ...]
    found: bool = True           # False: declared (World(node_size=...)), not found

    @property
    def world_size(self) -> int:
        return len(self.hosts)

    @property
    def num_nodes(self) -> int:
        return max(self.node_of) + 1

    def nodes(self) -> list[list[int]]:
        """The global ranks of each node, node by node, in increasing rank."""
        out: list[list[int]] = [[] for _ in range(self.num_nodes)]
        for rank, node in enumerate(self.node_of):
            out[node].append(rank)
        return out

    def local_world_size(self, rank: int) -> int:
        """How many ranks share ``rank``'s node."""
        return self.node_of.count(self.node_of[rank])

    @property
    def node_size(self) -> int:
        """Ranks per node, the same on every node, or a ValueError naming the counts."""
        sizes = {len(members) for members in self.nodes()}
        if len(sizes) != 1:
            counts = ", ".join(f"node {k} ({self.hosts[m[0]]}): {len(m)} ranks {m}"
                               for k, m in enumerate(self.nodes()))
            raise ValueError(f"the nodes hold different numbers of ranks ({counts}); start "
                             "the same number of ranks on every host (mpiexec -hosts a:L,b:L) "
                             f"or set {NODE_SIZE_ENV} to a size that divides each")
        return sizes.pop()

    def describe(self, rank: int) -> str:
        """One line: where ``rank`` runs (what ``minidist selftest --topology`` prints)."""
        how = "found from host names" if self.found else "declared"
        return (f"rank {rank}: host {self.hosts[rank]}, node {self.node_of[rank]} of "
                f"{self.num_nodes}, local rank {self.local_ranks[rank]} of "
                f"{self.local_world_size(rank)} ({how})")


def env_node_size() -> int | None:
    """``MINIDIST_NODE_SIZE`` as a whole number of ranks, None when unset."""
    text = os.environ.get(NODE_SIZE_ENV, "").strip()
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{NODE_SIZE_ENV}={text!r} is not a whole number of ranks >= 1")
    return int(text)


def from_hosts(hosts: list[str], node_size: int | None = None) -> Topology:
    """The topology of ranks on ``hosts`` (one name per global rank): one node
    per host, or, with ``node_size``, nodes of that many consecutive local ranks
    of a host (checked: it must divide every host's number of ranks)."""
    order: dict[str, int] = {}                    # host -> its place of first appearance
    per_host: dict[str, int] = {}                 # host -> ranks seen so far
    host_index, local = [], []
    for name in hosts:
        order.setdefault(name, len(order))
        host_index.append(order[name])
        local.append(per_host.get(name, 0))
        per_host[name] = local[-1] + 1
    if node_size is None:
        return Topology(tuple(hosts), tuple(host_index), tuple(local))
    bad = {name: count for name, count in per_host.items() if count % node_size}
    if bad:
        counts = ", ".join(f"{name}: {count}" for name, count in per_host.items())
        raise ValueError(f"{NODE_SIZE_ENV}={node_size} disagrees with the hosts found "
                         f"(ranks per host: {counts}): a node cannot span two machines, so "
                         "it must divide each host's number of ranks; unset it to use one "
                         "node per host")
    # Host h's ranks split into per_host[h] / node_size nodes; number them in host order.
    first_node, next_node = {}, 0
    for name in order:
        first_node[name] = next_node
        next_node += per_host[name] // node_size
    node_of = tuple(first_node[name] + i // node_size for name, i in zip(hosts, local))
    return Topology(tuple(hosts), node_of, tuple(i % node_size for i in local))


def declared(world_size: int, node_size: int) -> Topology | None:
    """A local world's nodes of ``node_size`` consecutive ranks (0: none declared)."""
    if not node_size:
        return None
    ranks = range(world_size)
    return Topology((socket.gethostname(),) * world_size, tuple(r // node_size for r in ranks),
                    tuple(r % node_size for r in ranks), found=False)


def export_env(topo: Topology, rank: int) -> None:
    """Set what torchrun would have set for ``rank``: RANK, WORLD_SIZE, LOCAL_RANK,
    LOCAL_WORLD_SIZE, and GROUP_RANK (the node's index), for scripts that read them."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(topo.world_size),
                      LOCAL_RANK=str(topo.local_ranks[rank]),
                      LOCAL_WORLD_SIZE=str(topo.local_world_size(rank)),
                      GROUP_RANK=str(topo.node_of[rank]))
