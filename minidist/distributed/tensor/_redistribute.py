"""redistribute: from one list of placements to another, one mesh dimension at a time.

A DTensorSpec says how a tensor of a global ``shape`` lies on a ``mesh``: one
placement per mesh dimension. Changing it is a list of steps, each changing one
mesh dimension's placement by one collective (_collectives.py). The order of
the steps matters only where several mesh dimensions cut the same tensor
dimension (the inner cut must be undone first, and made last):

    1. right to left: every Shard that must change is gathered to Replicate
       (or turned into the wanted Shard by one all-to-all, when no other mesh
       dimension touches either tensor dimension); before gathering mesh dim i,
       the mesh dims after it that cut the same tensor dimension are gathered;
    2. every Partial that must end Replicate is all-reduced;
    3. left to right: Replicate or Partial become the wanted Shard (a local slice
       or a reduce-scatter; mesh dims after i that cut the same tensor dim are
       gathered first and cut again later), Replicate becomes Partial.

The backward of a redistribute is the redistribute of the gradient from the
placements it arrives in to the input's placements with Partial read as
Replicate (torch's rule: the gradient of a sum of summands is the same for
every summand). So an all-gather's backward is a reduce-scatter when its
gradient arrives Partial and a local slice when it arrives Replicate, an
all-reduce's backward is the identity, an all-to-all's is the reverse
all-to-all.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from minidist.autograd.function import Function
from minidist.distributed.tensor import _collectives as coll
from minidist.distributed.tensor.placement_types import (Partial, Placement, Replicate, Shard,
                                                          local_shape_and_offset, shard_slice)


@dataclass(frozen=True)
class DTensorSpec:
    """Where a tensor of global ``shape`` lives: a mesh and one placement per mesh dim."""
    mesh: Any                               # distributed.device_mesh.DeviceMesh
    placements: tuple[Placement, ...]
    shape: tuple[int, ...]

    def local_shape(self) -> tuple[int, ...]:
        return local_shape_and_offset(self.shape, self.mesh.shape, self.placements,
                                      self.mesh.get_coordinate())[0]

    def local_offset(self) -> tuple[int, ...]:
        return local_shape_and_offset(self.shape, self.mesh.shape, self.placements,
                                      self.mesh.get_coordinate())[1]


def normalize_for_grad(placements: tuple[Placement, ...]) -> tuple[Placement, ...]:
    """The placements a gradient takes by default: Partial read as Replicate."""
    return tuple(Replicate() if p.is_partial() else p for p in placements)


class GradPlacements:
    """The placements of a DTensor's gradient, set by the first op whose backward
    hands it one (later ones convert theirs to match, so that the engine may add
    them). ``fixed``: a leaf's gradient always has its own placements."""

    def __init__(self, placements: tuple[Placement, ...] | None = None, fixed: bool = False):
        self.placements, self.fixed = placements, fixed


class Step(NamedTuple):
    """One step of a redistribute: one mesh dimension's placement changed by one
    collective (torch's _TransformInfo)."""
    mesh_dim: int                        # the mesh dimension whose placement changes
    before: tuple[Placement, ...]        # every mesh dim's placement before the step
    after: Placement                     # mesh_dim's placement after it


def _alone_on_its_dims(cur: list, dst: tuple, i: int) -> bool:
    """Whether no mesh dim but ``i``, now or wanted, cuts the tensor dims that mesh dim
    ``i`` moves between (Shard(a) -> Shard(b)): then one all-to-all does it."""
    dims = {cur[i].dim, dst[i].dim}
    others = [p for j, p in enumerate(cur) if j != i] + [p for j, p in enumerate(dst) if j != i]
    return not any(isinstance(p, Shard) and p.dim in dims for p in others)


