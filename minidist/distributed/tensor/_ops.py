"""Sharding propagation: which placements an op's output has, given its inputs', per mesh dim.

Each rule looks at one mesh dimension at a time and says: the placements the
inputs must have (they are redistributed to them), the placements their
gradients will come back in, and the output's placements. The op then runs on
the local tensors, as autograd ops, with no communication of its own:

    matmul  A (.., m, k) @ B (k, n)          out          dA, dB arrive as
    Replicate      · Replicate               Replicate    Replicate, Replicate
    Shard(i<last)  · Replicate               Shard(i)     Shard(i),  Partial
    Replicate      · Shard(1)                Shard(-1)    Partial,   Shard(1)
    Shard(-1)      · Shard(0)                Partial      Shard(-1), Shard(0)
    Partial        · Replicate               Partial      Replicate, Partial
    Replicate      · Partial                 Partial      Partial,   Replicate

    add, sub (same shapes): equal placements stay (Partial + Partial = Partial);
    mul: equal Shard / Replicate stay, Partial * Replicate = Partial (linear in one);
    sum over dims: Shard of a summed dim -> Partial, of a kept dim -> Shard, others stay.

The inputs are DTensors (_api.py, whose operators call these functions).
Where no rule fits, every input goes to Replicate (the op then runs whole on
every rank), as torch falls back, and a warning names the op and placements,
once for each.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable

from minidist.distributed.tensor.placement_types import Partial, Placement, Replicate, Shard

_WARNED: set = set()
R, P = Replicate(), Partial()


def _run(op: str, fn: Callable, inputs: list[Any], rules: list, out_shape: tuple) -> Any:
    """Apply per-mesh-dim ``rules`` [(input placements, grad placements, output)], or the
    Replicate fallback where a rule is None; then ``fn`` on the local tensors."""
    mesh = inputs[0].device_mesh
    for x in inputs[1:]:
        if x.device_mesh != mesh:
            raise ValueError(f"{op}: Anys on different meshes ({mesh} and {x.device_mesh}); "
                             "redistribute onto one mesh first")
    if any(rule is None for rule in rules):
        key = (op, tuple(x.placements for x in inputs))
        if key not in _WARNED:
            _WARNED.add(key)
            warnings.warn(f"{op}: no sharding rule for placements "
                          f"{[list(x.placements) for x in inputs]}; redistributing every "
                          "input to Replicate()", stacklevel=3)
        rules = [None] * mesh.ndim
    n = len(inputs)
    ins = [[r[0][k] if r else R for r in rules] for k in range(n)]
    grads = [[r[1][k] if r else R for r in rules] for k in range(n)]
    out = [r[2] if r else R for r in rules]
    locals_ = [x.redistribute(mesh, p).to_local(grad_placements=g)
               for x, p, g in zip(inputs, ins, grads)]
    y = fn(*locals_)
    dtensor = type(inputs[0])       # DTensor, whose methods call these rules (_api.py)
    return dtensor.from_local(y, mesh, out, shape=out_shape)


def matmul(a: Any, b: Any) -> Any:
    """A (.., m, k) @ B (k, n) (module docstring's table)."""
    if b.ndim != 2 or a.ndim < 2 or a.shape[-1] != b.shape[0]:
        raise ValueError(f"matmul: shapes {a.shape} @ {b.shape}: this rule takes A (.., m, k) "
                         "and B (k, n)")
    last = a.ndim - 1

    def rule(pa: Placement, pb: Placement):
        if pa.is_replicate() and pb.is_replicate():
            return (R, R), (R, R), R
        if isinstance(pa, Shard) and pa.dim < last and pb.is_replicate():
            return (pa, R), (pa, P), pa
        if pa.is_replicate() and pb == Shard(1):
            return (R, pb), (P, pb), Shard(last)
        if pa == Shard(last) and pb == Shard(0):
            return (pa, pb), (pa, pb), P
        if pa == P and pb.is_replicate():
            return (P, R), (R, P), P
        if pa.is_replicate() and pb == P:
            return (R, P), (P, R), P
        return None
    rules = [rule(pa, pb) for pa, pb in zip(a.placements, b.placements)]
    return _run("matmul", lambda x, y: x @ y, [a, b], rules, a.shape[:-1] + (b.shape[1],))


def elementwise(op: str, a: Any, b: Any) -> Any:
    """add, sub or mul of two Anys of one shape."""
    if a.shape != b.shape:
        raise ValueError(f"{op}: Anys of shapes {a.shape} and {b.shape}; this rule takes "
                         "equal shapes (redistribute to Replicate and broadcast locally)")

    def rule(pa: Placement, pb: Placement):
        if pa == pb and not pa.is_partial():
            return (pa, pb), (pa, pb), pa
        if pa == pb == P and op in ("add", "sub"):
            return (P, P), (R, R), P
        if op == "mul" and pa == P and pb.is_replicate():
            return (P, R), (R, P), P
        if op == "mul" and pa.is_replicate() and pb == P:
            return (R, P), (P, R), P
        return None
    fn = {"add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y}[op]
    return _run(op, fn, [a, b], [rule(pa, pb) for pa, pb in zip(a.placements, b.placements)],
                a.shape)


def sum_(x: Any, dim: Any = None, keepdim: bool = False) -> Any:
    """Sum over ``dim`` (an int, a tuple, or None: all)."""
    dims = tuple(range(x.ndim)) if dim is None else (dim,) if isinstance(dim, int) else dim
    dims = tuple(d % x.ndim for d in dims)
    kept = [d for d in range(x.ndim) if d not in dims]

    def rule(p: Placement):
        if isinstance(p, Shard) and p.dim in dims:
            return (p,), (p,), P
        if isinstance(p, Shard):
            return (p,), (p,), Shard(p.dim if keepdim else kept.index(p.dim))
        return (p,), (R,) if p.is_partial() else (p,), p
    shape = tuple(1 if d in dims else s for d, s in enumerate(x.shape)) if keepdim else \
        tuple(x.shape[d] for d in kept)
    return _run("sum", lambda t: t.sum(axis=dims, keepdims=keepdim), [x],
                [rule(p) for p in x.placements], shape)
