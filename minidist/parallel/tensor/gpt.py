"""The small GPT of minidist.nn, tensor-parallel: every block split across the group.

    x = wte[idx] + wpe[0..T)        wte vocab-parallel (one all-reduce, or reduce-scatter)
    per block:
        x = x + attn(ln_1(x))       heads split: q,k,v column-parallel, c_proj row-parallel
        x = x + mlp(ln_2(x))        c_fc column-parallel, c_proj row-parallel
    logits_r = ln_f(x) E_r^T        this rank's V/t vocabulary columns (E tied to wte)
    loss = vocab-parallel cross-entropy (no rank ever holds the full logits)

Communication per block and direction: 2 all-reduces (attention, MLP) of
(B, T, C); with ``sequence_parallel`` instead 2 all-gathers and 2
reduce-scatters, and the residual stream, layer norms and dropout are on T/t
positions per rank; with ``async_tp`` as well, each of those is fused with its matmul
(async_tp.py), the transfer of one chunk overlapped with the product of the last.

Parameter names are GPT's (``blocks.0.attn.c_attn.weight``), and the model
starts from the weights of ``GPT(cfg)``: ``shard_state_dict`` slices any dense
array dict (weights, gradients) into this model's shards.
"""
from __future__ import annotations

from functools import partial
from typing import Any

import minidist.distributed as dist
from minidist import backend
from minidist.autograd.tensor import Tensor
from minidist.backend import xp
from minidist.nn.generate import generate
from minidist.nn.gpt import GPT, GPTConfig
from minidist.nn.layers import Dropout, Embedding, LayerNorm
from minidist.nn import functional as F
from minidist.nn.module import Module, ModuleList
from minidist.parallel.tensor.layers import (ColumnParallelLinear, ParallelMLP, ParallelSelfAttention,
                                      SequenceParallelLayerNorm, check_async_tp,
                                      shard_state_dict)
from minidist.parallel.tensor.vocab import VocabParallelEmbedding, vocab_parallel_cross_entropy
from minidist.parallel.tensor.mappings import copy_to_tp, gather_from_tp


def _layer_norm(cfg: GPTConfig, group: Any, sequence_parallel: bool) -> LayerNorm:
    if sequence_parallel:
        return SequenceParallelLayerNorm(cfg.n_embd, bias=cfg.bias, dtype=cfg.dtype, group=group)
    return LayerNorm(cfg.n_embd, bias=cfg.bias, dtype=cfg.dtype)


