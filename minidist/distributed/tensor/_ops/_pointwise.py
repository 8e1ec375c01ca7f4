"""add, sub, mul of two DTensors of one shape, per mesh dimension.

    a, b                       out        da, db arrive as
    equal Shard or Replicate   the same   the same
    Partial + Partial          Partial    Replicate, Replicate     (add, sub)
    Partial * Replicate        Partial    Replicate, Partial       (mul: linear in one)
"""
from __future__ import annotations

from typing import Any

from minidist.distributed.tensor._ops._common import P, R, Rule, run_rule
from minidist.distributed.tensor.placement_types import Placement


def elementwise(op: str, a: Any, b: Any) -> Any:
    """add, sub or mul of two DTensors of one shape (module docstring)."""
    if a.shape != b.shape:
        raise ValueError(f"{op}: DTensors of shapes {a.shape} and {b.shape}; this rule takes "
                         "equal shapes (redistribute to Replicate and broadcast locally)")

    def rule(pa: Placement, pb: Placement):
        if pa == pb and not pa.is_partial():
            return Rule((pa, pb), (pa, pb), pa)
        if pa == pb == P and op in ("add", "sub"):
            return Rule((P, P), (R, R), P)
        if op == "mul" and pa == P and pb.is_replicate():
            return Rule((P, R), (R, P), P)
        if op == "mul" and pa.is_replicate() and pb == P:
            return Rule((R, P), (P, R), P)
        return None
    fn = {"add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y}[op]
    return run_rule(op, fn, [a, b], [rule(pa, pb) for pa, pb in zip(a.placements, b.placements)],
                    a.shape)
