"""A small GPT (decoder-only transformer), laid out like GPT-2 / nanoGPT.

    x = wte[idx] + wpe[0..T)                                  (B, T, C)
    for each block:  x = x + attn(ln_1(x));  x = x + mlp(ln_2(x))
                     (mlp: an MoE in every moe_every-th block; its aux losses join the loss)
    logits = ln_f(x) W_head^T                                 (B, T, vocab)
    loss = cross_entropy(logits, targets)

Parameter names match nanoGPT's (``transformer.h.0.attn.c_attn.weight`` is
``blocks.0.attn.c_attn.weight`` here), so a PyTorch copy of the same model can
be loaded weight for weight.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from minidist import backend
from minidist.autograd.selective_checkpoint import policy_of
from minidist.autograd.tensor import Tensor
from minidist.backend import xp
from minidist.nn import functional as F
from minidist.nn.attention import CausalSelfAttention
from minidist.nn.decoder import DecoderDims
from minidist.nn.generate import generate
from minidist.nn.layers import MLP, Dropout, Embedding, LayerNorm, Linear
from minidist.nn.module import Module, ModuleList
from minidist.nn.moe import MoE, layer_loss, routing_mlp, run_block
from minidist.nn.ties import tie


@dataclass
class GPTConfig:
    block_size: int = 64        # longest context the model sees (positions)
    vocab_size: int = 65        # e.g. the characters of a small corpus
    n_layer: int = 2            # transformer blocks
    n_head: int = 4             # attention heads per block
    n_embd: int = 64            # model width C; head size is C / n_head
    dropout: float = 0.0        # on attention weights, residual branches, embeddings
    bias: bool = True           # biases in Linear and LayerNorm, as GPT-2
    tie_weights: bool = True    # lm_head shares wte's matrix, as GPT-2
    checkpoint: bool | str = False   # recompute each block in backward (less memory);
                                     # "selective": keep matmuls and attention
    dtype: str = "float32"      # parameter and activation dtype
    seed: int = 0               # weight init seed (same weights on every backend)
    attention: str = "naive"    # "naive" (full T x T scores) | "flash" (tiled, minidist.attention)
    # mixture of experts (nn/moe.py, docs/moe.md): every moe_every-th block's MLP is an MoE
    moe_every: int = 0          # 0: no MoE; 1: every block; 2: blocks 2, 4, ...
    n_expert: int = 4           # experts per MoE block
    moe_top_k: int = 2          # experts per token (1: Switch, 2: GShard / Mixtral)
    capacity_factor: float = 0.0  # 0: no capacity; else C = ceil(cf * tokens * k / E)
    moe_groups: int = 1         # capacity groups (one per rank when expert-parallel)
    moe_aux_coef: float = 0.01  # Switch load-balancing loss weight alpha
    moe_z_coef: float = 0.0     # router z-loss weight beta
    moe_bias_rate: float = 0.0  # DeepSeek-V3 bias step gamma (0: off); see GPT.update_moe_bias
    moe_balance: str = "global_batch"  # f_i over every rank's tokens (one process's), or
                                       # "micro_batch": this rank's (Megatron, transformers)

    def __post_init__(self):
        """Refuse a shape no model can have, when the config is made (not deep in GPT())."""
        for name in ("block_size", "vocab_size", "n_head", "n_embd"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.n_layer < 0:
            raise ValueError(f"n_layer must be at least 0, got {self.n_layer}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.checkpoint is not False:
            policy_of(self.checkpoint)       # refuses anything but True, "full", "selective"

    def dims(self) -> DecoderDims:
        """The sizes the strategies read (nn/decoder.py), the Llama's the same way."""
        return DecoderDims(width=self.n_embd, layers=self.n_layer, heads=self.n_head,
                           positions=self.block_size, tied=self.tie_weights)


