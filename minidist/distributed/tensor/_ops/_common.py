"""How a sharding rule is applied: redistribute the inputs, run the op locally, wrap the output.

A rule looks at one mesh dimension at a time and says: the placements the inputs
must have (they are redistributed to them first, as torch does where the current
ones do not fit), the placements their gradients will come back in, and the
output's placement. The op then runs on the local tensors, as autograd ops, with
no communication of its own. Where a rule is None on some mesh dimension, every
input goes to Replicate (the op then runs whole on every rank), as torch falls
back, and a warning names the op and the placements, once for each.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable

from minidist.backend import from_host, is_array
from minidist.distributed.tensor.placement_types import Partial, Replicate

_WARNED: set = set()
R, P = Replicate(), Partial()


def check_dtensors(op: str, *xs: Any) -> None:
    """Every argument a DTensor on one mesh, or a clear error (torch refuses the mix too)."""
    from minidist.distributed.tensor._api import DTensor
    for x in xs:
        if not isinstance(x, DTensor):
            raise TypeError(f"{op}: got a {type(x).__name__} beside DTensors; make it one "
                            "first: distribute_tensor(t, mesh, [Replicate()] * mesh.ndim)")
    for x in xs[1:]:
        if x.device_mesh != xs[0].device_mesh:
            raise ValueError(f"{op}: DTensors on different meshes ({xs[0].device_mesh} and "
                             f"{x.device_mesh}); redistribute onto one mesh first")


def run_rule(op: str, fn: Callable, inputs: list[Any], rules: list, out_shape: tuple) -> Any:
    """Apply per-mesh-dim ``rules`` [(input placements, grad placements, output)], or the
    Replicate fallback where a rule is None; then ``fn`` on the local tensors."""
    check_dtensors(op, *inputs)
    mesh = inputs[0].device_mesh
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
    if not is_array(y.data):        # NumPy reduces to a scalar: collectives need an array
        y.data = from_host(y.data, y.data.dtype)
    dtensor = type(inputs[0])       # DTensor, whose methods call these rules (_api.py)
    return dtensor.from_local(y, mesh, out, shape=out_shape)


def grad_of(placements: list) -> tuple:
    """The placements a gradient comes back in: the input's, with Partial read as Replicate."""
    return tuple(R if p.is_partial() else p for p in placements)
