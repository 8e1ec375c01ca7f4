"""HSDP: fully_shard on a 2-D mesh, sharded inside a replica, replicated across replicas.

    mesh = init_device_mesh("cpu", (R, S), mesh_dim_names=("dp_replicate", "dp_shard"))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)        # torch's convention: dim 0 replicates,
    fully_shard(model, mesh=mesh)            #                     dim 1 shards

Each parameter becomes a DTensor placed ``(Replicate(), Shard(0))``: the S ranks of one
row of the mesh (one replica, e.g. one node or island) hold its S dim-0 pieces, and each
of the R rows holds the same pieces. Per unit and step:

    gather (forward, backward)  all-gather over dim 1: the S ranks of my replica
    gradients                   reduce-scatter (avg) over dim 1, then all-reduce (avg) of
                                my piece over dim 0 (the R ranks holding the same piece):

        g_piece = 1/R sum_r ( 1/S sum_s g_{r,s} )[piece]  =  the mean over all R*S ranks

The divide factor: torch divides by R*S in all. For float32 / bf16 gradients it asks the
collectives for the average (NCCL's AVG: 1/S in the reduce-scatter, 1/R in the
all-reduce); for other dtypes (float64, fp16) it sums and divides before and after by
factors whose product is R*S (``_get_gradient_divide_factors``). minidist averages in both
collectives for every dtype: the same mean, rounded in another order (float64: ~1e-16).

Bytes per rank per step for a unit of M bytes (ring collectives):

    dim 1 (inside a replica: the fast link)   AG (S-1)/S * M  (twice with resharding)
                                              RS (S-1)/S * M
    dim 0 (across replicas: the slow link)    AR 2(R-1)/R * M/S

so the slow link carries 2(R-1)/R * M/S per rank: S times less than DDP's 2(N-1)/N * M
over the same link, and memory per rank is that of FSDP over S ranks (16 P / S with
Adam). ZeRO++'s hierarchical partitioning (hpZ) is the same trade for the weights' gather
only (docs/zero.md). ``fully_shard(module, mesh=mesh1d)`` is the case R = 1.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

from minidist import backend
from minidist.backend import xp
from minidist.comm.collectives.api import all_reduce
from minidist.comm.collectives.work import submit
from minidist.comm.group import ProcessGroup, get_world_size
from minidist.comm.transport.reduce_op import ReduceOp
from minidist.distributed.device_mesh import init_device_mesh
from minidist.distributed.fsdp.reduce_format import all_reduce_in_format
from minidist.distributed.tensor._collectives import OBSERVED, ScatteredDim0
from minidist.precision import quantize
from minidist.distributed.tensor.placement_types import Placement, Replicate, Shard
from minidist.precision.formats import FloatFormat


class DataParallelMesh(NamedTuple):
    """What each dimension of fully_shard's mesh does."""
    mesh: Any                                 # the DeviceMesh, 1-D (FSDP) or 2-D (HSDP)
    shard_group: ProcessGroup                 # the ranks that hold the pieces (last dim)
    replicate_group: ProcessGroup | None      # the ranks with the same piece (dim 0), or None
    placements: tuple[Placement, ...]         # (Shard(0),) or (Replicate(), Shard(0))


def data_parallel_mesh(mesh: Any) -> DataParallelMesh:
    """fully_shard's mesh: ``mesh`` (1-D: shard; 2-D: replicate x shard) or the world."""
    if mesh is None:
        mesh = init_device_mesh(backend.device_type(), (get_world_size(),))
    if mesh.ndim == 1:
        return DataParallelMesh(mesh, mesh.get_group(0), None, (Shard(0),))
    if mesh.ndim == 2:
        return DataParallelMesh(mesh, mesh.get_group(1), mesh.get_group(0),
                                (Replicate(), Shard(0)))
    names = f" {mesh.mesh_dim_names}" if mesh.mesh_dim_names else ""
    raise ValueError(f"fully_shard takes a 1-D mesh (FSDP) or a 2-D mesh (HSDP: dim 0 "
                     f"replicates, dim 1 shards), got {mesh.ndim} dimensions{names}: pass the "
                     "data-parallel dimensions, e.g. mesh['dp_replicate', 'dp_shard'] or "
                     "mesh['dp']")


def all_reduce_pieces(scattered: ScatteredDim0, group: ProcessGroup, fmt: FloatFormat | None,
                      async_op: bool = False) -> ScatteredDim0:
    """HSDP's second step: the average over the replicas (``group``, mesh dim 0) of this
    rank's gradient pieces (what ``scattered``, the first step, gives), by one all-reduce
    of them side by side (in ``fmt`` when the policy names an emulated reduce_dtype).
    ``async_op``: both steps run on the communication thread, in turn (the pieces laid
    side by side there too, between them); ``wait()`` gives the averaged pieces."""
    shapes = scattered.piece_shapes()
    flat = xp.empty(sum(math.prod(shape) for shape in shapes), dtype=scattered.dtype)  # (W,)
    if group.size == 1 or not flat.size:
        return scattered

    def side_by_side() -> None:           # after the reduce-scatter: its queue is in order
        flat[...] = xp.concatenate([p.reshape(-1) for p in scattered.wait()])
        if fmt is not None:
            flat[...] = quantize(flat, fmt)
    laid = submit(side_by_side, async_op)
    if fmt is not None:
        work, averaged = all_reduce_in_format(flat, "avg", group, fmt, async_op)
    else:
        OBSERVED.note("all_reduce", group, flat.nbytes)
        work = all_reduce(flat, op=ReduceOp.AVG, group=group, async_op=async_op)
        averaged = lambda: flat                          # (the all-reduce works in place)

    def cut_apart() -> list:
        if laid is not None:
            laid.wait()                                  # (its error, if it failed)
        out, start, whole = [], 0, averaged()
        for shape in shapes:
            size = math.prod(shape)
            out.append(whole[start:start + size].reshape(shape))
            start += size
        return out
    return ScatteredDim0(work, cut_apart, scattered.shapes, scattered.r, scattered.dtype)
