"""DataParallelNaive: the plainest data parallelism, kept as the oracle of the fast one.

Every rank holds the whole model and a different slice of the batch. After
backward, each gradient is summed over the N ranks and divided by N:

    g = (1/N) * sum_r g_r          one all_reduce per parameter, after backward

With the loss of each rank a mean over its B samples, g is exactly the gradient
of the mean loss over the N*B samples of the global batch (up to the order of
the float additions), so every rank takes the same step as one process would
on the concatenated batch. Not used in practice: one collective per parameter
pays the latency alpha once per parameter, and no communication overlaps the
backward. ``DistributedDataParallel`` (ddp.py) fixes both; tests compare the
two. The demo is demos/04_ddp.py.
"""
from __future__ import annotations

from typing import Any

import minidist.distributed as dist
from minidist.distributed._shared_tokens import share_tokens
from minidist.distributed.tensor._piece_norm import refuse_pieces_as_replicas
from minidist.nn.module import Module


def group_src(group: Any) -> int:
    """The global rank of the group's rank 0 (collectives take global src ranks)."""
    return 0 if group is None else group.global_rank(0)


def broadcast_parameters(module: Module, group: Any = None) -> None:
    """Make every rank start from rank 0's parameters (in place)."""
    src = group_src(group)
    for p in module.parameters():
        dist.broadcast(p.data, src=src, group=group)


def _max_over(group: Any):
    """A function: a 0-d array -> its max over the ranks of ``group`` (on every rank)."""
    def reduce(value: Any) -> Any:
        value = value.reshape(1).copy()                     # (1,): all_reduce works in place
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
        return value.reshape(())
    return reduce


def found_inf_reduce(group: Any = None):
    """For ``GradScaler(found_inf_reduce=...)``: a rank that saw inf / NaN makes every
    rank skip the step (MAX of the 0-d flag), so the replicas never step apart."""
    return _max_over(group)


def amax_reduce(group: Any = None):
    """For an FP8 recipe's ``amax_reduce=...`` (``DelayedScaling``, ``CurrentScaling``):
    every amax is the max over ``group``'s ranks, so they share one scale per tensor:
    over the data-parallel group, the global batch's amax (torchao's delayed scaling);
    over the tensor-parallel group, the whole activation's when heads are split."""
    return _max_over(group)


class DataParallelNaive(Module):
    """Wrap ``module``; call ``sync_gradients()`` after ``loss.backward()``.

        model = DataParallelNaive(MLP(...))
        loss = loss_fn(model(x_mine), y_mine); loss.backward()
        model.sync_gradients()            # p.grad = mean over ranks, on every rank
        optimizer.step()

    Parameters are broadcast from rank 0 at construction. A parameter whose
    grad is None (unused in this forward) is skipped; it must then be unused on
    every rank, or the ranks' collectives no longer match (a loud error).
    """

    def __init__(self, module: Module, group: Any = None):
        super().__init__()
        self.module = module
        self.group = group
        # every rank's copy must be one tensor: not an expert rank's own experts
        refuse_pieces_as_replicas(list(module.named_parameters()), group, "DDP")
        broadcast_parameters(module, group)
        share_tokens(module, group, "batch")    # the routers' counts: every replica's batch

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def sync_gradients(self) -> None:
        n = dist.get_world_size(self.group)
        for p in self.module.parameters():
            if p.grad is None:
                continue
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=self.group)
            p.grad /= n                                      # sum -> mean over ranks
