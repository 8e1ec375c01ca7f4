"""Llama: the decoder that torchtitan, picotron, nanotron and Megatron-Core train.

    x = embed_tokens[idx]                                            (B, T, C)
    for each layer:  x = x + attn(rms(x))       grouped-query, rotary at positions p
                     x = x + mlp(rms(x))        SwiGLU: down(silu(gate x) * up x), or an
                                                MoE of SwiGLU experts (Mixtral; DeepSeek's
                                                shared experts added)
    logits = norm(x) W_head^T                                        (B, T, vocab)
    loss = cross_entropy(logits, targets)

No biases, no learned positions: RoPE turns q and k by each token's position, so a
packed row passes positions that restart per document (``document_ids`` does that
and masks attention to each document), and a context-parallel shard passes its
tokens' global positions.

The config takes Hugging Face's ``LlamaConfig`` names, and parameter names are
Hugging Face's (``model.layers.0.self_attn.q_proj.weight``), so ``nn/hf.py`` moves a
checkpoint in and out with no renaming: ``Llama.from_pretrained(directory)`` reads
what ``transformers``' ``save_pretrained`` writes, ``save_pretrained`` the reverse.

The strategies meet the model through the interface the GPT has: ``blocks``,
``embed(idx)``, ``head(x, targets)``, ``stage_ends()``, ``config.dims()`` (nn/decoder.py).
Docs: docs/llama.md.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Iterator

from minidist import backend
from minidist.autograd.selective_checkpoint import policy_of
from minidist.autograd.tensor import Tensor
from minidist.backend import xp
from minidist.nn import functional as F
from minidist.nn.attention import GroupedQueryAttention
from minidist.nn.decoder import DecoderDims
from minidist.nn.generate import generate
from minidist.nn.layers import Embedding, Linear, RMSNorm, SwiGLU
from minidist.nn.module import Module, ModuleList
from minidist.nn.moe import MoE, layer_mean_probs, routing_mlp, run_block
from minidist.nn.router import pooled_balance
from minidist.nn.ties import tie


@dataclass
class LlamaConfig:
    vocab_size: int = 65                  # e.g. the characters of a small corpus
    hidden_size: int = 64                 # model width C
    intermediate_size: int = 172          # SwiGLU hidden H, about 8/3 C
    num_hidden_layers: int = 2
    num_attention_heads: int = 4          # query heads nh
    num_key_value_heads: int | None = 2   # key/value heads nkv (None: = nh, multi-head)
    head_dim: int | None = None           # None: C / nh
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0           # Llama 2: 1e4; Llama 3: 5e5
    max_position_embeddings: int = 64     # longest context (generate's window)
    tie_word_embeddings: bool = False     # lm_head shares embed_tokens' matrix
    attention_bias: bool = False          # biases in q/k/v/o (Llama: none)
    mlp_bias: bool = False                # biases in the SwiGLU MLP (Llama: none)
    sliding_window: int | None = None     # keys per row (Mistral's window), None: all
    initializer_range: float = 0.02       # std of the normal initial weights
    # mixture of experts (nn/moe.py): Mixtral's names, DeepSeek's shared experts
    num_local_experts: int = 0            # E routed SwiGLU experts per layer (0: dense MLP)
    num_experts_per_tok: int = 2          # top-k (Mixtral: 2)
    n_shared_experts: int = 0             # DeepSeek: always-on experts, one SwiGLU this wide
    moe_intermediate_size: int | None = None  # an expert's H (None: intermediate_size)
    router_aux_loss_coef: float = 0.0     # alpha of Mixtral's balancing loss, added to the loss
    moe_bias_rate: float = 0.0            # DeepSeek-V3 bias step gamma (0: off), update_moe_bias
    moe_balance: str = "global_batch"     # f_i over every rank's tokens (one process's), or
                                          # "micro_batch": this rank's (transformers, Megatron)
    # minidist's own knobs
    dtype: str = "float32"                # parameter and activation dtype
    seed: int = 0                         # weight init seed (same weights on every backend)
    attention: str = "naive"              # "naive" | "flash" (minidist.attention)
    checkpoint: bool | str = False        # recompute each layer in backward;
                                          # "selective": keep matmuls and attention

    def __post_init__(self):
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None and self.num_attention_heads >= 1:
            self.head_dim = self.hidden_size // self.num_attention_heads
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "max_position_embeddings"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.num_hidden_layers < 0:
            raise ValueError(f"num_hidden_layers must be at least 0, "
                             f"got {self.num_hidden_layers}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_key_value_heads={self.num_key_value_heads} must divide "
                             f"num_attention_heads={self.num_attention_heads}")
        if self.checkpoint is not False:
            policy_of(self.checkpoint)       # refuses anything but True, "full", "selective"
        if self.head_dim % 2:
            raise ValueError(f"rotary embeddings need an even head_dim, got {self.head_dim}")
        if self.num_local_experts and not 1 <= self.num_experts_per_tok <= self.num_local_experts:
            raise ValueError(f"num_experts_per_tok={self.num_experts_per_tok} must be in 1 .. "
                             f"num_local_experts={self.num_local_experts}")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window must be at least 1 or None, "
                             f"got {self.sliding_window}")

    def dims(self) -> DecoderDims:
        """The sizes the strategies read, under the names they share with the GPT's."""
        return DecoderDims(width=self.hidden_size, layers=self.num_hidden_layers,
                           heads=self.num_attention_heads,
                           positions=self.max_position_embeddings,
                           tied=self.tie_word_embeddings)


