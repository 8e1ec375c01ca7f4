"""Tensor-parallel plans for minidist's GPT and Llama, written as torchtitan writes Llama's.

    parallelize_module(gpt, mesh["tp"], gpt_tp_plan(gpt.config, tp=mesh["tp"].size()))

A plan is a dict from module names to styles; these two cover the whole model:

    GPT                               Llama
    wte        RowwiseParallel        model.embed_tokens          RowwiseParallel
                                      self_attn, mlp              PrepareModuleInput
                                                                  (their input, once)
    attn.c_attn  FusedColwiseParallel  self_attn.q/k/v_proj         ColwiseParallel
    attn.c_proj  RowwiseParallel       self_attn.o_proj             RowwiseParallel
    mlp.c_fc     ColwiseParallel       mlp.gate_proj, mlp.up_proj   ColwiseParallel
    mlp.c_proj   RowwiseParallel       mlp.down_proj                RowwiseParallel
    lm_head    ColwiseParallel        lm_head                     ColwiseParallel
               (output Replicate: the model's own cross-entropy sees whole logits;
               ``vocab_parallel_loss=True``: a [Shard(2)] DTensor for loss_parallel(),
               torchtitan's way, which never gathers the B x T x V logits)

Each rank keeps n_head / t heads (Llama: n_kv_head / t key/value heads too); the
attention modules read that count off their projections' outputs. Per block and
direction: 2 all-reduces of (B, T, C), Megatron's f and g for attention and MLP.

With ``sequence_parallel=True`` the residual stream is cut by position, Shard(1),
from the embeddings to the head: the norms run under SequenceParallel, every
column layer all-gathers its input (Shard(1) -> Replicate) and every row layer
reduce-scatters its output (Partial -> Shard(1)); the embeddings' lookups are
reduce-scattered too (GPT's position table by Shard(0) of its (T, C) lookup).
Per block and direction then 2 all-gathers and 2 reduce-scatters, plus, backward,
one all-reduce per parameter used on T/t positions (norms, row-layer biases).

The functions check what a cut needs (heads, vocabulary, positions divisible by t)
and say which number to change.
"""
from __future__ import annotations

from typing import Any

from minidist.distributed.tensor.parallel.style import (ColwiseParallel, FusedColwiseParallel,
                                                        PrepareModuleInput, RowwiseParallel,
                                                        SequenceParallel)
from minidist.distributed.tensor.placement_types import Replicate, Shard


def _divisible(what: dict, tp: int) -> None:
    for name, n in what.items():
        if n % tp:
            raise ValueError(f"{name}={n} is not divisible by the tensor-parallel size {tp}: "
                             f"choose a size that divides it")


def _head(seq: Any, vocab_parallel_loss: bool) -> ColwiseParallel:
    """lm_head: whole logits for the model's own cross-entropy (an all-gather of B T V),
    or, for ``loss_parallel()``, the vocabulary-sharded DTensor (3 all-reduces of B T)."""
    if vocab_parallel_loss:
        return ColwiseParallel(input_layouts=seq, use_local_output=False)
    return ColwiseParallel(input_layouts=seq, output_layouts=Replicate())


def gpt_tp_plan(config: Any, tp: int, sequence_parallel: bool = False,
                vocab_parallel_loss: bool = False) -> dict:
    """The plan for ``nn.GPT(config)`` over ``tp`` ranks (module docstring). With
    ``vocab_parallel_loss`` the model returns its logits as a [Shard(2)] DTensor, and its
    forward must run inside ``loss_parallel()``."""
    _divisible({"n_head": config.n_head, "vocab_size": config.vocab_size}, tp)
    if config.moe_every:
        raise ValueError("gpt_tp_plan splits dense MLPs; an MoE block's experts go over an "
                         "expert-parallel group (minidist.parallel.expert)")
    sp = sequence_parallel
    if sp:
        _divisible({"block_size (positions, under sequence_parallel)": config.block_size}, tp)
    seq = Shard(1) if sp else Replicate()             # the residual stream's layout
    plan = {
        "wte": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq),
        "blocks.*.attn.c_attn": FusedColwiseParallel(3, input_layouts=seq),
        "blocks.*.attn.c_proj": RowwiseParallel(output_layouts=seq),
        "blocks.*.mlp.c_fc": ColwiseParallel(input_layouts=seq),
        "blocks.*.mlp.c_proj": RowwiseParallel(output_layouts=seq),
        "lm_head": _head(seq, vocab_parallel_loss),
    }
    if sp:   # the (T, C) position lookup cut by position; norms on this rank's positions
        plan["wpe"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(0))
        for norm in ("blocks.*.ln_1", "blocks.*.ln_2", "ln_f"):
            plan[norm] = SequenceParallel()
    return plan


def llama_tp_plan(config: Any, tp: int, sequence_parallel: bool = False,
                  vocab_parallel_loss: bool = False) -> dict:
    """The plan for ``nn.Llama(config)`` over ``tp`` ranks (module docstring); grouped
    query attention splits its key/value heads too, so t must divide n_kv_head.
    ``vocab_parallel_loss`` as for the GPT."""
    _divisible({"num_attention_heads": config.num_attention_heads,
                "num_key_value_heads": config.num_key_value_heads,
                "vocab_size": config.vocab_size,
                "intermediate_size": config.intermediate_size}, tp)
    if config.num_local_experts:
        raise ValueError("llama_tp_plan splits dense MLPs; an MoE layer's experts go over an "
                         "expert-parallel group (minidist.parallel.expert)")
    sp = sequence_parallel
    seq = Shard(1) if sp else Replicate()
    layer = "model.layers.*."
    plan = {"model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq)}
    for module in ("self_attn", "mlp"):   # gather the input once; the projections share it
        plan[layer + module] = PrepareModuleInput(input_layouts=(seq,),
                                                  desired_input_layouts=(Replicate(),),
                                                  use_local_output=False)
    for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                 "mlp.gate_proj", "mlp.up_proj"):
        plan[layer + name] = ColwiseParallel()
    for name in ("self_attn.o_proj", "mlp.down_proj"):
        plan[layer + name] = RowwiseParallel(output_layouts=seq)
    plan["lm_head"] = _head(seq, vocab_parallel_loss)
    if sp:
        for norm in ("input_layernorm", "post_attention_layernorm"):
            plan[layer + norm] = SequenceParallel()
        plan["model.norm"] = SequenceParallel()
    return plan
