"""Sharding propagation: which placements an op's output has, given its inputs', per mesh dim.

Each rule says, for one mesh dimension at a time, the placements the inputs must
have (redistributed to them first where they differ), the placements their
gradients come back in, and the output's placement; the op then runs on the
local tensors with no communication of its own (torch.distributed.tensor._ops).

Files, in reading order (each docstring has its rule as a table):

    _common.py         applying a rule; the fallback to Replicate with one warning
    _matrix.py         matmul: Megatron's column (Replicate . Shard(1)) and row
                       (Shard(-1) . Shard(0) -> Partial) layers
    _pointwise.py      add, sub, mul with broadcasting; torch's cost estimate picks
    _reductions.py     sum, mean (keepdim): a cut reduced dim -> Partial(sum) / Partial(avg)
    _normalization.py  softmax, log_softmax, layer_norm, rms_norm: the normalised dim whole
    _embedding.py      embedding: a vocab-cut table -> Partial (torch's MaskPartial)
    _view.py           reshape / view, transpose, permute: a cut dim that maps cleanly
    _loss.py           cross_entropy; vocab-parallel under loss_parallel()
"""
from minidist.distributed.tensor._ops._common import run_rule
from minidist.distributed.tensor._ops._embedding import embedding
from minidist.distributed.tensor._ops._loss import cross_entropy
from minidist.distributed.tensor._ops._matrix import matmul
from minidist.distributed.tensor._ops._normalization import (layer_norm, log_softmax, rms_norm,
                                                             softmax)
from minidist.distributed.tensor._ops._pointwise import elementwise
from minidist.distributed.tensor._ops._reductions import reduction
from minidist.distributed.tensor._ops._view import permute, reshape, transpose, view_groups

__all__ = ["run_rule", "matmul", "elementwise", "reduction", "softmax", "log_softmax",
           "layer_norm", "rms_norm", "embedding", "reshape", "permute", "transpose",
           "view_groups", "cross_entropy"]
