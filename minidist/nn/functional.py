"""The layer functions of ``nn``, named as in ``torch.nn.functional``.

Each is one autograd op (see ``minidist/autograd/ops``), so forward and
backward are fused where that saves memory and time (linear, layer norm,
softmax, cross-entropy).
"""
from __future__ import annotations

import math
import operator
from typing import Any

from minidist.autograd import ops
from minidist.autograd.tensor import Tensor, array_of
from minidist.backend import xp
from minidist.precision.autocast import autocast_matmul


def _tensor_like(*args: Any) -> Any:
    """torch's ``__torch_function__`` protocol: the class of the first argument that defines
    it (a DTensor), which then computes the function by its own rules; else None."""
    for a in args:
        if hasattr(type(a), "__torch_function__"):
            return type(a)
    return None


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """y = x W^T + b; W: (out, in). Under ``precision.autocast``, in its low format."""
    return autocast_matmul(_linear, x, weight, bias)


def _linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    if bias is None:
        return ops.Linear.apply(x, weight)
    return ops.Linear.apply(x, weight, bias)


def embedding(ids: Any, weight: Tensor) -> Tensor:
    """Rows of ``weight`` picked by integer ``ids``: (*ids.shape, dim)."""
    if cls := _tensor_like(weight, ids):
        return cls.__torch_function__(embedding, (), (ids, weight))
    return ops.Embedding.apply(array_of(ids), weight)


def layer_norm(x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> Tensor:
    if cls := _tensor_like(x):
        return cls.__torch_function__(layer_norm, (), (x, weight, bias, eps))
    return ops.LayerNorm.apply(x, weight, bias, eps=eps)


def rms_norm(x: Tensor, normalized_shape: Any, weight: Tensor | None = None,
             eps: float | None = None) -> Tensor:
    """x / sqrt(mean(x^2) + eps) * w over the last axis (torch's ``F.rms_norm``; eps None:
    the dtype's machine epsilon, as PyTorch). Only the last axis is normalised here."""
    if cls := _tensor_like(x):
        return cls.__torch_function__(rms_norm, (), (x, normalized_shape, weight, eps))
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if len(shape) != 1 or shape[0] != x.shape[-1]:
        raise ValueError(f"rms_norm normalises the last axis only: normalized_shape must be "
                         f"({x.shape[-1]},), got {shape}")
    if eps is None:
        eps = float(xp.finfo(x.dtype).eps)
    if weight is None:
        return ops.RMSNorm.apply(x, eps=eps)
    return ops.RMSNorm.apply(x, weight, eps=eps)


def silu(x: Tensor) -> Tensor:
    """SiLU (swish): x * sigmoid(x)."""
    return ops.Silu.apply(x)


def gelu(x: Tensor) -> Tensor:
    """GELU, tanh approximation (GPT-2's; ``F.gelu(x, approximate='tanh')``)."""
    return ops.Gelu.apply(x)


def relu(x: Tensor) -> Tensor:
    return ops.Relu.apply(x)


def softmax(x: Tensor, axis: int = -1) -> Tensor:
    if cls := _tensor_like(x):
        return cls.__torch_function__(softmax, (), (x, axis))
    return ops.Softmax.apply(x, axis=axis)


def log_softmax(x: Tensor, axis: int = -1) -> Tensor:
    if cls := _tensor_like(x):
        return cls.__torch_function__(log_softmax, (), (x, axis))
    return ops.LogSoftmax.apply(x, axis=axis)


def cross_entropy(logits: Tensor, targets: Any, ignore_index: int = -100,
                  reduction: str = "mean") -> Tensor:
    """Mean of -log softmax(logits)[target] over targets != ignore_index."""
    if cls := _tensor_like(logits):
        return cls.__torch_function__(cross_entropy, (), (logits, targets, ignore_index,
                                                           reduction))
    return ops.CrossEntropy.apply(logits, array_of(targets), ignore_index=ignore_index,
                                  reduction=reduction)


def dropout(x: Tensor, p: float = 0.5, training: bool = True, generator: Any = None) -> Tensor:
    """Inverted dropout; the identity when not training or p == 0."""
    if not training or p == 0.0:
        return x
    return ops.Dropout.apply(x, p=p, generator=generator)


def causal_mask(t_q: int, t_k: int) -> Any:
    """Boolean (t_q, t_k) mask, True above the diagonal: the future, not attended."""
    return xp.triu(xp.ones((t_q, t_k), dtype=bool), k=1)


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False,
                                 dropout_p: float = 0.0, generator: Any = None) -> Tensor:
    """softmax(Q K^T / sqrt(d) [+ causal mask]) V, written out op by op.

    q, k, v: (B, nh, T, hs). This is the textbook version that materialises the
    (T, T) score matrix; ``minidist.attention`` holds the tiled one. Under
    ``precision.autocast`` the two products run in its low format, softmax in float32.
    """
    scale = 1.0 / math.sqrt(q.shape[-1])
    att = autocast_matmul(operator.matmul, q, k.transpose(-2, -1)) * scale  # (B, nh, Tq, Tk)
    if is_causal:
        att = att.masked_fill(causal_mask(q.shape[-2], k.shape[-2]), -math.inf)
    att = softmax(att, axis=-1)
    att = dropout(att, dropout_p, training=dropout_p > 0, generator=generator)
    return autocast_matmul(operator.matmul, att, v)          # (B, nh, Tq, hs)
