"""The Llama of minidist.nn, tensor-parallel: the same model with its matrices split.

    embed_tokens                      vocab-parallel (one all-reduce, or reduce-scatter)
    per layer:
        q_proj, k_proj, v_proj        column-parallel by heads: nh/t query heads and
                                      nkv/t key/value heads per rank
        o_proj                        row-parallel (g: one all-reduce)
        gate_proj, up_proj            column-parallel (H/t each)
        down_proj                     row-parallel (g)
    lm_head                           column-parallel by vocabulary; vocab-parallel loss

Grouped-query heads split cleanly because query head h reads key/value head h // g
(g = nh / nkv): rank r's query heads [r nh/t, (r+1) nh/t) read exactly its key/value
heads [r nkv/t, (r+1) nkv/t). So nkv must be divisible by t; a Llama-3-8B (nkv = 8)
goes to TP 8 at most, unless K/V heads are replicated (not done here).

``TensorParallelLlama`` is a ``Llama``: it builds the dense model from the same seed
and swaps each linear layer for its parallel twin holding this rank's shard, so
``forward``, ``embed`` and ``blocks`` are the Llama's own; ``head`` differs (the loss
over vocabulary-split logits), and so does ``generate``, which all-gathers each step's
logit columns so that every rank picks from the whole vocabulary (an argmax over its
own V/t columns would return a local index of the wrong token). With ``sequence_parallel``
the residual stream and the RMSNorms hold T/t positions per rank; attention still
sees all T positions (the column layers all-gather them), so RoPE's positions are
the global ones without further care. An MoE layer (``num_local_experts``) is not
cut: every rank of the group routes the same (whole) tokens through the whole MoE and
gets the same gradients, so its experts can go over an expert-parallel group of other
ranks instead (parallel/compose/parallelize.py); this needs every position on every rank, so
not with ``sequence_parallel``. ``async_tp`` (with ``sequence_parallel``) fuses
each column layer's gather and each row layer's reduce-scatter with its matmul
(async_tp.py); q, k and v then each gather the positions on their own ring.
"""
from __future__ import annotations

from functools import partial
from typing import Any

import minidist.distributed as dist
from minidist.autograd.tensor import Tensor
from minidist.nn import functional as F
from minidist.nn.layers import RMSNorm
from minidist.nn.generate import generate
from minidist.nn.llama import Llama, LlamaConfig
from minidist.nn.moe import routes_tokens
from minidist.parallel.tensor.layers import (ColumnParallelLinear, RowParallelLinear,
                                             check_async_tp, shard_state_dict)
from minidist.parallel.tensor.mappings import copy_to_tp, gather_from_tp
from minidist.parallel.tensor.vocab import VocabParallelEmbedding, vocab_parallel_cross_entropy


class SequenceParallelRMSNorm(RMSNorm):
    """RMSNorm on this rank's positions; its weight goes through f, so the gradient
    (partial: T/t positions each) is summed over the group."""

    def __init__(self, dim: int, eps: float = 1e-6, dtype: str = "float32", group: Any = None):
        super().__init__(dim, eps, dtype)
        self.group = group

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, x.shape[-1], copy_to_tp(self.weight, self.group), self.eps)


def check_tensor_parallel(cfg: LlamaConfig, t: int) -> None:
    """Refuse a split that does not divide: heads, key/value heads, the MLP, the vocabulary."""
    for name, n in (("num_attention_heads", cfg.num_attention_heads),
                    ("num_key_value_heads", cfg.num_key_value_heads),
                    ("intermediate_size", cfg.intermediate_size),
                    ("vocab_size", cfg.vocab_size)):
        if n % t:
            extra = (" (each rank holds whole key/value heads; a GQA model splits at most "
                     "num_key_value_heads ways)" if name == "num_key_value_heads" else "")
            raise ValueError(f"{name}={n} is not divisible by the tensor-parallel size "
                             f"{t}{extra}")


