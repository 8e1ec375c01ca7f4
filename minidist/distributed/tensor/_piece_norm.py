"""How a parameter cut over ranks adds its share of a gradient norm to the others'.

A parameter that ``fully_shard`` or ``parallelize_module`` cut is, on each rank, a
piece of the whole tensor: Shard(d) along some dimensions of a device mesh,
Replicate along others. The whole tensor's norm share (sum |g|^p; max |g| for
p = inf) is the sum (max) of the pieces' shares over the ranks of every mesh
dimension that cuts it, and nothing over a dimension that replicates it (each of
those ranks holds the same piece):

    share(whole) = all_reduce_sum over the Shard dims' groups ( share(my piece) )

A parameter cut twice (tensor parallel, then ``fully_shard`` over the data-parallel
mesh: torchtitan's 2-D) adds over both cuts' groups. Pieces without a mesh add over
a group (``note_piece_over``): expert e's parameters live on one rank of each
expert-parallel group, and the Megatron-style layers of parallel/tensor/ hold a
slice on each rank of the tensor-parallel group.

``optim.clip_grad_norm_`` sums the pieces of one kind first and calls ``combine``
once per kind (optim/clip.py), and ``GradScaler`` max-combines its inf / NaN flag
the same way (precision/grad_scaler.py); autograd/pieces.py keeps the registry.
A pipeline stage's parameters are noted over the pipeline group (``note_stage``), for
GradScaler's flag only: every stage skips a step that one process would skip.
"""
from __future__ import annotations

import math
from typing import Any

from minidist import backend
from minidist.autograd.pieces import piece_layout, register_piece, register_stage
from minidist.comm.collectives.api import all_reduce
from minidist.comm.group import resolve
from minidist.comm.transport.reduce_op import ReduceOp
from minidist.distributed.tensor.placement_types import Shard


class PieceNorm:
    """How one kind of piece combines: over ``groups`` (each a collective, in order) for
    a sum over the model (a gradient norm, an inf flag); over ``tensor_groups``, those of
    them that cut one tensor, for a statistic of the tensor itself (a trust ratio's norm,
    an FP8 amax). An expert is a whole tensor held by one rank of its group, a different
    one on each: it adds over the group to the model's norm, but its own norm is its
    rank's. ``key`` tells kinds apart on this rank (optim/clip.py orders the kinds as the
    parameter list meets them)."""

    def __init__(self, groups: list, key: tuple, tensor_groups: list | None = None):
        self.groups, self.key = list(groups), key
        self.tensor_groups = list(groups) if tensor_groups is None else list(tensor_groups)

    @property
    def spread(self) -> bool:
        """Whether the holders hold different whole tensors (experts), not pieces of one."""
        return len(self.tensor_groups) < len(self.groups)

    def combine(self, share: float, norm_type: float) -> float:
        """The share of the whole tensors from this rank's pieces' share (a collective
        over each cutting group; nothing when no group cuts)."""
        return _reduce(share, norm_type, self.groups)

    def combine_tensor(self, share: float, norm_type: float) -> float:
        """The share of the one tensor this piece belongs to (a collective over each
        group that cuts it; nothing for a whole expert)."""
        return _reduce(share, norm_type, self.tensor_groups)


def _reduce(share: float, norm_type: float, groups: list) -> float:
    total = backend.from_host([share])                                       # (1,) float64
    op = ReduceOp.MAX if float(norm_type) == math.inf else ReduceOp.SUM
    for group in groups:
        all_reduce(total, op=op, group=group)
    return float(backend.to_host(total)[0])


def note_piece(param: Any, mesh: Any, placements: tuple, cut_from: Any = None) -> None:
    """Register ``param`` as a piece laid out as ``placements`` on ``mesh``: it combines
    over the group of each mesh dimension that cuts it (Shard), not over those that
    replicate it. ``cut_from``: the parameter it was cut from, when that was itself a
    piece (its groups come first)."""
    groups = [mesh.get_group(dim) for dim, p in enumerate(placements) if isinstance(p, Shard)]
    note_piece_over(param, groups, (id(mesh), tuple(placements)), cut_from)


def note_piece_over(param: Any, groups: list, key: Any, cut_from: Any = None,
                    whole_tensors: bool = False) -> None:
    """Register ``param`` as a piece whose holders are spread over ``groups``.
    ``whole_tensors``: each holder holds a different whole tensor (expert parallelism:
    expert e's parameters live on one rank of the expert-parallel group), so the
    model's sums add over ``groups`` but the tensor's own statistics do not."""
    before = piece_layout(cut_from) if cut_from is not None else None
    cuts = [] if whole_tensors else list(groups)
    if before is not None:
        groups, key = before.groups + list(groups), before.key + (key,)
        cuts = before.tensor_groups + cuts
    else:
        key = (key,)
    register_piece(param, PieceNorm(groups, key, cuts))


def note_stage(params: Any, group: Any) -> None:
    """Register ``params`` as one pipeline stage's, the other stages on the ranks of
    ``group`` (None: the world): an inf / NaN flag max-combines over it. Nothing for a
    pipeline of one stage."""
    if resolve(group).size == 1:
        return
    key = ("pipeline stage", tuple(resolve(group).ranks))
    layout = PieceNorm([group], key, tensor_groups=[])
    for param in params:
        register_stage(param, layout)


def refuse_pieces_as_replicas(named_params: list, group: Any, strategy: str) -> None:
    """Raise if a parameter is a piece cut over ranks that ``group`` also holds.

    A data-parallel strategy (ZeRO, fully_shard) treats the ranks of its group as
    holders of one tensor: it broadcasts rank 0's values and averages (or shards)
    the gradients. A piece cut over those same ranks (expert parallelism: each rank
    holds other experts; a tensor-parallel slice) is a different tensor on each of
    them, so rank 0's experts would overwrite the others' and the gradients of
    different experts be averaged as copies. Pieces cut over another dimension of the
    mesh (one rank in common with ``group``, torchtitan's 2-D) are what it composes with.
    """
    mine = set(resolve(group).ranks)
    for name, param in named_params:
        layout = piece_layout(param)
        for cut in (layout.groups if layout is not None else ()):
            shared = sorted(mine & set(resolve(cut).ranks))
            if len(shared) > 1:
                raise ValueError(
                    f"{strategy} over ranks {sorted(mine)} cannot hold {name!r}: it is one "
                    f"rank's piece of a tensor cut over ranks {resolve(cut).ranks} (expert "
                    f"parallelism: each rank holds other experts), so ranks {shared} hold "
                    f"different tensors that {strategy} would treat as copies (overwrite "
                    "with rank 0's, average their gradients). Give it a group whose ranks "
                    "hold the same piece (ExpertMesh.dp_group for experts), or train "
                    "expert parallelism with sync_expert_parallel_gradients (docs/moe.md)")
