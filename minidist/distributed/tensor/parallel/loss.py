"""loss_parallel: cross-entropy on logits sharded by vocabulary, without gathering them.

    with loss_parallel():
        loss = F.cross_entropy(logits, targets)   # logits: a (N, V) DTensor, [Shard(1)]
        loss.backward()                           # (or (B, T, V), [Shard(2)]: a GPT's)

``F.cross_entropy`` on a DTensor reaches the DTensor's rule (tensor/_ops/_loss.py,
which has the formula) by its ``__torch_function__``; inside this context the rule
computes the loss from each rank's columns with three all-reduces of N numbers,
and the gradient, softmax - onehot, stays sharded. Outside it, the logits are
gathered to Replicate first (the class dim must be whole for a softmax). The loss
is a Replicate DTensor, as torch's.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

from minidist.distributed.tensor._ops._loss import LOSS_PARALLEL, vocab_parallel_cross_entropy

__all__ = ["loss_parallel", "vocab_parallel_cross_entropy"]


@contextlib.contextmanager
def loss_parallel() -> Iterator[None]:
    """Within it, ``F.cross_entropy`` on a DTensor cut by vocabulary is vocab-parallel."""
    before = LOSS_PARALLEL["on"]
    LOSS_PARALLEL["on"] = True
    try:
        yield
    finally:
        LOSS_PARALLEL["on"] = before