def check_sequence_parallel(cfg: LlamaConfig, t: int) -> None:
    """Refuse what sequence parallelism cannot cut: positions, an MoE layer."""
    if cfg.num_local_experts:
        raise ValueError("a Llama with MoE layers keeps each MoE whole on every rank of the "
                         "tensor-parallel group (its experts go over an expert-parallel "
                         "group, minidist.parallel.expert), which needs every position "
                         "there: train it without sequence_parallel")
    if cfg.max_position_embeddings % t:
        raise ValueError(f"sequence parallelism splits positions: max_position_embeddings="
                         f"{cfg.max_position_embeddings} is not divisible by the "
                         f"tensor-parallel size {t}")


class TensorParallelLlama(Llama):
    """Llama(cfg) split over the tensor-parallel ``group`` (see the module docstring).

    ``forward(idx, targets)`` returns (logits of this rank's V/t columns, loss)."""

    def __init__(self, cfg: LlamaConfig, group: Any = None, sequence_parallel: bool = False,
                 async_tp: bool = False):
        t = dist.get_world_size(group)
        check_tensor_parallel(cfg, t)
        check_async_tp(async_tp, sequence_parallel)
        if sequence_parallel:
            check_sequence_parallel(cfg, t)
        super().__init__(cfg)                         # the dense model: its weights, its seed
        dense = dict(self.state_dict())                # its weights and buffers
        self.group, self.sequence_parallel = group, sequence_parallel
        sp, C, hd = sequence_parallel, cfg.hidden_size, cfg.head_dim
        std, dtype = cfg.initializer_range, cfg.dtype

        def column(n_in: int, n_out: int, bias: bool) -> ColumnParallelLinear:
            return ColumnParallelLinear(n_in, n_out, bias, False, sp, group, dtype, std,
                                        async_tp=async_tp)

        def row(n_in: int, n_out: int, bias: bool) -> RowParallelLinear:
            return RowParallelLinear(n_in, n_out, bias, sp, group, dtype, std, async_tp=async_tp)

        def norm() -> RMSNorm:
            if sp:
                return SequenceParallelRMSNorm(C, cfg.rms_norm_eps, dtype, group)
            return RMSNorm(C, cfg.rms_norm_eps, dtype)

        self.model.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, C, dtype, std,
                                                         group=group, sequence_parallel=sp)
        nh, nkv, H = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size
        for layer in self.model.layers:
            attn, mlp, qkv_bias = layer.self_attn, layer.mlp, cfg.attention_bias
            attn.q_proj = column(C, nh * hd, qkv_bias)           # this rank's query heads
            attn.k_proj = column(C, nkv * hd, qkv_bias)          # ... and their kv heads
            attn.v_proj = column(C, nkv * hd, qkv_bias)
            attn.o_proj = row(nh * hd, C, qkv_bias)
            attn.n_head, attn.n_kv_head = nh // t, nkv // t
            if not routes_tokens(mlp):        # an MoE stays whole (module docstring)
                mlp.gate_proj = column(C, H, cfg.mlp_bias)
                mlp.up_proj = column(C, H, cfg.mlp_bias)
                mlp.down_proj = row(H, C, cfg.mlp_bias)
            layer.input_layernorm, layer.post_attention_layernorm = norm(), norm()
        self.model.norm = norm()
        self.lm_head = column(C, cfg.vocab_size, False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight   # both vocabulary rows
        self.load_state_dict(shard_state_dict(self, dense))

    def generate(self, idx: Any, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, seed: int = 0, do_sample: bool = True,
                 use_cache: bool = True) -> Any:
        """``Llama.generate`` over the whole vocabulary: each step's (B, T, V/t) logit
        columns all-gathered to (B, T, V); every rank returns the same tokens."""
        return generate(self, idx, max_new_tokens, self.config.max_position_embeddings,
                        temperature, top_k, seed, do_sample, use_cache,
                        whole_logits=partial(gather_from_tp, axis=-1, group=self.group))

    def head(self, x: Tensor, targets: Any = None) -> tuple[Tensor, Tensor | None]:
        """Final norm, this rank's logit columns (B, T, V/t), and the vocab-parallel loss."""
        logits = self.lm_head(self.model.norm(x))    # (under SP lm_head all-gathers positions)
        loss = None
        if targets is not None:
            loss = vocab_parallel_cross_entropy(logits, targets, self.group)
        return logits, loss
