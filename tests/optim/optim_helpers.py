"""Helpers shared by the optimizer tests: random problems, and running them.

A "problem" is a list of initial weights and, for every step, one gradient per
weight, all drawn on the host with NumPy. ``run_minidist`` moves them to the
active backend through ``backend.from_host`` and reads the results back with
``backend.to_host``, so the same tests pass under ``MINIDIST_BACKEND=guard``.
``run_torch`` runs the same numbers through a ``torch.optim`` optimizer.

Tolerances, stated once (``assert_allclose``: |ours - torch| <= atol + rtol * |torch|):
- float64: 1e-12. Both sides compute the same formula but may order a few
  operations differently (PyTorch's ``m.lerp_(g, 1 - beta1)`` against our
  ``beta1 * m + (1 - beta1) * g``), which costs a few units of 2^-53 ~ 1e-16
  per step; measured worst over 300 six-step runs: ~1e-15. A real mistake (a
  wrong bias correction, a misplaced decay) is off by 1e-3 or more.
- float32: 2e-6, about 16 units of 2^-23 ~ 1.2e-7 (float32 rounding of a
  weight of size ~1). Measured worst: ~4 units (5e-7) after six SGD-Nesterov
  steps, ~1.5 units for Adam/AdamW.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from minidist import backend
from minidist.autograd import Tensor
from oracles.optional import require

# function_scoped_fixture: the only fixture is the `torch` module, the same for
# every example, so sharing it across examples is what we want.
PROPERTY = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture])

TOLERANCE = {"float64": dict(rtol=1e-12, atol=1e-12),
             "float32": dict(rtol=2e-6, atol=2e-6)}

shape_lists = st.lists(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=6),
                       min_size=1, max_size=3)
seeds = st.integers(min_value=0, max_value=2**32 - 1)
dtypes = st.sampled_from(["float64", "float32"])
steps = st.integers(min_value=1, max_value=6)


def make_problem(shapes: list[tuple], n_steps: int, seed: int,
                 dtype: str = "float64") -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
    """Initial weights and ``n_steps`` rounds of gradients, as host arrays."""
    rng = np.random.default_rng(seed)
    weights = [rng.normal(size=s).astype(dtype) for s in shapes]
    grads = [[rng.normal(size=s).astype(dtype) for s in shapes] for _ in range(n_steps)]
    return weights, grads


def make_params(weights: list[np.ndarray]) -> list[Tensor]:
    """minidist parameters holding copies of ``weights`` on the active backend."""
    return [Tensor(backend.from_host(w.copy()), requires_grad=True) for w in weights]


def set_grads(params: list[Tensor], grads: list[np.ndarray]) -> None:
    for p, g in zip(params, grads):
        p.grad = backend.from_host(g.copy())


def host(params: list[Tensor]) -> list[np.ndarray]:
    """The parameters' values, copied to the host."""
    return [backend.to_host(p.data).copy() for p in params]


def run_minidist(make_opt: Callable[[list[Tensor]], Any], weights: list[np.ndarray],
                 grads: list[list[np.ndarray]]) -> list[np.ndarray]:
    """Step a minidist optimizer once per round of gradients; the final weights."""
    params = make_params(weights)
    opt = make_opt(params)
    for round_ in grads:
        set_grads(params, round_)
        opt.step()
    return host(params)


def run_torch(make_opt: Callable[[list[Any]], Any], weights: list[np.ndarray],
              grads: list[list[np.ndarray]]) -> list[np.ndarray]:
    """The same with a torch.optim optimizer on CPU tensors."""
    torch = require("torch")
    params = [torch.tensor(w.copy(), requires_grad=True) for w in weights]
    opt = make_opt(params)
    for round_ in grads:
        for p, g in zip(params, round_):
            p.grad = torch.tensor(g.copy())
        opt.step()
    return [p.detach().numpy().copy() for p in params]


def assert_weights_close(ours: list[np.ndarray], reference: list[np.ndarray],
                         dtype: str) -> None:
    for a, b in zip(ours, reference):
        assert a.dtype == b.dtype, (a.dtype, b.dtype)
        np.testing.assert_allclose(a, b, **TOLERANCE[dtype])
