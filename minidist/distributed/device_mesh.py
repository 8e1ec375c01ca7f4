"""init_device_mesh: the world as an n-D grid of ranks with named dimensions (torch's).

    mesh = init_device_mesh("cpu", (2, 3), mesh_dim_names=("dp", "tp"))   # 6 ranks
    mesh.shape                 # (2, 3)
    mesh.get_coordinate()      # [1, 2] on rank 5
    mesh["tp"]                 # the 1-D mesh of my tensor-parallel ranks: [3, 4, 5]
    mesh.get_group("tp")       # its ProcessGroup, for the collectives

Ranks fill the grid in row-major order (the last dimension varies fastest), as
``torch.arange(world).reshape(mesh_shape)``::

    rank = sum_i coord[i] * prod(mesh_shape[i+1:])

so the ranks along the last dimension are neighbours (put tensor parallelism
there, where the bandwidth is). The group of dimension i holds the ranks that
share every coordinate except i; every rank builds every group of every
dimension, in the same order, as ``new_group`` requires.

Flattening (torch's ``_flatten``): ``mesh["dp_shard", "cp"]._flatten("dp_shard_cp")``
makes one dimension of several: its group holds the ranks that share every other
coordinate (dp_shard x cp of them), and the root mesh answers the new name as
it answers its own, alone or beside them (``mesh["dp_replicate", "dp_shard_cp"]``).
torchtitan names its loss and gradient-norm groups so (parallel/compose/parallel_dims.py).

The device type is "cpu" on the NumPy and guard backends and "cuda" on CuPy.
``comm.mesh.DeviceMesh(dp=, pp=, tp=)`` (the fixed pp x dp x cp x tp grid that
``minidist.distributed.DeviceMesh`` names) stays beside this one.
"""
from __future__ import annotations

import itertools
import math

from minidist import backend
from minidist.comm.group import ProcessGroup, get_world_size, new_group, world_group

_DEVICE_OF_BACKEND = {"numpy": "cpu", "guard": "cuda", "cupy": "cuda"}  # the guard imitates CuPy


def _describe(group: ProcessGroup, name: str) -> None:
    """Name a mesh dimension's group "mesh_<name>", as torch's DeviceMesh does (the trace
    labels its calls with the name); the world's own group, when a dimension spans it,
    keeps its description."""
    if group is not world_group():
        group.group_desc = f"mesh_{name}"


def _row_major(coord: tuple[int, ...], shape: tuple[int, ...]) -> int:
    index = 0
    for c, n in zip(coord, shape):
        index = index * n + c
    return index


