"""Attention: the naive reference and flash attention, both autograd ops.

    from minidist.attention import flash_attention, naive_attention
    out = flash_attention(q, k, v, is_causal=True)        # (..., Lq, Ev), as torch's SDPA

- naive.py   softmax(scale Q K^T + mask) V, the whole (Lq, Lk) matrix; the oracle
- flash.py   the tiled online-softmax forward and backward (``flash_forward`` /
             ``flash_backward`` on arrays, reused by ring attention)
- common.py  argument checks, masks, regenerable dropout, the logsumexp merge

See docs/attention.md and demos/10_flash_attention.py.
"""
from minidist.attention.common import merge_partial
from minidist.attention.flash import FlashAttention, flash_attention, flash_backward, flash_forward
from minidist.attention.naive import NaiveAttention, naive_attention

__all__ = ["naive_attention", "flash_attention", "NaiveAttention", "FlashAttention",
           "flash_forward", "flash_backward", "merge_partial"]
