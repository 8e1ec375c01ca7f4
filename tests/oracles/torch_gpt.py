"""The small GPT of ``minidist.nn.gpt`` written in PyTorch: the oracle it is checked
against (tests) and raced against (bench). Same structure, same parameter names.
"""
from __future__ import annotations

import math

import torch
import torch.nn as tnn
import torch.nn.functional as TF


class TorchAttention(tnn.Module):
    def __init__(self, n_embd: int, n_head: int, bias: bool):
        super().__init__()
        self.n_head = n_head
        self.c_attn = tnn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.c_proj = tnn.Linear(n_embd, n_embd, bias=bias)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool, device=x.device), diagonal=1)
        att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        return self.c_proj(y)


class TorchMLP(tnn.Module):
    def __init__(self, n_embd: int, bias: bool):
        super().__init__()
        self.c_fc = tnn.Linear(n_embd, 4 * n_embd, bias=bias)
        self.c_proj = tnn.Linear(4 * n_embd, n_embd, bias=bias)

    def forward(self, x):
        return self.c_proj(TF.gelu(self.c_fc(x), approximate="tanh"))


class TorchBlock(tnn.Module):
    def __init__(self, n_embd: int, n_head: int, bias: bool):
        super().__init__()
        self.ln_1 = tnn.LayerNorm(n_embd, bias=bias)
        self.attn = TorchAttention(n_embd, n_head, bias)
        self.ln_2 = tnn.LayerNorm(n_embd, bias=bias)
        self.mlp = TorchMLP(n_embd, bias)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class TorchGPT(tnn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.wte = tnn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = tnn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = tnn.ModuleList(TorchBlock(cfg.n_embd, cfg.n_head, cfg.bias)
                                     for _ in range(cfg.n_layer))
        self.ln_f = tnn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.lm_head = tnn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_weights:
            self.lm_head.weight = self.wte.weight

    def forward(self, idx, targets=None):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = TF.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss


def torch_copy_of(model, dtype=None) -> TorchGPT:
    """A TorchGPT with exactly the weights of a minidist GPT."""
    from minidist import backend
    cfg = model.config
    tmodel = TorchGPT(cfg)
    dtype = dtype or getattr(torch, cfg.dtype)
    tmodel.to(dtype)
    state = {name: torch.from_numpy(backend.to_host(arr).copy())
             for name, arr in model.state_dict().items()}
    if cfg.tie_weights:
        state["lm_head.weight"] = state["wte.weight"]
    tmodel.load_state_dict(state, strict=True)
    return tmodel
