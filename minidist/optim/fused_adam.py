"""Adam / AdamW's whole update in one GPU kernel (CuPy), bit for bit the chain's.

On a GPU each array operation is a kernel launch of its own, some 10-20 us of
host time, and adam.py's chain is fourteen of them per parameter: a GPT step
on CuPy spent more time launching its optimizer's kernels than running them.
This file writes the same chain as one ``cupy.ElementwiseKernel``: every
element's update, in adam.py's order of operations, in one launch per parameter.

Bit for bit: each line below is one of the chain's operations, rounded to the
parameter's dtype as the chain's own kernel would round it; the constants are
the chain's Python floats cast to that dtype, as NumPy and CuPy cast a scalar
operand; ``--fmad=false`` keeps the compiler from contracting ``a * b + c``
into one fused multiply-add (one rounding instead of two). The chain stays the
oracle (tests/optim/test_fused_adam.py runs both on a GPU) and runs everywhere
else: NumPy, the guard backend, AMSGrad, and any array that is not contiguous.
"""
from __future__ import annotations

from typing import Any

from minidist import backend

ENABLED = True          # bench/bench_gpu.py times the chain too, with this off
_KERNEL: dict = {}


def applies(*arrays: Any) -> bool:
    """Whether the fused kernel runs for these arrays: CuPy, float32 / float64 alike,
    each C-contiguous."""
    return (ENABLED and backend.get_backend() == "cupy"
            and len({str(a.dtype) for a in arrays}) == 1
            and str(arrays[0].dtype) in ("float32", "float64")
            and all(a.flags.c_contiguous for a in arrays))


def adam_step(param: Any, grad: Any, exp_avg: Any, exp_avg_sq: Any, step: int, *, lr: float,
              beta1: float, beta2: float, eps: float, weight_decay: float,
              decoupled: bool) -> None:
    """One Adam (``decoupled=False``: L2 decay) or AdamW step, in place, in one launch."""
    c = param.dtype.type
    bias_correction1 = 1 - beta1 ** step
    bias_correction2 = 1 - beta2 ** step
    _kernel()(grad, c(weight_decay), c(1 - lr * weight_decay), c(beta1), c(1 - beta1), c(beta2),
              c(1 - beta2), c(bias_correction2 ** 0.5), c(eps), c(bias_correction1), c(lr),
              weight_decay != 0, decoupled, param, exp_avg, exp_avg_sq)


def _kernel() -> Any:
    if "adam" not in _KERNEL:
        cupy = backend.array_module()                  # applies() has checked it is CuPy
        _KERNEL["adam"] = cupy.ElementwiseKernel(
            "T grad, T wd, T decay, T beta1, T one_minus_beta1, T beta2, T one_minus_beta2, "
            "T sqrt_bc2, T eps, T bc1, T lr, bool has_decay, bool decoupled",
            "T param, T exp_avg, T exp_avg_sq",
            """
            T g = grad;
            if (has_decay && decoupled) param = param * decay;    // w <- (1 - lr wd) w
            if (has_decay && !decoupled) { T d = wd * param; g = g + d; }   // g + wd w
            exp_avg = exp_avg * beta1;                            // m_t = b1 m + (1 - b1) g
            T t = g * one_minus_beta1;
            exp_avg = exp_avg + t;
            exp_avg_sq = exp_avg_sq * beta2;                      // v_t = b2 v + (1 - b2) g^2
            t = g * g;
            t = t * one_minus_beta2;
            exp_avg_sq = exp_avg_sq + t;
            t = sqrt(exp_avg_sq);                                 // sqrt(v) / sqrt(bc2) + eps
            t = t / sqrt_bc2;
            t = t + eps;
            t = exp_avg / t;                                      // m / (...) / bc1
            t = t / bc1;
            t = t * lr;
            param = param - t;
            """,
            "minidist_adam_step", options=("--fmad=false",))
    return _KERNEL["adam"]
