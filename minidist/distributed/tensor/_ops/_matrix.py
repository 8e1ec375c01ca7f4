"""matmul: A (.., m, k) @ B (k, n), per mesh dimension.

    A              · B              out          dA, dB arrive as
    Replicate      · Replicate      Replicate    Replicate, Replicate
    Shard(i<last)  · Replicate      Shard(i)     Shard(i),  Partial
    Replicate      · Shard(1)       Shard(-1)    Partial,   Shard(1)
    Shard(-1)      · Shard(0)       Partial      Shard(-1), Shard(0)
    Partial        · Replicate      Partial      Replicate, Partial
    Replicate      · Partial        Partial      Partial,   Replicate

The third and fourth rows are Megatron's column and row layers.
"""
from __future__ import annotations

from typing import Any

from minidist.distributed.tensor._ops._common import P, R, Rule, run_rule
from minidist.distributed.tensor.placement_types import Placement, Shard


def matmul(a: Any, b: Any) -> Any:
    """A (.., m, k) @ B (k, n) (module docstring's table)."""
    if b.ndim != 2 or a.ndim < 2 or a.shape[-1] != b.shape[0]:
        raise ValueError(f"matmul: shapes {a.shape} @ {b.shape}: this rule takes A (.., m, k) "
                         "and B (k, n)")
    last = a.ndim - 1

    def rule(pa: Placement, pb: Placement):
        if pa.is_replicate() and pb.is_replicate():
            return Rule((R, R), (R, R), R)
        if isinstance(pa, Shard) and pa.dim < last and pb.is_replicate():
            return Rule((pa, R), (pa, P), pa)
        if pa.is_replicate() and pb == Shard(1):
            return Rule((R, pb), (P, pb), Shard(last))
        if pa == Shard(last) and pb == Shard(0):
            return Rule((pa, pb), (pa, pb), P)
        if pa == P and pb.is_replicate():
            return Rule((P, R), (R, P), P)
        if pa.is_replicate() and pb == P:
            return Rule((R, P), (P, R), P)
        return None
    rules = [rule(pa, pb) for pa, pb in zip(a.placements, b.placements)]
    return run_rule("matmul", lambda x, y: x @ y, [a, b], rules, a.shape[:-1] + (b.shape[1],))
