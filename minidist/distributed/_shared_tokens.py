"""Which ranks share a batch's tokens: the groups a router's statistics are summed over.

One process routes every token of the batch, and its balancing loss and its bias
update count them all. A strategy that splits the tokens over ranks says so once,
with the group it splits them over and how:

    "sequence"   each rank holds part of every sequence (context parallelism): the
                 statistics of one micro-batch are the sum over the group, always
    "batch"      each rank holds other sequences (data parallelism, ZeRO, FSDP2,
                 expert parallelism): summed for the loss under ``global_batch``
                 balancing, and for the bias update always

so that, in training, an MoE layer's counts f_i (and the tokens they count) are

    counts = all_reduce_sum over the groups of [counts_i, tokens]     (E + 1 numbers)

one all-reduce per group, per layer and forward. P_i stays each rank's own mean
with its graph: the strategies average the gradients over the same ranks, which
averages P into the global one (equal shares of tokens). Megatron-Core makes the
same cut: its ``aux_loss`` sums the counts over tensor x context parallelism, its
``global_aux_loss`` over data parallelism too. Used by nn/moe.py through
``MoE.token_share``; docs/moe.md, "Balancing over ranks".
"""
from __future__ import annotations

from typing import Any

from minidist.backend import to_host, xp
from minidist.comm.collectives.api import all_reduce
from minidist.comm.group import get_world_size, resolve
from minidist.nn.module import Module
from minidist.nn.moe import routers

KINDS = ("sequence", "batch")


class TokenShare:
    """The groups whose ranks hold the other tokens of what one MoE layer routes."""

    def __init__(self, balance: str, sequence: list, batch: list):
        self.balance = balance
        self.sequence = sequence     # groups that split each sequence: always summed
        self.batch = batch           # groups that hold other sequences of the batch

    def loss_counts(self, counts: Any, tokens: int) -> tuple[Any, int]:
        """This rank's (E,) counts and token count -> those the balancing loss uses."""
        groups = self.sequence + (self.batch if self.balance == "global_batch" else [])
        return _sum_over(groups, counts, tokens)

    def step_counts(self, counts: Any) -> Any:
        """The loss's counts of a step -> every rank's (the bias update's)."""
        if self.balance == "global_batch":
            return counts            # already summed over every group
        return _sum_over(self.batch, counts, 0)[0]


def _sum_over(groups: list, counts: Any, tokens: int) -> tuple[Any, int]:
    if not groups:
        return counts, tokens
    total = xp.zeros((counts.shape[0] + 1,), dtype="int64")
    total[:-1] = counts
    total[-1] = tokens
    for group in groups:
        all_reduce(total, group=group)
    return total[:-1], int(to_host(total[-1:])[0])


def share_tokens(module: Module, group: Any, kind: str) -> Module:
    """Say that the ranks of ``group`` hold the other tokens of what ``module``'s MoE
    layers route (``kind``: "sequence" or "batch", module docstring); a group of the
    same ranks already said is not added twice (DDP or fully_shard over each block,
    then over the model). Returns ``module``."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if get_world_size(group) == 1:
        return module
    for moe in routers(module):
        share = moe.token_share or TokenShare(moe.balance, [], [])
        if any(resolve(g).ranks == resolve(group).ranks for g in share.sequence + share.batch):
            continue
        sequence = share.sequence + ([group] if kind == "sequence" else [])
        batch = share.batch + ([group] if kind == "batch" else [])
        moe.token_share = TokenShare(moe.balance, sequence, batch)
    return module
