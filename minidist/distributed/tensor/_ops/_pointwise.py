"""add, sub, mul of two DTensors whose shapes broadcast (NumPy's and torch's rule), per mesh dim.

The output has the broadcast shape. Output dim o maps to input dim
o - (out.ndim - x.ndim) of an input x; x is *broadcast* at o where that dim is
missing or has length 1 while the output's is longer. The candidates, on one
mesh dimension (torch's pointwise strategies):

    out          a, b are first redistributed to              da, db arrive as
    Replicate    Replicate, Replicate                          Replicate
    Shard(o)     Shard(o's dim in x), or Replicate where x     Shard, or Partial where
                 is broadcast at o                             x was broadcast (a local sum)
    Partial      Partial, Partial            (add, sub)        Replicate, Replicate
    Partial      Partial, Replicate or       (mul: linear      Replicate, Partial /
                 Replicate, Partial           in one factor)   Partial, Replicate

Among them the one whose redistributions cost least is taken, the first in
this order on a tie, with torch's alpha-beta costs per move on a mesh dim of
n ranks and M local bytes (Replicate -> anything is free; Shard -> Partial and
a change of reduction cannot be done):

    Shard -> Replicate      all-gather       6.6 + 0.6 (n - 1) us + M (n - 1) / B
    Shard -> other Shard    all-to-all       the all-gather's + 1 (torch's penalty)
    Partial -> Replicate    all-reduce       6.6 + 1.2 (n - 1) us + 2 M (n - 1) / (n B)
    Partial -> Shard        reduce-scatter   6.6 + 0.6 (n - 1) us + M (n - 1) / (n B)

So ``x + b`` with x (5, 7) Shard(0) and a bias b (7,) Replicate is Shard(0),
nothing moves, and b's gradient comes back Partial (each rank summed its rows).
"""
from __future__ import annotations

import math
from typing import Any

from minidist.distributed.tensor._ops._common import R, Rule, check_dtensors, run_rule
from minidist.distributed.tensor.placement_types import Partial, Placement, Shard

_LATENCY_US, _HOP_US, _BYTES_PER_US = 6.6, 0.6, 87.7 * 1024 ** 3 / 1e6   # torch's H100 figures
_LINEAR_IN_BOTH = ("add", "sub")


def broadcast_shape(op: str, a: tuple, b: tuple) -> tuple:
    """The broadcast shape of ``a`` and ``b``, or a clear error naming both."""
    out = []
    for k in range(1, max(len(a), len(b)) + 1):
        da = a[-k] if k <= len(a) else 1
        db = b[-k] if k <= len(b) else 1
        if da != db and 1 not in (da, db):
            raise ValueError(f"{op}: DTensors of shapes {a} and {b} do not broadcast (dim -{k}: "
                             f"{da} against {db}); each dim must be equal, 1 or missing")
        out.append(max(da, db) if 0 not in (da, db) else 0)
    return tuple(reversed(out))


def _target(x: Any, o: int, out_shape: tuple) -> Placement:
    """What input ``x`` must be for the output to be Shard(o): its own dim, or Replicate
    where x is broadcast at o."""
    d = o - (len(out_shape) - x.ndim)
    if d < 0 or x.shape[d] != out_shape[o]:
        return R
    return Shard(d)


def _gather_cost(local_bytes: float, n: int) -> float:
    """torch's all-gather estimate on a mesh dim of n: latency + bytes (module docstring)."""
    return _LATENCY_US + _HOP_US * (n - 1) + local_bytes * (n - 1) / _BYTES_PER_US


def _move_cost(x: Any, i: int, dst: Placement) -> float:
    """torch's estimate of moving x's placement on mesh dim i to dst (module docstring).
    A Shard that moves first has the later mesh dims cutting the same tensor dim gathered
    (_redistribute.py's order): their all-gathers count too."""
    src, mesh = x.placements[i], x.device_mesh.shape
    if src == dst or src.is_replicate():
        return 0.0
    if dst.is_partial():
        return math.inf                      # Shard -> Partial, or one reduction to another
    shards = math.prod(m for m, p in zip(mesh, x.placements) if p.is_shard())
    local, n = x.dtype.itemsize * math.prod(x.shape) / shards, mesh[i]
    if src.is_shard():                       # all-gather (all-to-all: + 1, torch's penalty)
        nested = sum(_gather_cost(local, mesh[j]) for j in range(i + 1, len(mesh))
                     if x.placements[j] == src)
        return _gather_cost(local, n) + nested + (1.0 if dst.is_shard() else 0.0)
    if dst.is_replicate():                   # Partial -> Replicate: all-reduce
        return _LATENCY_US + 2 * _HOP_US * (n - 1) + local * 2 * (n - 1) / n / _BYTES_PER_US
    return _gather_cost(local / n, n)        # Partial -> Shard: reduce-scatter


def _candidates(op: str, a: Any, b: Any, i: int, out_shape: tuple) -> list[tuple]:
    """(output, input placements) in torch's order of preference (module docstring)."""
    out = [(R, (R, R))]
    out += [(Shard(o), (_target(a, o, out_shape), _target(b, o, out_shape)))
            for o in range(len(out_shape))]
    partial = next((p for p in (a.placements[i], b.placements[i]) if p.is_partial()), None)
    if partial is not None and partial.reduce_op in ("sum", "avg"):   # linear reductions
        if op in _LINEAR_IN_BOTH:
            out.append((partial, (partial, partial)))
        else:
            out += [(partial, (partial, R)), (partial, (R, partial))]
    return out


def _grad(placement: Placement, out: Placement) -> Placement:
    """How an input's gradient arrives: a Shard as its Shard, a Partial input's as Replicate,
    a Replicate input's as Partial where the output is cut or Partial (a local sum)."""
    if placement.is_shard():
        return placement
    if placement.is_partial() or out.is_replicate():
        return R
    return Partial(out.reduce_op) if out.is_partial() else Partial()


def _rule(op: str, a: Any, b: Any, i: int, out_shape: tuple) -> Rule:
    """The cheapest candidate on mesh dim ``i`` (ties: the first)."""
    best, best_cost = None, math.inf
    for out, (qa, qb) in _candidates(op, a, b, i, out_shape):
        cost = _move_cost(a, i, qa) + _move_cost(b, i, qb)
        if cost < best_cost:
            best, best_cost = (out, (qa, qb)), cost
    out, ins = best
    return Rule(ins, tuple(_grad(q, out) for q in ins), out)


def elementwise(op: str, a: Any, b: Any) -> Any:
    """add, sub or mul of two DTensors whose shapes broadcast (module docstring)."""
    check_dtensors(op, a, b)
    out_shape = broadcast_shape(op, tuple(a.shape), tuple(b.shape))
    fn = {"add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y}[op]
    rules = [_rule(op, a, b, i, out_shape) for i in range(a.device_mesh.ndim)]
    return run_rule(op, fn, [a, b], rules, out_shape)