def plan(src: tuple[Placement, ...], dst: tuple[Placement, ...]) -> list[Step]:
    """The steps from ``src`` to ``dst`` (module docstring)."""
    n = len(src)
    cur = list(src)
    steps: list[Step] = []

    def move(i: int, p: Placement) -> None:
        steps.append(Step(i, tuple(cur), p))
        cur[i] = p

    def gather_inner(i: int, dim: int) -> None:        # innermost cut first
        for j in reversed(range(i + 1, n)):
            if cur[j] == Shard(dim):
                move(j, Replicate())

    for i in reversed(range(n)):                                           # 1.
        if cur[i] == dst[i] or not isinstance(cur[i], Shard):
            continue
        if isinstance(dst[i], Shard) and _alone_on_its_dims(cur, dst, i):
            move(i, dst[i])                                                # all-to-all
            continue
        gather_inner(i, cur[i].dim)
        move(i, Replicate())
    for i in range(n):                                                     # 2.
        if cur[i].is_partial() and cur[i] != dst[i]:
            if dst[i].is_partial():
                raise ValueError(f"redistribute from {cur[i]} to {dst[i]} on mesh dim {i} is "
                                 "not supported: reduce to Replicate() first")
            if dst[i].is_replicate():
                move(i, Replicate())
    for i in range(n):                                                     # 3.
        if cur[i] == dst[i]:
            continue
        if isinstance(dst[i], Shard):
            gather_inner(i, dst[i].dim)
        move(i, dst[i])
    return steps


def redistribute_local(local: Any, spec: DTensorSpec, placements: tuple[Placement, ...]) -> Any:
    """The local array of ``spec``'s tensor laid out as ``placements`` instead (no autograd)."""
    mesh = spec.mesh
    coord = mesh.get_coordinate()
    for step in plan(spec.placements, placements):
        i, before, new = step.mesh_dim, step.before, step.after
        group = mesh.get_group(i)
        n = group.size
        old = before[i]
        if n == 1:
            continue
        # the tensor as mesh dim i sees it: cut by the mesh dims before i only
        seen = local_shape_and_offset(spec.shape, mesh.shape[:i], before[:i], coord[:i])[0]
        if isinstance(old, Shard) and new.is_replicate():
            local = coll.all_gather_shard(local, old.dim, seen[old.dim], group)
        elif isinstance(old, Shard) and isinstance(new, Shard):
            local = coll.all_to_all_shard(local, old.dim, new.dim, seen[old.dim], group)
        elif isinstance(old, Partial) and new.is_replicate():
            local = coll.all_reduce_partial(local, old.reduce_op, group)
        elif isinstance(old, Partial) and isinstance(new, Shard):
            local = coll.reduce_scatter_partial(local, old.reduce_op, new.dim, group)
        elif old.is_replicate() and isinstance(new, Shard):
            local = shard_slice(local, new.dim, n, coord[i]).copy()
        elif old.is_replicate() and isinstance(new, Partial):
            local = coll.partition_replicate(local, new.reduce_op, n)
        else:  # the plan makes no other step
            raise AssertionError(f"no step from {old} to {new}")
    return local


def deliver_grad(grad: Any, spec: DTensorSpec, placements: tuple[Placement, ...],
                 box: GradPlacements) -> Any:
    """Hand ``grad`` (laid out as ``placements``) to the DTensor of ``spec`` whose gradient
    placements ``box`` holds: the first gradient sets them, later ones are converted."""
    if box.placements is None:
        box.placements = placements
        return grad
    if box.placements != placements:
        return redistribute_local(grad, DTensorSpec(spec.mesh, placements, spec.shape),
                                  box.placements)
    return grad


class Redistribute(Function):
    """y = the tensor laid out as ``dst``; dy (as it arrives) -> dx laid out as ``src``."""

    @staticmethod
    def forward(ctx, local, *, src, dst, src_box, dst_box):
        ctx.src, ctx.dst, ctx.src_box, ctx.dst_box = src, dst, src_box, dst_box
        return redistribute_local(local, src, dst.placements)

    @staticmethod
    def backward(ctx, grad):
        arriving = ctx.dst_box.placements or normalize_for_grad(ctx.dst.placements)
        wanted = normalize_for_grad(ctx.src.placements)
        spec = DTensorSpec(ctx.src.mesh, arriving, ctx.src.shape)
        with coll.backward_phase():
            dx = redistribute_local(grad, spec, wanted)
            return deliver_grad(dx, ctx.src, wanted, ctx.src_box)
