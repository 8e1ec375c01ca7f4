"""The key/value cache of decoding (Hugging Face's ``DynamicCache``, ``use_cache=True``).

Without a cache, each new token runs the whole context again. With one, every
attention layer keeps the rotated keys and the values of the tokens it has seen,
and a forward takes only the new tokens:

    past   = cache.get_seq_length()                 tokens already in the cache
    k, v   = concat(cached k, v ; this call's k, v)  (B, nkv, past + T, hd)
    q      = this call's T queries at positions past .. past + T - 1
    row i may see key j when  j <= past + i  (and past + i - j < window)

so a step of decoding costs one token's projections and one row of scores per
layer instead of the whole context's. Only the nkv key/value heads are kept: the
cache is n_head / n_kv_head smaller than multi-head attention's (``minidist calc
llama`` gives its bytes). The cache holds arrays, not a graph: it is for inference
(a forward with a cache refuses to run with gradients on).
"""
from __future__ import annotations

from typing import Any

from minidist.backend import xp


class LayerCache:
    """One attention layer's keys and values so far, each (B, nkv, length, hd)."""

    def __init__(self) -> None:
        self.keys: Any = None
        self.values: Any = None

    @property
    def length(self) -> int:
        return 0 if self.keys is None else int(self.keys.shape[-2])

    def update(self, keys: Any, values: Any) -> tuple[Any, Any]:
        """Append this call's (B, nkv, T, hd) keys and values; return all of them."""
        if self.keys is None:
            self.keys, self.values = keys, values
        else:
            if keys.shape[0] != self.keys.shape[0]:
                raise ValueError(f"the cache holds a batch of {self.keys.shape[0]} rows, this "
                                 f"call passes {keys.shape[0]}: start a new DynamicCache")
            self.keys = xp.concatenate([self.keys, keys], axis=-2)
            self.values = xp.concatenate([self.values, values], axis=-2)
        return self.keys, self.values


class DynamicCache:
    """Every layer's ``LayerCache``, made as the layers first ask (``layer(i)``)."""

    def __init__(self) -> None:
        self.layers: list[LayerCache] = []

    def layer(self, index: int) -> LayerCache:
        while len(self.layers) <= index:
            self.layers.append(LayerCache())
        return self.layers[index]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Tokens already cached (Hugging Face's name)."""
        return self.layers[layer_idx].length if layer_idx < len(self.layers) else 0


def cached_attention_mask(past: int, T: int, window: int | None) -> Any:
    """(T, past + T) booleans: row i (position past + i) may see key j (position j)."""
    rows = past + xp.arange(T)[:, None]                              # (T, 1)
    cols = xp.arange(past + T)[None, :]                              # (1, past + T)
    allowed = cols <= rows
    if window is not None:
        allowed = allowed & (rows - cols < window)
    return allowed