class DeviceMesh:
    """An n-D grid of global ranks with a process group per dimension (module docstring).

    ``mesh`` holds the grid's global ranks (nested lists); a mesh sliced from a
    larger one (``mesh["tp"]``) holds only the ranks that share this rank's
    coordinates on the dimensions left out, and reuses the parent's groups.
    """

    def __init__(self, device_type: str, ranks: list[int], shape: tuple[int, ...],
                 groups: list[ProcessGroup], mesh_dim_names: tuple[str, ...] | None = None,
                 root: "DeviceMesh | None" = None, root_dims: list | None = None):
        self.device_type = device_type
        self._root = root if root is not None else self   # the mesh init_device_mesh made
        # per dimension, the root's dimensions it spans (one, or several once flattened)
        self._root_dims = [[d] for d in range(len(shape))] if root_dims is None else root_dims
        self._flat: dict[str, tuple[list[int], ProcessGroup]] = {}   # root only: _flatten
        self._ranks = list(ranks)                 # flat, row-major over ``shape``
        self._shape = tuple(shape)
        self._groups = list(groups)               # one per mesh dimension, mine
        self.mesh_dim_names = tuple(mesh_dim_names) if mesh_dim_names is not None else None
        me = world_group().rank
        if me not in self._ranks:
            raise ValueError(f"rank {me} is not in the mesh {self._ranks}")
        index = self._ranks.index(me)
        coord = []
        for n in reversed(self._shape):
            index, c = divmod(index, n)
            coord.append(c)
        self._coord = list(reversed(coord))

    # -- what torch's DeviceMesh answers ---------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def mesh(self) -> list:
        """The global ranks as nested lists of the mesh's shape."""
        def nest(flat: list[int], shape: tuple[int, ...]) -> list:
            if len(shape) == 1:
                return list(flat)
            step = len(flat) // shape[0]
            return [nest(flat[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])]
        return nest(self._ranks, self._shape)

    def size(self, mesh_dim: int | str | None = None) -> int:
        """Ranks along ``mesh_dim`` (all of the mesh's ranks if None)."""
        if mesh_dim is None:
            return len(self._ranks)
        return self._shape[self._dim_index(mesh_dim)]

    def get_group(self, mesh_dim: int | str | None = None) -> ProcessGroup:
        """The process group of this rank along ``mesh_dim`` (may be omitted on a 1-D mesh).
        On the root mesh a name ``_flatten`` made answers as well (``mesh.get_group("dp_cp")``
        is ``mesh["dp_cp"].get_group()``, as torch's)."""
        if mesh_dim is None:
            if self.ndim != 1:
                raise ValueError(f"this mesh has {self.ndim} dimensions "
                                 f"{self.mesh_dim_names or ''}: name the one you want, "
                                 "get_group(mesh_dim)")
            return self._groups[0]
        if self is self._root and mesh_dim in self._flat:
            return self._flat[mesh_dim][1]
        return self._groups[self._dim_index(mesh_dim)]

    def get_local_rank(self, mesh_dim: int | str | None = None) -> int:
        """This rank's coordinate along ``mesh_dim``."""
        if mesh_dim is None and self.ndim != 1:
            raise ValueError("get_local_rank needs mesh_dim on a mesh of several dimensions")
        return self._coord[0 if mesh_dim is None else self._dim_index(mesh_dim)]

    def get_coordinate(self) -> list[int]:
        """This rank's coordinate on every mesh dimension."""
        return list(self._coord)

    def get_rank(self) -> int:
        """This process's global rank."""
        return world_group().rank

    def __getitem__(self, names: str | tuple[str, ...]) -> "DeviceMesh":
        """The sub-mesh of the named dimensions through this rank (``mesh["tp"]``); a name
        may be one that ``_flatten`` made."""
        names = (names,) if isinstance(names, str) else tuple(names)
        spans = [self._span(n) for n in names]                  # (root dims, group) each
        flat = [d for dims, _ in spans for d in dims]
        if len(set(flat)) != len(flat) or flat != sorted(flat):
            raise ValueError(f"mesh[{names}]: name each dimension once, in the mesh's order "
                             f"{self.mesh_dim_names}")
        return self._root._sub(names, spans)

    def _span(self, name: str) -> tuple[list[int], ProcessGroup]:
        """The root's dimensions that ``name`` covers, and this rank's group along them."""
        if name in self._root._flat:
            return self._root._flat[name]
        d = self._dim_index(name)
        return self._root_dims[d], self._groups[d]

    def _sub(self, names: tuple, spans: list) -> "DeviceMesh":
        """(root only) the mesh over ``spans``' root dimensions through this rank."""
        dims = [d for span, _ in spans for d in span]
        ranks = []
        for sub in itertools.product(*(range(self._shape[d]) for d in dims)):
            coord = list(self._coord)
            for d, c in zip(dims, sub):
                coord[d] = c
            ranks.append(self._ranks[_row_major(tuple(coord), self._shape)])
        shape = tuple(math.prod(self._shape[d] for d in span) for span, _ in spans)
        return DeviceMesh(self.device_type, ranks, shape, [g for _, g in spans], names,
                          root=self, root_dims=[list(span) for span, _ in spans])

    def _flatten(self, mesh_dim_name: str) -> "DeviceMesh":
        """This (sub-)mesh's dimensions as one, named ``mesh_dim_name`` on the root mesh
        (torch's ``DeviceMesh._flatten``); every rank must call it, in the same order."""
        root = self._root
        if mesh_dim_name in (root.mesh_dim_names or ()) or mesh_dim_name in root._flat:
            dims, _ = root._span(mesh_dim_name)
            if dims == [d for span in self._root_dims for d in span]:
                return root[mesh_dim_name]
            raise ValueError(f"_flatten: the mesh already has a dimension {mesh_dim_name!r}")
        dims = [d for span in self._root_dims for d in span]
        others = [range(n) if d not in dims else range(1) for d, n in enumerate(root._shape)]
        me, mine = world_group().rank, None
        for base in itertools.product(*others):           # every rank builds every group
            ranks = []
            for sub in itertools.product(*(range(root._shape[d]) for d in dims)):
                coord = list(base)
                for d, c in zip(dims, sub):
                    coord[d] = c
                ranks.append(root._ranks[_row_major(tuple(coord), root._shape)])
            group = world_group() if len(ranks) == get_world_size() else new_group(ranks)
            if me in ranks:
                mine = group
                _describe(mine, mesh_dim_name)
        root._flat[mesh_dim_name] = (dims, mine)
        return root[mesh_dim_name]

    def _dim_index(self, mesh_dim: int | str) -> int:
        if isinstance(mesh_dim, str):
            if not self.mesh_dim_names or mesh_dim not in self.mesh_dim_names:
                raise KeyError(f"mesh has no dimension named {mesh_dim!r}; its names are "
                               f"{self.mesh_dim_names} (pass mesh_dim_names to init_device_mesh)")
            return self.mesh_dim_names.index(mesh_dim)
        if not -self.ndim <= mesh_dim < self.ndim:
            raise IndexError(f"mesh dimension {mesh_dim} is out of range for a mesh of "
                             f"{self.ndim} dimensions")
        return mesh_dim % self.ndim

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, DeviceMesh) and self._ranks == other._ranks
                and self._shape == other._shape and self.mesh_dim_names == other.mesh_dim_names)

    def __hash__(self) -> int:
        return hash((tuple(self._ranks), self._shape, self.mesh_dim_names))

    def __repr__(self) -> str:
        names = f", mesh_dim_names={self.mesh_dim_names}" if self.mesh_dim_names else ""
        return f"DeviceMesh('{self.device_type}', {self.mesh}{names})"


