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
from typing import Any, Callable, NamedTuple

from minidist.backend import from_host, is_array
from minidist.distributed.tensor.placement_types import Partial, Placement, Replicate

_WARNED: set = set()
R, P = Replicate(), Partial()


class Rule(NamedTuple):
    """What an op needs and gives on one mesh dimension (torch's OpStrategy, one row)."""
    inputs: tuple[Placement, ...]   # the placement each input is redistributed to first
    grads: tuple[Placement, ...]    # the placement each input's gradient comes back in
    output: Placement               # the output's placement



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


def run_rule(op: str, fn: Callable, inputs: list[Any], rules: list[Rule | None],
             out_shape: tuple) -> Any:
    """Apply one ``Rule`` per mesh dim, or the Replicate fallback where a rule is None;
    then ``fn`` on the local tensors."""
    check_dtensors(op, *inputs)
    mesh = inputs[0].device_mesh
    if any(rule is None for rule in rules):
        key = (op, tuple(x.placements for x in inputs))
        if key not in _WARNED:
            _WARNED.add(key)
            warnings.warn(f"{op}: no sharding rule for placements "
                          f"{[list(x.placements) for x in inputs]}; redistributing every "
                          "input to Replicate()", stacklevel=3)
        n = len(inputs)
        rules = [Rule((R,) * n, (R,) * n, R)] * mesh.ndim
    ins = [[rule.inputs[k] for rule in rules] for k in range(len(inputs))]
    grads = [[rule.grads[k] for rule in rules] for k in range(len(inputs))]
    out = [rule.output for rule in rules]
    locals_ = [x.redistribute(mesh, p).to_local(grad_placements=g)
               for x, p, g in zip(inputs, ins, grads)]
    y = fn(*locals_)
    if not is_array(y.data):        # NumPy reduces to a scalar: collectives need an array
        y.data = from_host(y.data, y.data.dtype)
    dtensor = type(inputs[0])       # DTensor, whose methods call these rules (_api.py)
    return dtensor.from_local(y, mesh, out, shape=out_shape)
