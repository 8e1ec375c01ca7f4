"""A device mesh: the world as a grid of data x pipeline x context x tensor ranks.

    mesh = DeviceMesh(dp=2, pp=2, tp=2)      # 8 ranks
    mesh.group("tp")                         # my tensor-parallel group
    mesh.coord                               # {'pp': 0, 'dp': 1, 'cp': 0, 'tp': 1}

Ranks are laid out with tensor parallelism fastest-varying, then context,
then data, then pipeline (pp outermost)::

    rank = ((pp_i * dp + dp_i) * cp + cp_i) * tp + tp_i

so the ranks of one TP group are neighbours (on one machine, where the
bandwidth is), and pipeline stages are the farthest apart. "rank" here is a
place on the grid; the places are filled node by node with the world's ranks
(``mesh.order``: sorted by node, then local rank, from the topology found under
MPI), so a TP group whose size divides the node size lies inside one node even
when mpiexec placed the ranks round-robin. Without a topology, or with nodes of
consecutive ranks, place p holds rank p. A group numbers its ranks in increasing
order (``new_group``), so where filling node by node would put some group's
ranks out of grid order (``mpiexec -hosts a,b -n 4`` with ``DeviceMesh(dp=4)``),
the mesh keeps place p = rank p, as without a topology, and warns if a TP group
then spans nodes. The group of
dimension d holds the ranks that share every coordinate except d. Every rank
builds every group, in the same order, as ``new_group`` requires.
"""
from __future__ import annotations

import itertools
import warnings

from minidist.comm.group import (ProcessGroup, get_topology, get_world_size, new_group,
                                 world_group)
from minidist.trace import recorder as trace

DIMS = ("pp", "dp", "cp", "tp")  # outermost to innermost


class DeviceMesh:
    """The world split into pp x dp x cp x tp groups (see module docstring)."""

    def __init__(self, dp: int = 1, pp: int = 1, tp: int = 1, cp: int = 1):
        self.shape = {"pp": pp, "dp": dp, "cp": cp, "tp": tp}
        size = pp * dp * cp * tp
        if size != get_world_size():
            raise ValueError(f"mesh {self.shape} has {size} ranks but the world has "
                             f"{get_world_size()}")
        self.rank = world_group().rank
        topo = get_topology()
        self.order = list(range(size))           # place on the grid -> global rank
        if topo is not None:                     # node by node, then by local rank
            self.order.sort(key=lambda r: (topo.node_of[r], topo.local_ranks[r]))
            if not all(g == sorted(g) for dim in DIMS for g in self._all_groups(dim)):
                self.order = list(range(size))   # keep each group in grid order
            _warn_if_tp_spans_nodes(self, topo)
        self.coord = self.coords_of(self.rank)
        if trace.active is not None:   # names this rank in the trace: rank 3 (dp 1, pp 1, tp 0)
            trace.active.note_coords({d: self.coord[d] for d in DIMS if self.shape[d] > 1})
        self._groups: dict[str, ProcessGroup] = {}
        for dim in DIMS:
            for ranks in self._all_groups(dim):  # every rank creates every group
                g = new_group(ranks)
                if self.rank in ranks:
                    self._groups[dim] = g
                    g.group_desc = f"mesh_{dim}"    # torch's name; the trace labels its calls

    def rank_of(self, coord: dict[str, int]) -> int:
        """The global rank at ``coord``."""
        place = 0
        for dim in DIMS:
            place = place * self.shape[dim] + coord.get(dim, 0)
        return self.order[place]

    def coords_of(self, rank: int) -> dict[str, int]:
        """The coordinates of global rank ``rank``."""
        rank = self.order.index(rank)            # its place on the grid
        coord = {}
        for dim in reversed(DIMS):
            rank, coord[dim] = divmod(rank, self.shape[dim])
        return {dim: coord[dim] for dim in DIMS}

    def _all_groups(self, dim: str) -> list[list[int]]:
        others = [d for d in DIMS if d != dim]
        groups = []
        for fixed in itertools.product(*(range(self.shape[d]) for d in others)):
            base = dict(zip(others, fixed))
            groups.append([self.rank_of({**base, dim: i}) for i in range(self.shape[dim])])
        return groups

    def group(self, dim: str) -> ProcessGroup:
        """This rank's group along ``dim`` ('dp', 'pp', 'tp' or 'cp')."""
        return self._groups[dim]

    def ranks(self, dim: str) -> list[int]:
        """Global ranks of this rank's group along ``dim``."""
        return self._groups[dim].ranks

    def __repr__(self) -> str:
        dims = " x ".join(f"{d}={self.shape[d]}" for d in DIMS)
        return f"DeviceMesh({dims}, rank {self.rank} at {self.coord})"


def _warn_if_tp_spans_nodes(mesh: DeviceMesh, topo) -> None:
    """Tensor parallelism talks in every layer: say so when a TP group crosses nodes."""
    for ranks in mesh._all_groups("tp"):
        nodes = sorted({topo.node_of[r] for r in ranks})
        if len(nodes) > 1:
            warnings.warn(f"DeviceMesh {mesh.shape}: the tp group {ranks} spans nodes {nodes} "
                          f"(ranks of each node: {topo.nodes()}); start the ranks node by "
                          "node (mpiexec -hosts a:L,b:L) with tp dividing L", stacklevel=3)
            return