def init_device_mesh(device_type: str, mesh_shape: tuple[int, ...], *,
                     mesh_dim_names: tuple[str, ...] | None = None) -> DeviceMesh:
    """A mesh of ``mesh_shape`` over the whole world (every rank must call it)."""
    expected = _DEVICE_OF_BACKEND.get(backend.get_backend())
    if device_type != expected:
        raise ValueError(f"device_type {device_type!r} does not match the {backend.get_backend()} "
                         f"backend: use {expected!r}, or backend.device_type() (CuPy, and the guard "
                         "backend that imitates it, run on 'cuda')")
    mesh_shape = tuple(int(n) for n in mesh_shape)
    if not mesh_shape or min(mesh_shape) < 1:
        raise ValueError(f"mesh_shape must be one or more positive sizes, got {mesh_shape}")
    world = get_world_size()
    if math.prod(mesh_shape) != world:
        raise ValueError(f"mesh_shape {mesh_shape} holds {math.prod(mesh_shape)} ranks but the "
                         f"world has {world}")
    if mesh_dim_names is not None:
        mesh_dim_names = tuple(mesh_dim_names)
        if len(mesh_dim_names) != len(mesh_shape) or len(set(mesh_dim_names)) != len(mesh_shape):
            raise ValueError(f"mesh_dim_names {mesh_dim_names} must name each of the "
                             f"{len(mesh_shape)} dimensions of {mesh_shape} once")
    me = world_group().rank
    groups: list[ProcessGroup] = []
    for dim in range(len(mesh_shape)):
        mine = None
        others = [range(n) if d != dim else range(1) for d, n in enumerate(mesh_shape)]
        for base in itertools.product(*others):            # every rank builds every group
            ranks = []
            for i in range(mesh_shape[dim]):
                coord = list(base)
                coord[dim] = i
                ranks.append(_row_major(tuple(coord), mesh_shape))
            group = world_group() if len(ranks) == world else new_group(ranks)
            if me in ranks:
                mine = group
        _describe(mine, mesh_dim_names[dim] if mesh_dim_names else f"dim_{dim}")
        groups.append(mine)
    return DeviceMesh(device_type, list(range(world)), mesh_shape, groups, mesh_dim_names)
