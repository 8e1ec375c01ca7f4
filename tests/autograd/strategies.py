"""Hypothesis strategies and small helpers shared by the autograd tests.

Inputs are drawn as NumPy arrays on the host and moved to the active backend
only through ``Tensor(...)`` / ``backend.from_host``; results come back with
``.numpy()`` / ``backend.to_host``. That way the same tests run unchanged under
``MINIDIST_BACKEND=guard``, where an implicit host <-> device conversion raises.

Shapes are small on purpose (dims 1..4, sides 1..5): ``gradcheck`` runs the
function twice per input element.
"""
from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp


# One setting for every property test here: enough examples to meet the
# broadcasting and axis corner cases, few enough to keep the suite fast.
FAST = settings(max_examples=20, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])
FEWER = settings(max_examples=10, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow])

MAX_DIMS = 4
MAX_SIDE = 5

shapes = hnp.array_shapes(min_dims=1, max_dims=MAX_DIMS, min_side=1, max_side=MAX_SIDE)
seeds = st.integers(min_value=0, max_value=2**32 - 1)


@st.composite
def broadcastable_shapes(draw, num_shapes: int = 2, min_dims: int = 0):
    """Shapes that broadcast together: some sides are 1, some shapes have fewer dims.

    Returns ``(input_shapes, result_shape)``.
    """
    drawn = draw(hnp.mutually_broadcastable_shapes(
        num_shapes=num_shapes, min_dims=min_dims, max_dims=MAX_DIMS, max_side=MAX_SIDE))
    return drawn.input_shapes, drawn.result_shape


@st.composite
def axes_for(draw, shape: tuple):
    """A reduction axis argument for ``shape``: None, one (maybe negative) int,
    or a tuple of distinct axes."""
    ndim = len(shape)
    kind = draw(st.sampled_from(["none", "int", "tuple"]))
    if kind == "none":
        return None
    if kind == "int":
        return draw(st.integers(min_value=-ndim, max_value=ndim - 1))
    return tuple(draw(st.lists(st.integers(0, ndim - 1), min_size=1, max_size=ndim,
                               unique=True)))


def reduced_count(shape: tuple, axis) -> int:
    """How many input elements each output element of a reduction gathers."""
    if axis is None:
        axes = range(len(shape))
    elif isinstance(axis, int):
        axes = [axis % len(shape)]
    else:
        axes = axis
    n = 1
    for a in axes:
        n *= shape[a]
    return n


def randn(seed: int, shape: tuple, dtype="float64") -> np.ndarray:
    """Standard normal host array."""
    return np.asarray(np.random.default_rng(seed).standard_normal(shape), dtype=dtype)


def positive(seed: int, shape: tuple, dtype="float64") -> np.ndarray:
    """Host array in [0.5, 2): safe for log, sqrt, division and fractional powers."""
    return np.asarray(np.random.default_rng(seed).uniform(0.5, 2.0, shape), dtype=dtype)


def away_from_zero(seed: int, shape: tuple, dtype="float64") -> np.ndarray:
    """Host array with |x| in [0.2, 2): finite differences never straddle a kink at 0."""
    rng = np.random.default_rng(seed)
    sign = np.where(rng.random(shape) < 0.5, -1.0, 1.0)
    return np.asarray(sign * rng.uniform(0.2, 2.0, shape), dtype=dtype)


def distinct(seed: int, shape: tuple, dtype="float64") -> np.ndarray:
    """Host array of distinct values at least 0.1 apart (no ties for max)."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape, dtype=np.int64))
    values = rng.permutation(n) * 0.1 - 0.05 * n + rng.uniform(0, 0.01, n)
    return values.reshape(shape).astype(dtype)

