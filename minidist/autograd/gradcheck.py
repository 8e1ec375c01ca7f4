"""Check analytic gradients against central differences, in float64.

For a function f of tensors x_k, reduce the output to a scalar with fixed
random weights w, L = sum(f(x) * w), and compare, element by element,

    backward's dL/dx[i]   with   (L(x + eps e_i) - L(x - eps e_i)) / (2 eps)

The central difference has error O(eps^2), so with eps = 1e-6 in float64 the
two agree to about 1e-8 for smooth functions.
"""
from __future__ import annotations

from typing import Callable, Sequence

from minidist import backend
from minidist.autograd.grad_mode import no_grad
from minidist.autograd.tensor import Tensor


class GradcheckError(AssertionError):
    pass


def _scalar(fn: Callable, inputs: Sequence[Tensor], weights) -> float:
    out = fn(*inputs)
    return float((out.data * weights).sum())


def gradcheck(fn: Callable[..., Tensor], inputs: Sequence[Tensor], eps: float = 1e-6,
              atol: float = 1e-6, rtol: float = 1e-4, seed: int = 0) -> bool:
    """True if every input's gradient matches central differences; raises otherwise.

    Inputs that require grad must be float64. ``fn`` must be deterministic.
    """
    checked = [t for t in inputs if isinstance(t, Tensor) and t.requires_grad]
    for t in checked:
        if t.dtype != "float64":
            raise TypeError(f"gradcheck needs float64 inputs, got {t.dtype}")
        t.grad = None

    out = fn(*inputs)
    weights = backend.Generator(seed).normal(out.shape, dtype="float64")
    out.backward(weights)

    with no_grad():
        for k, t in enumerate(checked):
            analytic = backend.to_host(t.grad) if t.grad is not None else 0.0 * backend.to_host(t.data)
            # Own, contiguous data: reshape(-1) of a strided array (a transpose)
            # is a copy, and perturbing a copy would never reach t.
            t.data = t.data.copy()
            flat = t.data.reshape(-1)  # a view: writing it perturbs t
            for i in range(flat.size):
                orig = float(flat[i])
                flat[i] = orig + eps
                plus = _scalar(fn, inputs, weights)
                flat[i] = orig - eps
                minus = _scalar(fn, inputs, weights)
                flat[i] = orig
                numeric = (plus - minus) / (2 * eps)
                a = float(analytic.reshape(-1)[i])
                if abs(a - numeric) > atol + rtol * abs(numeric):
                    raise GradcheckError(
                        f"input {k} element {i}: analytic {a!r} vs numeric {numeric!r} "
                        f"(|diff| {abs(a - numeric):.3e})")
    return True
