"""The basic layers: Linear, Embedding, LayerNorm, RMSNorm, Dropout, GELU, SiLU, MLP, SwiGLU.

Initialisation follows PyTorch's defaults unless a ``std`` is given
(GPT-2 style models pass ``std=0.02``):
    Linear:    W, b ~ U(-1/sqrt(in), 1/sqrt(in))
    Embedding: W ~ N(0, 1)
    LayerNorm: w = 1, b = 0;   RMSNorm: w = 1
Initial weights come from a ``backend.Generator`` (the default one unless
given), so the same seed builds the same model on every backend. Dropout
masks come from the default generator (``minidist.manual_seed``), which is what
activation checkpointing replays in its recompute.
"""
from __future__ import annotations

import math
from typing import Any

from minidist import backend
from minidist.autograd.tensor import Tensor
from minidist.backend import xp
from minidist.nn import functional as F
from minidist.nn.module import Module, Parameter


def _gen(generator: Any) -> backend.Generator:
    return generator if generator is not None else backend.default_generator()


class Linear(Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 dtype: str = "float32", std: float | None = None, generator: Any = None):
        super().__init__()
        gen = _gen(generator)
        if std is None:
            bound = 1.0 / math.sqrt(in_features)
            self.weight = Parameter(gen.uniform((out_features, in_features), -bound, bound, dtype))
            self.bias = Parameter(gen.uniform((out_features,), -bound, bound, dtype)) if bias else None
        else:
            self.weight = Parameter(gen.normal((out_features, in_features), 0.0, std, dtype))
            self.bias = Parameter(xp.zeros((out_features,), dtype)) if bias else None
        self.in_features, self.out_features = in_features, out_features

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)                    # (..., out)


class Embedding(Module):
    def __init__(self, num_embeddings: int, embedding_dim: int, dtype: str = "float32",
                 std: float = 1.0, generator: Any = None):
        super().__init__()
        self.weight = Parameter(_gen(generator).normal((num_embeddings, embedding_dim),
                                                       0.0, std, dtype))

    def forward(self, ids: Any) -> Tensor:
        return F.embedding(ids, self.weight)                          # (*ids.shape, dim)


class LayerNorm(Module):
    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True, dtype: str = "float32"):
        super().__init__()
        self.weight = Parameter(xp.ones((dim,), dtype))
        self.bias = Parameter(xp.zeros((dim,), dtype)) if bias else None
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.weight, self.bias, self.eps)


class RMSNorm(Module):
    """y = x / sqrt(mean(x^2) + eps) * w (Llama's norm; Hugging Face's default eps 1e-6)."""

    def __init__(self, dim: int, eps: float = 1e-6, dtype: str = "float32"):
        super().__init__()
        self.weight = Parameter(xp.ones((dim,), dtype))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, x.shape[-1], self.weight, self.eps)


class Dropout(Module):
    def __init__(self, p: float = 0.5, generator: Any = None):
        super().__init__()
        self.p, self.generator = p, generator

    def forward(self, x: Tensor) -> Tensor:
        return F.dropout(x, self.p, self.training, self.generator)


class GELU(Module):
    def forward(self, x: Tensor) -> Tensor:
        return F.gelu(x)


class SiLU(Module):
    def forward(self, x: Tensor) -> Tensor:
        return F.silu(x)


class MLP(Module):
    """Transformer feed-forward: Linear(C, 4C) -> GELU -> Linear(4C, C) -> Dropout.

    Names (c_fc, c_proj) follow GPT-2, so weights line up with other GPTs.
    """

    def __init__(self, n_embd: int, hidden: int | None = None, dropout: float = 0.0,
                 bias: bool = True, dtype: str = "float32", std: float | None = None,
                 proj_std: float | None = None, generator: Any = None):
        super().__init__()
        hidden = hidden or 4 * n_embd
        self.c_fc = Linear(n_embd, hidden, bias, dtype, std, generator)
        self.c_proj = Linear(hidden, n_embd, bias, dtype, proj_std or std, generator)
        self.dropout = Dropout(dropout)  # masks from the default generator

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))


class SwiGLU(Module):
    """Llama's feed-forward: down(silu(gate(x)) * up(x)), three matrices, no biases.

        gate, up: (C -> H),   down: (H -> C),   H about 8/3 C (docs/llama.md: the same
        parameters as a 4C GELU MLP's two matrices: 3 C H = 2 C 4C gives H = 8C/3)

    Names (gate_proj, up_proj, down_proj) follow Hugging Face's LlamaMLP.
    """

    def __init__(self, n_embd: int, hidden: int, bias: bool = False, dtype: str = "float32",
                 std: float | None = None, generator: Any = None):
        super().__init__()
        self.gate_proj = Linear(n_embd, hidden, bias, dtype, std, generator)
        self.up_proj = Linear(n_embd, hidden, bias, dtype, std, generator)
        self.down_proj = Linear(hidden, n_embd, bias, dtype, std, generator)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
