"""sum and mean over dims (with keepdim), per mesh dimension, as torch reduces.

    x's placement           sum                          mean
    Shard(d), d reduced     Partial(sum)                 Partial(avg)   (evenly cut d only)
    Shard(d), d kept        Shard(d') (d' = d less the reduced dims before it; d if keepdim)
    Replicate               Replicate                    Replicate
    Partial(sum)            Partial(sum)                 -> Replicate first
    Partial(avg)            -> Replicate first           Partial(avg)

A reduction f is linear over pieces when f of the pieces' results is f of the
whole: sum of local sums is the sum; avg of local means is the mean only when
every piece has as many elements, so a mean over an unevenly cut dim (and any
reduction of a Partial of another op) first redistributes that mesh dimension
to Replicate, as torch does. The gradient comes back laid out as x:

    sum:   dx = dy broadcast back over the reduced dims
    mean:  dx = dy broadcast back / N,  N = the global count of reduced elements

(the local mean divides by the local count n; its gradient must divide by N = n * shards,
so mean runs as ``_LocalMean``, whose backward uses the global N).
"""
from __future__ import annotations

from typing import Any

from minidist.autograd.function import Function
from minidist.autograd.ops._util import expand_reduced
from minidist.backend import xp
from minidist.distributed.tensor._ops._common import R, Rule, run_rule
from minidist.distributed.tensor._redistribute import normalize_for_grad
from minidist.distributed.tensor.placement_types import Partial, Placement, Shard


class _LocalMean(Function):
    """y = mean of the local piece over ``axes``; dx = dy broadcast back / ``count`` (global)."""

    @staticmethod
    def forward(ctx, a, *, axes, keepdims, count):
        ctx.shape, ctx.axes, ctx.keepdims, ctx.count = a.shape, axes, keepdims, count
        return a.mean(axis=axes, keepdims=keepdims)

    @staticmethod
    def backward(ctx, grad):
        g = expand_reduced(grad, ctx.shape, ctx.axes, ctx.keepdims) / ctx.count
        return xp.broadcast_to(g, ctx.shape)


def _dims(x: Any, dim: Any) -> tuple[int, ...]:
    dims = tuple(range(x.ndim)) if dim is None else (dim,) if isinstance(dim, int) else dim
    for d in dims:
        if not -max(x.ndim, 1) <= d < max(x.ndim, 1):
            raise ValueError(f"dim {d} is out of range for a DTensor of {x.ndim} dimensions")
    return tuple(sorted(d % x.ndim for d in dims)) if x.ndim else ()


def reduction(op: str, x: Any, dim: Any = None, keepdim: bool = False) -> Any:
    """``op`` ("sum" or "mean") over ``dim`` (an int, a tuple, or None: all), module
    docstring's table."""
    dims = _dims(x, dim)
    kept = [d for d in range(x.ndim) if d not in dims]
    reduce_op = "avg" if op == "mean" else "sum"
    shards = {d: 1 for d in dims}
    for n, p in zip(x.device_mesh.shape, x.placements):
        if isinstance(p, Shard) and p.dim in shards:
            shards[p.dim] *= n
    # torch: avg of local means is the mean only if every piece is as large
    linear = all(x.shape[d] % shards[d] == 0 for d in dims) or op == "sum"

    def rule(p: Placement):
        if p.is_partial() and (p.reduce_op != reduce_op or not linear):
            return Rule((R,), (R,), R)
        if isinstance(p, Shard) and p.dim in dims:
            if not linear:
                return Rule((R,), (R,), R)
            return Rule((p,), (p,), Partial(reduce_op))
        if isinstance(p, Shard):
            return Rule((p,), (p,), Shard(p.dim if keepdim else kept.index(p.dim)))
        return Rule((p,), normalize_for_grad((p,)), p)
    rules = [rule(p) for p in x.placements]
    shape = tuple(1 if d in dims else s for d, s in enumerate(x.shape)) if keepdim else \
        tuple(x.shape[d] for d in kept)
    if op == "sum":
        fn = lambda t: t.sum(axis=dims, keepdims=keepdim)            # noqa: E731
    else:
        count = 1
        for d in dims:
            count *= x.shape[d]
        fn = lambda t: _LocalMean.apply(t, axes=dims, keepdims=keepdim, count=count)  # noqa
    return run_rule(op, fn, [x], rules, shape)
