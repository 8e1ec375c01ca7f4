"""cross_entropy on (..., V) DTensor logits; vocab-parallel inside ``loss_parallel()``.

    logits          loss_parallel()   what runs                                    loss
    [Shard(-1)]     on                vocab-parallel (below): 3 all-reduces of N    Replicate
    any             off               the logits made Replicate (a cut class dim    Replicate
                                      must be whole for log_softmax, as in torch),
                                      then cross-entropy on every rank

Vocab-parallel: each rank holds V/t columns of the logits (N rows: every position of
the leading dims, a GPT's B T). With m the row max
(an all-reduce of max; a constant for the gradient), the loss of a row is

    lse - z[target],  lse = m + log sum_r sum_(j in r) exp(z_j - m)

The inner sums are Partial summands, made Replicate by one all-reduce; z[target]
is nonzero on the one rank that holds the target's column (torch's MaskPartial),
so it is a Partial too and a second all-reduce gives it to every rank. Three
all-reduces of N numbers, instead of gathering N x V logits. The gradient,
softmax - onehot, stays sharded: each rank's backward touches only its columns.
``F.cross_entropy`` reaches this function by the DTensor's ``__torch_function__``;
``loss_parallel()`` (tensor/parallel/loss.py) switches the first row on, as
torch's context installs its handlers for log_softmax and nll_loss.
"""
from __future__ import annotations

from typing import Any

from minidist.autograd.tensor import Tensor
from minidist.backend import to_host, xp
from minidist.distributed.tensor import _collectives as coll
from minidist.distributed.tensor._ops._common import R, check_dtensors
from minidist.distributed.tensor.placement_types import Partial, Replicate, Shard
from minidist.nn import functional as F

LOSS_PARALLEL = {"on": False}       # set by loss_parallel()


def _replicate(summand: Tensor, mesh: Any) -> Tensor:
    """Sum a Partial summand over the mesh (an all-reduce; backward: the identity)."""
    from minidist.distributed.tensor._api import DTensor
    return DTensor.from_local(summand, mesh, [Partial()]).redistribute(
        mesh, [Replicate()]).to_local()


def vocab_parallel_cross_entropy(logits: Any, targets: Any, ignore_index: int = -100,
                                 reduction: str = "mean") -> Tensor:
    """Cross-entropy of (..., V) logits laid out as [Shard(-1)] (module docstring), as a
    Tensor equal on every rank."""
    mesh = logits.device_mesh
    last = logits.ndim - 1
    if mesh.ndim != 1 or logits.ndim < 2 or logits.placements[0] != Shard(last):
        raise ValueError(f"loss_parallel takes (..., V) logits sharded by vocabulary, "
                         f"[Shard({max(last, 1)})], on a 1-D mesh, got {logits.shape} as "
                         f"{list(logits.placements)}")
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    targets = targets.data if isinstance(targets, Tensor) else targets
    first = logits._spec.local_offset()[last]                  # my first vocabulary id
    z = logits.to_local()                                      # (..., V/t)
    cols = z.shape[-1]
    z = z.reshape(-1, cols)                                    # (N, V/t), N positions
    targets = targets.reshape(-1)                              # (N,)
    row_max = z.data.max(axis=1, keepdims=True) if cols else \
        xp.full((z.shape[0], 1), -xp.inf, dtype=z.dtype)
    row_max = coll.all_reduce_partial(row_max, "max", mesh.get_group(0))   # (N, 1), constant
    sums = _replicate((z - row_max).exp().sum(axis=1), mesh)  # (N,) sum_j exp(z_j - m)
    lse = sums.log() + row_max.reshape(-1)
    mine = (targets >= first) & (targets < first + cols)
    onehot = (xp.arange(cols)[None, :] == (targets - first)[:, None]) & mine[:, None]
    picked = _replicate((z * onehot.astype(z.dtype)).sum(axis=1), mesh)   # (N,) z[target]
    valid = (targets != ignore_index).astype(z.dtype)
    total = ((lse - picked) * valid).sum()
    if reduction == "sum":
        return total
    count = float(to_host(valid.sum()))
    return total * (1.0 / max(1.0, count))


def cross_entropy(logits: Any, targets: Any, ignore_index: int = -100,
                  reduction: str = "mean") -> Any:
    """F.cross_entropy on a DTensor (module docstring's table): a Replicate DTensor."""
    from minidist.distributed.tensor._api import DTensor
    check_dtensors("cross_entropy", logits)
    mesh = logits.device_mesh
    if isinstance(targets, DTensor):
        targets = targets.full_tensor()
    if LOSS_PARALLEL["on"]:
        loss = vocab_parallel_cross_entropy(logits, targets, ignore_index, reduction)
    else:
        whole = logits.redistribute(mesh, [R] * mesh.ndim).to_local()
        loss = F.cross_entropy(whole, targets, ignore_index, reduction)
    return DTensor.from_local(loss, mesh, [R] * mesh.ndim)
