"""softmax, log_softmax, layer_norm and rms_norm: ops that normalise along one dim.

Each output element depends on the whole row along the normalised dim, so that dim
must be whole on every rank; every other dim may stay cut. Per mesh dimension:

    x's placement                      out        x needs      weight, bias   dweight, dbias
    Shard(d), d not normalised         Shard(d)   Shard(d)     Replicate      Partial
    Shard(d), d normalised             Replicate  Replicate    Replicate      Replicate
    Partial                            Replicate  Replicate    Replicate      Replicate
    Replicate                          Replicate  Replicate    Replicate      Replicate

(a Shard of the normalised dim, or a Partial, is redistributed to Replicate first,
as torch does). The weight and bias are applied on every row: with x cut by rows,
each rank's weight gradient sums its rows only, a Partial summand that the
weight's redistribute backward all-reduces. softmax and log_softmax have no
weights; layer_norm and rms_norm normalise the last dim (minidist's ops).
"""
from __future__ import annotations

from typing import Any

from minidist.distributed.tensor._ops._common import P, R, Rule, check_dtensors, run_rule
from minidist.distributed.tensor.placement_types import Placement, Shard
from minidist.nn import functional as F


def _rules(x: Any, dim: int, n_weights: int) -> list:
    """Per mesh dim: (x and weights needed, their grads, output) (module docstring)."""
    def rule(p: Placement):
        if isinstance(p, Shard) and p.dim != dim:
            return Rule((p,) + (R,) * n_weights, (p,) + (P,) * n_weights, p)
        return Rule((R,) * (1 + n_weights), (R,) * (1 + n_weights), R)
    return [rule(p) for p in x.placements]


def _dim(x: Any, dim: int, op: str) -> int:
    if not -x.ndim <= dim < x.ndim:
        raise ValueError(f"{op}: dim {dim} is out of range for a DTensor of {x.ndim} "
                         "dimensions")
    return dim % x.ndim


def softmax(x: Any, dim: int = -1) -> Any:
    """exp(x_i - max) / sum_j exp(x_j - max) along ``dim`` (table above)."""
    d = _dim(x, dim, "softmax")
    return run_rule("softmax", lambda t: F.softmax(t, axis=d), [x], _rules(x, d, 0), x.shape)


def log_softmax(x: Any, dim: int = -1) -> Any:
    """x_i - max - log sum_j exp(x_j - max) along ``dim`` (table above)."""
    d = _dim(x, dim, "log_softmax")
    return run_rule("log_softmax", lambda t: F.log_softmax(t, axis=d), [x], _rules(x, d, 0),
                    x.shape)


def layer_norm(x: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5) -> Any:
    """(x - mean) / sqrt(var + eps) * weight + bias over the last dim (table above)."""
    params = [p for p in (weight, bias) if p is not None]
    check_dtensors("layer_norm", x, *params)
    if x.ndim == 0:
        raise ValueError("layer_norm: a 0-d DTensor has no last dim to normalise")

    def fn(t: Any, *ws: Any) -> Any:
        it = iter(ws)
        return F.layer_norm(t, next(it) if weight is not None else None,
                            next(it) if bias is not None else None, eps)
    return run_rule("layer_norm", fn, [x] + params, _rules(x, x.ndim - 1, len(params)),
                    x.shape)


def rms_norm(x: Any, normalized_shape: Any, weight: Any = None, eps: float | None = None) -> Any:
    """x / sqrt(mean(x^2) + eps) * weight over the last dim (table above)."""
    params = [weight] if weight is not None else []
    check_dtensors("rms_norm", x, *params)
    if x.ndim == 0:
        raise ValueError("rms_norm: a 0-d DTensor has no last dim to normalise")

    def fn(t: Any, *ws: Any) -> Any:
        return F.rms_norm(t, normalized_shape, ws[0] if ws else None, eps)
    return run_rule("rms_norm", fn, [x] + params, _rules(x, x.ndim - 1, len(params)), x.shape)