class Block(Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: GPTConfig, generator: Any = None, moe: bool = False):
        super().__init__()
        std = 0.02
        proj_std = 0.02 / math.sqrt(2 * cfg.n_layer)  # GPT-2: scale residual projections
        self.ln_1 = LayerNorm(cfg.n_embd, bias=cfg.bias, dtype=cfg.dtype)
        self.attn = CausalSelfAttention(cfg.n_embd, cfg.n_head, cfg.dropout, cfg.bias,
                                        cfg.dtype, std, proj_std, generator, cfg.attention)
        self.ln_2 = LayerNorm(cfg.n_embd, bias=cfg.bias, dtype=cfg.dtype)
        if moe:
            self.mlp = MoE(cfg.n_embd, cfg.n_expert, cfg.moe_top_k, 4 * cfg.n_embd,
                           cfg.capacity_factor, cfg.moe_groups, True, cfg.moe_aux_coef,
                           cfg.moe_z_coef, cfg.moe_bias_rate, cfg.bias, cfg.dtype, std,
                           proj_std, generator, balance=cfg.moe_balance)
        else:
            self.mlp = MLP(cfg.n_embd, 4 * cfg.n_embd, cfg.dropout, cfg.bias, cfg.dtype,
                           std, proj_std, generator)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(Module):
    pooled_balance_coef = 0.0   # no loss pooled over the layers: each MoE block adds its own

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.config = cfg
        gen = backend.Generator(cfg.seed)
        self.wte = Embedding(cfg.vocab_size, cfg.n_embd, cfg.dtype, std=0.02, generator=gen)
        self.wpe = Embedding(cfg.block_size, cfg.n_embd, cfg.dtype, std=0.02, generator=gen)
        self.drop = Dropout(cfg.dropout)
        every = cfg.moe_every
        self.blocks = ModuleList([Block(cfg, gen, moe=every > 0 and (i + 1) % every == 0)
                                  for i in range(cfg.n_layer)])
        self.ln_f = LayerNorm(cfg.n_embd, bias=cfg.bias, dtype=cfg.dtype)
        self.lm_head = Linear(cfg.n_embd, cfg.vocab_size, bias=False, dtype=cfg.dtype,
                              std=0.02, generator=gen)
        if cfg.tie_weights:
            tie(self, "lm_head.weight", "wte.weight")

    def embed(self, idx: Any) -> Tensor:
        """Token + position embeddings: (B, T) ids -> (B, T, C)."""
        T = idx.shape[1]
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size "
                             f"{self.config.block_size}")
        pos = xp.arange(T)
        return self.drop(self.wte(idx) + self.wpe(pos))                # (B, T, C)

    def head(self, x: Tensor, targets: Any = None) -> tuple[Tensor, Tensor | None]:
        """ln_f, the logits (B, T, vocab), and the cross-entropy if targets are given."""
        logits = self.lm_head(self.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits, targets)
        return logits, loss

    def stage_ends(self) -> tuple[dict, dict]:
        """The modules a pipeline's first piece holds (embeddings) and its last (head)."""
        return {"wte": self.wte, "wpe": self.wpe}, {"ln_f": self.ln_f, "lm_head": self.lm_head}

    def forward(self, idx: Any, targets: Any = None) -> tuple[Tensor, Tensor | None]:
        """idx: integer (B, T) -> logits (B, T, vocab), and the loss if targets given."""
        idx = idx.data if isinstance(idx, Tensor) else idx
        x = self.embed(idx)                                           # (B, T, C)
        recompute = self.config.checkpoint if self.training else False   # or "selective"
        aux_losses = []                  # each MoE block's router loss, with its graph
        for block in self.blocks:
            x, aux = run_block(block, routing_mlp(block), x, layer_loss, recompute)
            if aux is not None:
                aux_losses.append(aux)
        logits, loss = self.head(x, targets)                          # (B, T, vocab)
        if loss is not None:
            for aux in aux_losses:       # the balancing losses join the objective
                loss = loss + aux
        return logits, loss

    def moe_layers(self) -> list:
        """The MoE modules of the blocks (those that route: ``aux_loss`` and ``last``)."""
        return [m for b in self.blocks if (m := routing_mlp(b)) is not None]

    def update_moe_bias(self) -> None:
        """DeepSeek-V3 balancing: call after each optimizer step (no-op when off)."""
        for moe in self.moe_layers():
            moe.update_bias()

    def generate(self, idx: Any, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, seed: int = 0, do_sample: bool = True) -> Any:
        """Sample ``max_new_tokens`` tokens after ``idx`` (B, T); returns (B, T + new)."""
        return generate(self, idx, max_new_tokens, self.config.block_size, temperature,
                        top_k, seed, do_sample)