def _moe(cfg: LlamaConfig, generator: Any) -> MoE:
    """A Mixtral-style MoE of SwiGLU experts (softmax router, top-k renormalised), with
    DeepSeek-style shared experts when ``n_shared_experts`` > 0."""
    h, std = cfg.hidden_size, cfg.initializer_range
    width = cfg.moe_intermediate_size or cfg.intermediate_size

    def expert() -> SwiGLU:
        return SwiGLU(h, width, cfg.mlp_bias, cfg.dtype, std, generator)

    shared = None
    if cfg.n_shared_experts:
        shared = SwiGLU(h, cfg.n_shared_experts * width, cfg.mlp_bias, cfg.dtype, std, generator)
    return MoE(h, cfg.num_local_experts, cfg.num_experts_per_tok, normalize=True,
               aux_coef=0.0, dtype=cfg.dtype, std=std,   # (Llama.forward adds Mixtral's)
               bias_rate=cfg.moe_bias_rate, generator=generator, expert=expert,
               shared=shared, balance=cfg.moe_balance)


class LlamaDecoderLayer(Module):
    """x + attn(input_layernorm(x)), then x + mlp(post_attention_layernorm(x))."""

    def __init__(self, cfg: LlamaConfig, generator: Any = None):
        super().__init__()
        std = cfg.initializer_range
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.dtype)
        self.self_attn = GroupedQueryAttention(
            cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
            cfg.attention_bias, cfg.dtype, std, generator, cfg.attention, cfg.sliding_window,
            cfg.rope_theta)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.dtype)
        if cfg.num_local_experts:
            self.mlp = _moe(cfg, generator)
        else:
            self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias, cfg.dtype,
                              std, generator)

    def forward(self, x: Tensor, position_ids: Any = None, document_ids: Any = None,
                past_key_value: Any = None) -> Tensor:
        """x (B, T, C); position_ids (T,) or (B, T), default 0 .. T-1; past_key_value:
        this layer's key/value cache when decoding (nn/kv_cache.py)."""
        x = x + self.self_attn(self.input_layernorm(x), position_ids, document_ids,
                               past_key_value)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(Module):
    """The stack without the head (Hugging Face's ``LlamaModel``: the ``model.`` prefix)."""

    def __init__(self, cfg: LlamaConfig, generator: Any = None):
        super().__init__()
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size, cfg.dtype,
                                      std=cfg.initializer_range, generator=generator)
        self.layers = ModuleList([LlamaDecoderLayer(cfg, generator)
                                  for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.dtype)


def positions_in_documents(document_ids: Any) -> Any:
    """Positions that restart at 0 where the document id changes: (B, T) -> (B, T).

    ids [[0, 0, 0, 1, 1, 2]] -> [[0, 1, 2, 0, 1, 0]] (each document's tokens contiguous)."""
    ids = document_ids if document_ids.ndim == 2 else document_ids[None, :]
    B, T = ids.shape
    starts = xp.concatenate([xp.ones((B, 1), dtype=bool), ids[:, 1:] != ids[:, :-1]], axis=1)
    count = xp.cumsum(starts, axis=1)                  # document number, nondecreasing
    # the first index of each token's document: where its number first appears
    start_of = xp.stack([xp.searchsorted(count[b], count[b], side="left") for b in range(B)])
    index = xp.arange(T)[None, :]                                       # (1, T)
    return index - start_of


class Llama(Module):
    """``logits, loss = model(idx, targets)`` as the GPT; see the module docstring."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.config = cfg
        gen = backend.Generator(cfg.seed)
        self.model = LlamaModel(cfg, gen)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False, dtype=cfg.dtype,
                              std=cfg.initializer_range, generator=gen)
        if cfg.tie_word_embeddings:
            tie(self, "lm_head.weight", "model.embed_tokens.weight")

    @property
    def blocks(self) -> ModuleList:
        """The decoder layers (the GPT's name, which the strategies use)."""
        return self.model.layers

    @property
    def pooled_balance_coef(self) -> float:
        """alpha of Mixtral's balancing loss, pooled over the MoE layers (nn/moe.py
        ``adds_balancing_loss``): the config's ``router_aux_loss_coef``."""
        return self.config.router_aux_loss_coef

    def embed(self, idx: Any) -> Tensor:
        return self.model.embed_tokens(idx)                            # (B, T, C)

    def head(self, x: Tensor, targets: Any = None) -> tuple[Tensor, Tensor | None]:
        """Final norm, logits (B, T, vocab), and the loss if targets are given."""
        logits = self.lm_head(self.model.norm(x))
        loss = None if targets is None else F.cross_entropy(logits, targets)
        return logits, loss

    def moe_layers(self) -> list:
        """The MoE modules of the layers (those that route: ``aux_loss`` and ``last``)."""
        return [m for layer in self.blocks if (m := routing_mlp(layer)) is not None]

    def update_moe_bias(self) -> None:
        """DeepSeek-V3 balancing: call after each optimizer step (no-op when off)."""
        for moe in self.moe_layers():
            moe.update_bias()

    def stage_ends(self) -> tuple[dict, dict]:
        """The modules a pipeline's first piece holds (embeddings) and its last (head)."""
        return {"embed_tokens": self.model.embed_tokens}, {"norm": self.model.norm,
                                                            "lm_head": self.lm_head}

    def forward(self, idx: Any, targets: Any = None, position_ids: Any = None,
                document_ids: Any = None,
                past_key_values: Any = None) -> tuple[Tensor, Tensor | None]:
        """idx (B, T) -> logits (B, T, vocab), and the loss if targets are given.

        ``document_ids`` (T,) or (B, T): packed documents, each causal within itself,
        positions restarting per document unless ``position_ids`` are given.
        ``past_key_values``: a ``DynamicCache`` (nn/kv_cache.py) holding the earlier
        tokens' keys and values; ``idx`` is then only the new tokens, at positions
        following the cached ones, and the cache gains theirs (inference)."""
        idx = idx.data if isinstance(idx, Tensor) else idx
        if idx.ndim != 2:
            raise ValueError(f"idx must be (B, T) token ids, got shape {tuple(idx.shape)}")
        if position_ids is None and document_ids is not None:
            position_ids = positions_in_documents(document_ids)
        if position_ids is None and past_key_values is not None:
            position_ids = past_key_values.get_seq_length() + xp.arange(idx.shape[1])
        x = self.embed(idx)
        recompute = self.config.checkpoint if self.training else False   # or "selective"
        mean_probs = []   # each MoE layer's mean router probabilities (E,), with their graph
        for i, layer in enumerate(self.blocks):
            if past_key_values is not None:
                x = layer(x, position_ids, document_ids, past_key_value=past_key_values.layer(i))
                continue
            run = partial(layer, position_ids=position_ids, document_ids=document_ids)
            x, probs = run_block(run, routing_mlp(layer), x, layer_mean_probs, recompute)
            if probs is not None:
                mean_probs.append(probs)
        logits, loss = self.head(x, targets)
        if loss is not None and self.config.router_aux_loss_coef and mean_probs:
            # Mixtral's balancing loss, over the tokens of every layer (router.py)
            routings = [moe.last for moe in self.moe_layers()]
            loss = loss + self.config.router_aux_loss_coef * pooled_balance(routings, mean_probs)
        return logits, loss

    def generate(self, idx: Any, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, seed: int = 0, do_sample: bool = True,
                 use_cache: bool = True) -> Any:
        """``max_new_tokens`` tokens after ``idx`` (B, T); ``do_sample=False``: greedy;
        ``use_cache``: keep each layer's keys and values (nn/kv_cache.py), as Hugging
        Face's generate does by default."""
        return generate(self, idx, max_new_tokens, self.config.max_position_embeddings,
                        temperature, top_k, seed, do_sample, use_cache)

    @staticmethod
    def parameter_shapes(cfg: LlamaConfig) -> Iterator[tuple[str, tuple]]:
        """(name, shape) of every parameter ``Llama(cfg)`` has, in ``named_parameters``
        order, without building anything: what ``from_pretrained`` checks a checkpoint's
        headers against before it allocates (a generator: a config claiming a billion
        layers costs nothing until its first tensor is compared)."""
        C, V, nh, nkv, hd = (cfg.hidden_size, cfg.vocab_size, cfg.num_attention_heads,
                             cfg.num_key_value_heads, cfg.head_dim)

        def linear(name: str, n_out: int, n_in: int, bias: bool):
            yield f"{name}.weight", (n_out, n_in)
            if bias:
                yield f"{name}.bias", (n_out,)

        def swiglu(name: str, H: int):
            yield from linear(f"{name}.gate_proj", H, C, cfg.mlp_bias)
            yield from linear(f"{name}.up_proj", H, C, cfg.mlp_bias)
            yield from linear(f"{name}.down_proj", C, H, cfg.mlp_bias)

        yield "model.embed_tokens.weight", (V, C)
        for i in range(cfg.num_hidden_layers):
            layer = f"model.layers.{i}"
            yield f"{layer}.input_layernorm.weight", (C,)
            for proj, n_out in (("q", nh * hd), ("k", nkv * hd), ("v", nkv * hd)):
                yield from linear(f"{layer}.self_attn.{proj}_proj", n_out, C,
                                  cfg.attention_bias)
            yield from linear(f"{layer}.self_attn.o_proj", C, nh * hd, cfg.attention_bias)
            yield f"{layer}.post_attention_layernorm.weight", (C,)
            if not cfg.num_local_experts:
                yield from swiglu(f"{layer}.mlp", cfg.intermediate_size)
                continue
            width = cfg.moe_intermediate_size or cfg.intermediate_size
            yield f"{layer}.mlp.router.weight", (cfg.num_local_experts, C)
            for e in range(cfg.num_local_experts):
                yield from swiglu(f"{layer}.mlp.experts.{e}", width)
            if cfg.n_shared_experts:
                yield from swiglu(f"{layer}.mlp.shared", cfg.n_shared_experts * width)
        yield "model.norm.weight", (C,)
        if not cfg.tie_word_embeddings:
            yield "lm_head.weight", (V, C)

    @classmethod
    def from_pretrained(cls, directory: str, dtype: str | None = None) -> "Llama":
        """A Llama from a Hugging Face checkpoint directory (see ``nn/hf.py``)."""
        from minidist.nn import hf
        return hf.load_llama(cls, directory, dtype, config_class=LlamaConfig)

    def save_pretrained(self, directory: str) -> None:
        """Write ``config.json`` and ``model.safetensors`` that ``transformers`` loads."""
        from minidist.nn import hf
        hf.save_llama(self, directory)
