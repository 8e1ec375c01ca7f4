"""Mixtral checkpoints: Hugging Face's expert tensors renamed to a Llama with MoE layers.

A Mixtral is a Llama whose MLPs are MoEs of SwiGLU experts (``LlamaConfig(
num_local_experts=E, num_experts_per_tok=k)``). Its checkpoints name those tensors in
one of two layouts, and ``Llama.from_pretrained`` reads both:

    per expert (what transformers' save_pretrained writes, and Mistral's release):
        model.layers.L.block_sparse_moe.gate.weight           (E, C)  -> mlp.router.weight
        model.layers.L.block_sparse_moe.experts.i.w1.weight   (H, C)  -> mlp.experts.i.gate_proj
        model.layers.L.block_sparse_moe.experts.i.w3.weight   (H, C)  -> mlp.experts.i.up_proj
        model.layers.L.block_sparse_moe.experts.i.w2.weight   (C, H)  -> mlp.experts.i.down_proj
    fused (transformers' modules since version 5, which it converts on load):
        model.layers.L.mlp.gate.weight                        (E, C)  -> mlp.router.weight
        model.layers.L.mlp.experts.gate_up_proj               (E, 2H, C): gate rows, then up
        model.layers.L.mlp.experts.down_proj                  (E, C, H)

``save_pretrained`` writes the per-expert layout, which every transformers version
loads. A Mixtral has no selection bias (DeepSeek-V3's ``mlp.gate.e_score_correction_bias``,
a model type not read here): each router's persistent buffer ``expert_bias`` stays at
its init, zeros, and is not written. Names that fit neither layout pass through unchanged, so the check that follows
(hf.check_tensors) reports them as unexpected under the checkpoint's own names.

The routing is Mixtral's: softmax over the E router logits, the top k kept and
renormalised to sum to 1 (moe.py, ``normalize=True``). With k = 1 the router here keeps
the Switch gate p where Mixtral's renormalises it to 1, so k = 1 is refused both ways.
"""
from __future__ import annotations

import re
from typing import Any

PER_EXPERT = re.compile(r"^(model\.layers\.\d+)\.block_sparse_moe\.(.+)$")
FUSED = re.compile(r"^(model\.layers\.\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$")
ROUTER = re.compile(r"^(model\.layers\.\d+)\.mlp\.gate\.weight$")
EXPERT_W = re.compile(r"^experts\.(\d+)\.(w1|w2|w3)\.weight$")
W_TO_PROJ = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
PROJ_TO_W = {proj: w for w, proj in W_TO_PROJ.items()}


def from_mixtral_names(tensors: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint's tensors under this Llama's names (either layout; docstring)."""
    out: dict[str, Any] = {}
    for name, value in tensors.items():
        m, f, r = PER_EXPERT.match(name), FUSED.match(name), ROUTER.match(name)
        if m and m.group(2) == "gate.weight":
            out[f"{m.group(1)}.mlp.router.weight"] = value
        elif m and EXPERT_W.match(m.group(2)):
            i, w = EXPERT_W.match(m.group(2)).groups()
            out[f"{m.group(1)}.mlp.experts.{i}.{W_TO_PROJ[w]}.weight"] = value
        elif r:
            out[f"{r.group(1)}.mlp.router.weight"] = value
        elif f and value.ndim == 3 and (f.group(2) == "down_proj" or value.shape[1] % 2 == 0):
            out.update(_unfuse(f.group(1), f.group(2), value))
        else:
            out[name] = value                          # reported as unexpected if not ours
    return out


def _unfuse(layer: str, kind: str, value: Any) -> dict[str, Any]:
    """One fused (E, ...) tensor -> E per-expert matrices under our names."""
    out = {}
    for i in range(value.shape[0]):
        prefix = f"{layer}.mlp.experts.{i}."
        if kind == "down_proj":
            out[prefix + "down_proj.weight"] = value[i]                   # (C, H)
        else:
            half = value.shape[1] // 2                                    # (2H, C): gate; up
            out[prefix + "gate_proj.weight"] = value[i, :half]
            out[prefix + "up_proj.weight"] = value[i, half:]
    return out


def to_mixtral_names(tensors: dict[str, Any]) -> dict[str, Any]:
    """This Llama's tensors under the per-expert names transformers loads."""
    out = {}
    for name, value in tensors.items():
        m = re.match(r"^(model\.layers\.\d+)\.mlp\.(router|experts\.(\d+)\.(\w+))\.weight$",
                     name)
        if m is None:
            out[name] = value
        elif m.group(2) == "router":
            out[f"{m.group(1)}.block_sparse_moe.gate.weight"] = value
        else:
            out[f"{m.group(1)}.block_sparse_moe.experts.{m.group(3)}."
                f"{PROJ_TO_W[m.group(4)]}.weight"] = value
    return out


def check_mixtral_config(cfg: Any) -> None:
    """Raise ValueError unless ``cfg``'s MoE layers compute what a Mixtral does."""
    if cfg.n_shared_experts:
        raise ValueError("a Mixtral checkpoint has no shared experts: save_pretrained writes "
                         "Llama, Mistral and Mixtral layouts, not n_shared_experts > 0")
    if cfg.num_experts_per_tok < 2:
        raise ValueError("num_experts_per_tok=1: Mixtral renormalises the one gate to 1, the "
                         "router here keeps the Switch gate p; use top-2 or more")
    if cfg.moe_intermediate_size not in (None, cfg.intermediate_size):
        raise ValueError(f"a Mixtral's experts are intermediate_size={cfg.intermediate_size} "
                         f"wide, got moe_intermediate_size={cfg.moe_intermediate_size}")
