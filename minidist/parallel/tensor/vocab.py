"""The vocabulary split across the tensor-parallel group: embedding and cross-entropy.

Rank r holds vocabulary rows [r V/t, (r+1) V/t) of the embedding E (V, C). The
output head is tied to E (or split the same way), so each rank also computes
only its V/t columns of the logits. Neither side ever builds the full (B, T, V)
logits on one rank:

    embedding       out = sum over ranks of (E_r[id - start] if id is mine else 0)
                    one all-reduce (g), or a reduce-scatter under sequence parallelism

    cross-entropy   with z the logits, t the target, each rank holding z[:, mine]:
                    M   = max_r  max_j z_j           all-reduce MAX   (N,)
                    S   = sum_r  sum_j e^(z_j - M)   all-reduce SUM   (N,)
                    z_t = the one rank owning t contributes z_t, the others 0:
                                                     all-reduce SUM   (N,)
                                                     (one call with S: (2, N))
                    loss_i = log S + M - z_t ;  L = mean over rows (ignore_index excluded)
                    dL/dz_j = (e^(z_j - M - log S) - [j == t]) / n_valid,  on the rank's
                    own columns: the backward needs no communication at all. (The
                    softmax as e^(log-softmax), the dense cross-entropy's formula: with
                    t = 1 every bit is the dense loss's; with t > 1 only S, a sum over
                    the ranks, is added in another order.)

Two all-reduces (N and 2N numbers) replace an all-gather of N x V logits
(Megatron-LM's vocab-parallel cross-entropy).
"""
from __future__ import annotations

from typing import Any

import minidist.distributed as dist
from minidist.autograd.function import Function
from minidist.autograd.tensor import Tensor, array_of
from minidist.backend import xp
from minidist.nn import functional as F
from minidist.nn.layers import Embedding
from minidist.nn.module import Module, Parameter
from minidist.distributed.tensor.parallel.style import check_sequence_split
from minidist.parallel.tensor.layers import note_tp_pieces
from minidist.parallel.tensor.mappings import reduce_from_tp, reduce_scatter_to_sp


def vocab_range(vocab_size: int, group: Any = None) -> tuple[int, int]:
    """[start, stop) of the vocabulary rows this rank holds."""
    t, r = dist.get_world_size(group), dist.get_rank(group)
    if vocab_size % t:
        raise ValueError(f"vocab_size={vocab_size} is not divisible by the tensor-parallel "
                         f"size {t} (pad the vocabulary to a multiple of it)")
    per_rank = vocab_size // t
    return r * per_rank, (r + 1) * per_rank


class VocabParallelEmbedding(Module):
    """Embedding (V, C) split by vocabulary rows; each rank looks up the ids it owns."""

    sharded = ("weight",)           # parameters split over the group

    def __init__(self, num_embeddings: int, embedding_dim: int, dtype: str = "float32",
                 std: float = 1.0, generator: Any = None, group: Any = None,
                 sequence_parallel: bool = False):
        super().__init__()
        self.group, self.sequence_parallel = group, sequence_parallel
        self.start, self.stop = vocab_range(num_embeddings, group)
        dense = Embedding(num_embeddings, embedding_dim, dtype, std, generator)
        self.weight = Parameter(self.shard("weight", dense.weight.data))  # (V/t, C)
        note_tp_pieces(self, group, ("weight",))

    def shard(self, name: str, full: Any) -> Any:
        return full[self.start:self.stop].copy()

    def forward(self, ids: Any) -> Tensor:
        ids = array_of(ids)
        outside = (ids < self.start) | (ids >= self.stop)
        local = xp.where(outside, 0, ids - self.start)                # row 0 stands in
        out = F.embedding(local, self.weight)                          # (B, T, C)
        keep = (~outside).astype(out.dtype)[..., None]                 # zero the stand-ins
        out = out * keep                                               # (their gradient too)
        if self.sequence_parallel:
            check_sequence_split(out.shape[1], dist.get_world_size(self.group))
            return reduce_scatter_to_sp(out, axis=1, group=self.group)  # (B, T/t, C)
        return reduce_from_tp(out, self.group)                         # g: (B, T, C)


class VocabParallelCrossEntropy(Function):
    """Mean cross-entropy from vocabulary-split logits (see the module docstring)."""

    @staticmethod
    def forward(ctx, logits, targets, group=None, ignore_index=-100):
        start, stop = vocab_range(logits.shape[-1] * dist.get_world_size(group), group)
        z = logits.reshape(-1, logits.shape[-1])                       # (N, V/t)
        t = targets.reshape(-1)                                        # (N,)
        tp = dist.get_world_size(group) > 1

        m = z.max(axis=-1)                                             # (N,) local max
        if tp:
            dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)      # global max
        e = xp.exp(z - m[:, None])                                     # (N, V/t)
        s = e.sum(axis=-1)                                             # (N,)
        mine = (t >= start) & (t < stop)
        rows = xp.arange(z.shape[0])
        local_t = xp.where(mine, t - start, 0)
        z_t = xp.where(mine, z[rows, local_t] - m, xp.zeros((), z.dtype))   # (N,) z_t - M
        if tp:
            both = xp.stack([s, z_t])                                  # one call for two sums
            dist.all_reduce(both, group=group)
            s, z_t = both[0], both[1]
        valid = t != ignore_index
        losses = xp.where(valid, xp.log(s) - z_t, xp.zeros((), z.dtype))   # (N,)
        n_valid = valid.sum().astype(z.dtype)   # 0 if all ignored: nan, as the dense loss
        ctx.save_for_backward(z - m[:, None], xp.log(s), local_t, mine & valid, valid)
        ctx.shape, ctx.n_valid = logits.shape, xp.maximum(n_valid, 1)
        return losses.sum() / n_valid

    @staticmethod
    def backward(ctx, grad):
        shifted, log_s, local_t, hit, valid = ctx.saved
        g = xp.exp(shifted - log_s[:, None])                           # softmax, my columns
        rows = xp.arange(g.shape[0])
        g[rows, local_t] -= hit.astype(g.dtype)                        # - onehot(t), if t is mine
        g *= valid[:, None].astype(g.dtype) * (grad / ctx.n_valid)
        return g.reshape(ctx.shape), None


def vocab_parallel_cross_entropy(logits: Tensor, targets: Any, group: Any = None,
                                 ignore_index: int = -100) -> Tensor:
    """logits (..., V/t), this rank's vocabulary columns; targets (...) global ids."""
    return VocabParallelCrossEntropy.apply(logits, array_of(targets), group=group,
                                           ignore_index=ignore_index)
