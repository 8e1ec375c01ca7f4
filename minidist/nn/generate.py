"""Autoregressive decoding, shared by the GPT and the Llama (``model.generate``).

    for each new token:  logits = model(idx[:, -context:])[0][:, -1] / temperature
                         top-k: logits below the k-th largest -> -inf
                         next ~ softmax(logits)      (do_sample=False: argmax, greedy)

Without a cache the whole context is run again for every token: plain, and the
oracle. ``use_cache=True`` (a model whose forward takes ``past_key_values``: the
Llama) runs the prompt once into a ``DynamicCache`` and then one new token per step
(nn/kv_cache.py); once the sequence outgrows ``context`` it goes back to running
the last ``context`` tokens whole, as without a cache, since positions then shift.
Sampling is inverse-CDF with one uniform draw per row, so a seed gives the same
tokens on every backend.

A model split by vocabulary (tensor parallelism: each rank's logits are V/t columns)
must pick from the whole vocabulary: ``whole_logits`` turns what the forward returned
into the whole (B, T, V) logits (``TensorParallelLlama`` all-gathers its columns), and
a DTensor result (a plan's ``vocab_parallel_loss`` head) is gathered by its
``full_tensor``, so every rank draws the same token as one process.
"""
from __future__ import annotations

from typing import Any, Callable

from minidist import backend
from minidist.autograd.grad_mode import no_grad
from minidist.autograd.tensor import Tensor
from minidist.backend import xp
from minidist.nn import functional as F
from minidist.nn.kv_cache import DynamicCache


@no_grad()
def generate(model: Any, idx: Any, max_new_tokens: int, context: int, temperature: float = 1.0,
             top_k: int | None = None, seed: int = 0, do_sample: bool = True,
             use_cache: bool = False,
             whole_logits: Callable[[Any], Tensor] | None = None) -> Any:
    """``max_new_tokens`` tokens after ``idx`` (B, T), the model seeing at most ``context``
    tokens; returns (B, T + new). ``whole_logits``: the whole vocabulary's logits from
    the forward's (module docstring; default: as they are)."""
    gen = backend.Generator(seed)
    was_training = model.training
    model.eval()
    cache = DynamicCache() if use_cache else None
    for _ in range(max_new_tokens):
        if cache is not None and idx.shape[1] > context:
            cache = None                          # positions would shift: run whole again
        if cache is None:
            logits, _ = model(idx[:, -context:])
        else:                                     # only the tokens the cache lacks
            logits, _ = model(idx[:, cache.get_seq_length():], past_key_values=cache)
        logits = _whole(logits, whole_logits).data[:, -1, :]           # (B, vocab)
        if not do_sample:
            nxt = xp.argmax(logits, axis=-1)[:, None]                  # greedy
        else:
            logits = logits / temperature
            if top_k is not None:
                kth = xp.sort(logits, axis=-1)[:, -min(top_k, logits.shape[-1])][:, None]
                logits = xp.where(logits < kth, -xp.inf, logits)
            probs = F.softmax(Tensor(logits), axis=-1).data
            # inverse-CDF sampling with a uniform draw: same on every backend
            u = gen.random((probs.shape[0], 1), dtype=probs.dtype)
            nxt = (xp.cumsum(probs, axis=-1) < u).sum(axis=-1, keepdims=True)
            nxt = xp.minimum(nxt, probs.shape[-1] - 1)
        idx = xp.concatenate([idx, nxt.astype(idx.dtype)], axis=1)
    model.train(was_training)
    return idx


def _whole(logits: Any, whole_logits: Callable[[Any], Tensor] | None) -> Tensor:
    """The whole vocabulary's logits (B, T, V) as a Tensor."""
    if whole_logits is not None:
        return whole_logits(logits)
    if not isinstance(logits, Tensor):   # a DTensor: gathered whole, torch's full_tensor()
        return logits.full_tensor()
    return logits