class ParallelBlock(Module):
    """Pre-norm block: x + attn(ln(x)), then x + mlp(ln(x)); attn and mlp split."""

    def __init__(self, cfg: GPTConfig, group: Any = None, sequence_parallel: bool = False,
                 generator: Any = None, async_tp: bool = False):
        super().__init__()
        sp, gen = sequence_parallel, generator
        self.ln_1 = _layer_norm(cfg, group, sp)
        self.attn = ParallelSelfAttention(cfg.n_embd, cfg.n_head, cfg.dropout, cfg.bias,
                                          cfg.dtype, generator=gen, attention=cfg.attention,
                                          group=group, sequence_parallel=sp, async_tp=async_tp)
        self.ln_2 = _layer_norm(cfg, group, sp)
        self.mlp = ParallelMLP(cfg.n_embd, 4 * cfg.n_embd, cfg.dropout, cfg.bias, cfg.dtype,
                               generator=gen, group=group, sequence_parallel=sp,
                               async_tp=async_tp)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class TensorParallelGPT(Module):
    """GPT(cfg) split over the tensor-parallel ``group`` (see the module docstring).

    ``forward(idx, targets)`` returns (logits of this rank's V/t columns, loss).
    Pipeline stages call its three parts: ``embed``, ``blocks``, ``head``.
    """

    def __init__(self, cfg: GPTConfig, group: Any = None, sequence_parallel: bool = False,
                 async_tp: bool = False):
        super().__init__()
        self.config, self.group, self.sequence_parallel = cfg, group, sequence_parallel
        check_async_tp(async_tp, sequence_parallel)
        if cfg.moe_every:
            raise ValueError("tensor parallelism here splits dense MLPs; a GPT with MoE "
                             f"blocks (moe_every={cfg.moe_every}) is split by expert "
                             "parallelism instead (minidist.parallel.expert_parallel)")
        if sequence_parallel and cfg.block_size % dist.get_world_size(group):
            raise ValueError(f"sequence parallelism splits positions: block_size="
                             f"{cfg.block_size} is not divisible by the tensor-parallel "
                             f"size {dist.get_world_size(group)}")
        sp = sequence_parallel
        # placeholder draws from a private generator (the weights are replaced by the
        # dense model's below; the default generator, which dropout uses, is untouched)
        gen = backend.Generator(cfg.seed)
        self.wte = VocabParallelEmbedding(cfg.vocab_size, cfg.n_embd, cfg.dtype, 0.02,
                                          generator=gen, group=group, sequence_parallel=sp)
        self.wpe = Embedding(cfg.block_size, cfg.n_embd, cfg.dtype, std=0.02, generator=gen)
        self.drop = Dropout(cfg.dropout)
        self.blocks = ModuleList([ParallelBlock(cfg, group, sp, gen, async_tp)
                                  for _ in range(cfg.n_layer)])
        self.ln_f = _layer_norm(cfg, group, sp)
        self.lm_head = ColumnParallelLinear(cfg.n_embd, cfg.vocab_size, bias=False,
                                            sequence_parallel=sp, group=group, dtype=cfg.dtype,
                                            std=0.02, generator=gen, async_tp=async_tp)
        if cfg.tie_weights:
            self.lm_head.weight = self.wte.weight  # both are vocabulary rows [start, stop)
        # start from the dense model's weights (same seed -> same model as GPT(cfg))
        self.load_state_dict(shard_state_dict(self, GPT(cfg).state_dict()))

    def embed(self, idx: Any) -> Tensor:
        """Token + position embeddings: (B, T) ids -> (B, T, C), or (B, T/t, C) under SP."""
        T = idx.shape[1]
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}")
        tok = self.wte(idx)
        pos = xp.arange(T)
        wpe = self.wpe.weight
        if self.sequence_parallel:
            t, r = dist.get_world_size(self.group), dist.get_rank(self.group)
            pos = pos[r * (T // t):(r + 1) * (T // t)]                 # my positions
            wpe = copy_to_tp(wpe, self.group)                          # their grads summed (f)
        return self.drop(tok + F.embedding(pos, wpe))                 # (B, T or T/t, C)

    def stage_ends(self) -> tuple[dict, dict]:
        """The modules a pipeline's first piece holds (embeddings) and its last (head)."""
        return {"wte": self.wte, "wpe": self.wpe}, {"ln_f": self.ln_f, "lm_head": self.lm_head}

    def head(self, x: Tensor, targets: Any = None) -> tuple[Tensor, Tensor | None]:
        """ln_f, this rank's logit columns (B, T, V/t), and the loss if targets are given."""
        logits = self.lm_head(self.ln_f(x))          # (under SP lm_head all-gathers positions)
        loss = None
        if targets is not None:
            loss = vocab_parallel_cross_entropy(logits, targets, self.group)
        return logits, loss

    def generate(self, idx: Any, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, seed: int = 0, do_sample: bool = True) -> Any:
        """``GPT.generate`` over the whole vocabulary: each step's (B, T, V/t) logit
        columns all-gathered to (B, T, V); every rank returns the same tokens."""
        return generate(self, idx, max_new_tokens, self.config.block_size, temperature,
                        top_k, seed, do_sample,
                        whole_logits=partial(gather_from_tp, axis=-1, group=self.group))

    def forward(self, idx: Any, targets: Any = None) -> tuple[Tensor, Tensor | None]:
        idx = idx.data if isinstance(idx, Tensor) else idx
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x, targets)
