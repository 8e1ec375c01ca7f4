"""What naive and flash attention share: argument checks, masks, dropout, the lse merge.

Shapes, as in ``torch.nn.functional.scaled_dot_product_attention``::

    q: (..., Lq, E)   k: (..., Lk, E)   v: (..., Lk, Ev)   ->   out: (..., Lq, Ev)

``...`` is any number of leading dimensions (batch, heads), the same for all three;
with ``enable_gqa`` (grouped-query attention, as PyTorch's flag) k and v may have
fewer heads (dim -3) than q: query head h reads key/value head h // (Hq / Hkv).
A mask is boolean (True = attend) or additive float, broadcastable to (..., Lq, Lk).
``is_causal`` keeps column j for row i when j <= i: the causal mask aligned at the
top-left corner, as PyTorch's, also when Lq != Lk.

Two masks are computed from positions, a tile at a time, never stored (``Structure``):
a sliding window (row i sees key j only if i - j < window, as Mistral's) and packed
documents (row i sees key j only if both lie in the same document of the row).
"""
from __future__ import annotations

import math
from typing import Any

from minidist import backend
from minidist.autograd.tensor import Tensor
from minidist.backend import xp
from minidist.backend.blocks import blockwise
from minidist.precision.autocast import autocast_matmul

NEG_INF = -math.inf


# -- argument checks -----------------------------------------------------------

def check_qkv(q: Any, k: Any, v: Any, enable_gqa: bool = False) -> None:
    """Raise on shapes or dtypes that attention cannot take (loud, before any work)."""
    for name, a in (("query", q), ("key", k), ("value", v)):
        if a.ndim < 2:
            raise ValueError(f"{name} needs at least 2 dimensions (..., L, E), got {a.shape}")
        if a.dtype.kind != "f":
            raise TypeError(f"{name} must be a floating-point array, got {a.dtype}")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"query, key and value must share a dtype, got "
                        f"{q.dtype}, {k.dtype}, {v.dtype}")
    if enable_gqa and q.shape[:-2] != k.shape[:-2]:
        if q.ndim < 3 or k.shape[:-2] != v.shape[:-2] or q.shape[:-3] != k.shape[:-3] \
                or q.shape[-3] % k.shape[-3]:
            raise ValueError(f"grouped-query attention needs key and value of one shape "
                             f"(..., Hkv, Lk, E) with Hkv dividing the query heads Hq of "
                             f"(..., Hq, Lq, E), got {q.shape}, {k.shape}, {v.shape}")
    elif not q.shape[:-2] == k.shape[:-2] == v.shape[:-2]:
        raise ValueError(f"query, key and value must share their leading (batch, head) "
                         f"dimensions, got {q.shape}, {k.shape}, {v.shape}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"query and key must have the same head dim E, got "
                         f"{q.shape[-1]} and {k.shape[-1]}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"key and value must have the same length Lk, got "
                         f"{k.shape[-2]} and {v.shape[-2]}")


def check_options(attn_mask: Any, dropout_p: float, is_causal: bool) -> None:
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if is_causal and attn_mask is not None:
        raise ValueError("pass either attn_mask or is_causal=True, not both (as PyTorch)")


def mask_array(attn_mask: Any) -> Any:
    """A mask given as a Tensor or an array -> the array; a mask that wants a gradient
    is refused (these ops treat the mask as a constant)."""
    if isinstance(attn_mask, Tensor):
        if attn_mask.requires_grad:
            raise ValueError("attn_mask requires grad, but attention treats the mask as a "
                             "constant; detach it")
        return attn_mask.data
    return attn_mask


def prepare_mask(mask: Any, q: Any, k: Any) -> Any:
    """Check ``mask`` and view it with as many dims as q, padding size-1 dims in front.

    The mask is never broadcast to its full shape here: a (Lq, Lk) mask for many
    heads stays one (Lq, Lk) array, and each tile slices it.
    """
    if mask is None:
        return None
    if not backend.is_array(mask):
        raise TypeError(f"attn_mask must be an array of the active backend, got {type(mask)}")
    if mask.dtype != bool and mask.dtype != q.dtype:
        raise TypeError(f"attn_mask must be bool or of the query's dtype {q.dtype}, "
                        f"got {mask.dtype}")
    want = q.shape[:-1] + (k.shape[-2],)                                # (..., Lq, Lk)
    if mask.ndim > len(want):
        raise ValueError(f"attn_mask of shape {mask.shape} has more dims than {want}")
    padded = (1,) * (len(want) - mask.ndim) + tuple(mask.shape)
    for have, need in zip(padded, want):
        if have not in (1, need):
            raise ValueError(f"attn_mask of shape {mask.shape} does not broadcast to {want}")
    return mask.reshape(padded)


def apply_mask(s: Any, mask_tile: Any) -> None:
    """In place: s += mask (float) or s = -inf where mask is False (bool)."""
    if mask_tile.dtype == bool:
        xp.copyto(s, NEG_INF, where=xp.logical_not(mask_tile))
    else:
        s += mask_tile


def apply_causal(s: Any, row0: int, col0: int) -> None:
    """In place: s[..., i, j] = -inf where column col0 + j lies after row row0 + i."""
    rows = xp.arange(row0, row0 + s.shape[-2])[:, None]
    cols = xp.arange(col0, col0 + s.shape[-1])[None, :]
    xp.copyto(s, NEG_INF, where=cols > rows)                            # (bq, bk) -> s


class Structure:
    """The masks that follow from positions: causal, sliding window, packed documents.

    Row i (query position) may see key j when

        causal:    j <= i
        window:    i - j < window            (with causal: the last ``window`` keys)
        documents: doc_q[b, i] == doc_k[b, j]

    ``docs`` is None or a pair of integer arrays (Bd, Lq), (Bd, Lk) whose first axis is
    the batch (the first leading dim of the scores) or 1. Nothing (Lq, Lk)-sized is
    kept: ``apply`` masks one tile, ``keys`` / ``rows`` say which tiles can be skipped.

    ``shift``: row i stands at position i + shift of the keys' axis (0 in one process).
    Ring attention scores a chunk of queries against a chunk of keys that starts
    elsewhere in the sequence: shift = (query chunk start) - (key chunk start), and
    causal and window then compare global positions, i + shift >= j and so on.
    """

    def __init__(self, is_causal: bool = False, window: int | None = None,
                 docs: tuple[Any, Any] | None = None, shift: int = 0):
        self.is_causal, self.window, self.docs, self.shift = is_causal, window, docs, shift

    def keys(self, i0: int, i1: int, lk: int) -> tuple[int, int]:
        """[start, stop) of the keys that some row in [i0, i1) may see."""
        start, stop = 0, lk
        if self.is_causal:
            stop = max(0, min(i1 + self.shift, lk))
        if self.window is not None:
            start = max(0, i0 + self.shift - self.window + 1)
        return start, stop

    def rows(self, j0: int, j1: int, lq: int) -> tuple[int, int]:
        """[start, stop) of the rows that may see some key in [j0, j1)."""
        start, stop = 0, lq
        if self.is_causal:
            start = min(max(0, j0 - self.shift), lq)
        if self.window is not None:
            stop = min(lq, j1 - self.shift + self.window - 1)
        return start, max(start, stop)

    def apply(self, s: Any, i0: int, j0: int) -> None:
        """In place: -inf where the tile of scores s (..., bq, bk) at corner (i0, j0) is masked.

        s must be contiguous, with the batch as its first axis (documents view it so)."""
        bq, bk = s.shape[-2:]
        p0 = i0 + self.shift                        # the first row's position among the keys
        if self.is_causal and j0 + bk - 1 > p0:     # straddles the diagonal
            apply_causal(s, p0, j0)
        if self.window is not None and j0 <= p0 + bq - 1 - self.window:
            rows = xp.arange(p0, p0 + bq)[:, None]
            cols = xp.arange(j0, j0 + bk)[None, :]
            xp.copyto(s, NEG_INF, where=rows - cols >= self.window)    # (bq, bk) -> s
        if self.docs is not None:
            doc_q, doc_k = self.docs
            view = s.reshape((doc_q.shape[0], -1, bq, bk))              # (Bd, rest, bq, bk)
            apart = doc_q[:, None, i0:i0 + bq, None] != doc_k[:, None, None, j0:j0 + bk]
            xp.copyto(view, NEG_INF, where=apart)                       # (Bd, 1, bq, bk)


def make_structure(q: Any, k: Any, is_causal: bool, window: int | None,
                   document_ids: Any) -> Structure:
    """Check ``window`` and ``document_ids`` against q (..., Lq, E), k (..., Lk, E)."""
    if window is not None:
        if not isinstance(window, int) or isinstance(window, bool) or window < 1:
            raise ValueError(f"window must be a positive int (keys per row), got {window!r}")
        if not is_causal:
            raise ValueError("a sliding window needs is_causal=True (row i sees keys "
                             "i - window + 1 .. i)")
    docs = None
    if document_ids is not None:
        ids = document_ids.data if isinstance(document_ids, Tensor) else document_ids
        if not backend.is_array(ids) or ids.dtype.kind not in "iu":
            raise TypeError("document_ids must be an integer array of the active backend, "
                            f"got {type(ids).__name__} {getattr(ids, 'dtype', '')}")
        if q.shape[-2] != k.shape[-2]:
            raise ValueError(f"document_ids needs self-attention (Lq == Lk), got "
                             f"Lq={q.shape[-2]}, Lk={k.shape[-2]}")
        lead = q.shape[:-2]
        batch = lead[0] if len(lead) >= 2 else 1
        if ids.ndim == 1:
            ids = ids[None, :]
        if ids.ndim != 2 or ids.shape[1] != q.shape[-2] or ids.shape[0] not in (1, batch):
            raise ValueError(f"document_ids must be (L,) or (B, L) with L={q.shape[-2]} "
                             f"and B={batch} (the batch of (B, heads, L, E)), "
                             f"got {tuple(ids.shape)}")
        docs = (ids, ids)
    return Structure(is_causal, window, docs)


def default_scale(q: Any, scale: float | None) -> float:
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)


# -- dropout that a tile can regenerate ------------------------------------------
#
# Flash attention never holds the whole (Lq, Lk) matrix of dropout draws, yet its
# backward must drop exactly the entries its forward dropped. So the draw for
# entry (n, i, j) is a hash of (seed, its flat index): any tile can recompute its
# own part, and naive attention, hashing every index at once, drops the same
# entries. The hash is splitmix64's finaliser, a bijection on 64-bit integers
# with good avalanche; the top 53 bits give a uniform u in [0, 1), kept if u >= p.

_GOLDEN = 0x9E3779B97F4A7C15


def dropout_scale(seed: int, p: float, n: int, rows: tuple[int, int], cols: tuple[int, int],
                  lq: int, lk: int, dtype: Any) -> Any:
    """keep / (1 - p) for entries [0:n, rows, cols] of an (n, lq, lk) matrix: (n, bq, bk)."""
    i = xp.arange(rows[0], rows[1], dtype="uint64")[None, :, None]
    j = xp.arange(cols[0], cols[1], dtype="uint64")[None, None, :]
    b = xp.arange(n, dtype="uint64")[:, None, None]
    index = (b * lq + i) * lk + j                                       # flat index
    # the hash is a chain of elementwise steps: one cache-sized block at a time
    return blockwise(lambda x: _keep_scale(x, seed, p, dtype), index, dtype)


def _keep_scale(x: Any, seed: int, p: float, dtype: Any) -> Any:
    """keep / (1 - p) for flat indices x (uint64): splitmix64's finaliser of the seeded index."""
    x = x * _GOLDEN + seed                                              # wraps mod 2^64
    x ^= x >> 30
    x *= 0xBF58476D1CE4E5B9
    x ^= x >> 27
    x *= 0x94D049BB133111EB
    x ^= x >> 31
    keep = (x >> 11) >= int(p * 2.0**53)                               # u >= p
    return keep.astype(dtype) * (1.0 / (1.0 - p))


def draw_seed(generator: Any = None) -> int:
    """A 62-bit seed for one attention call, from ``generator`` or the default one."""
    gen = generator if generator is not None else backend.default_generator()
    return int(backend.to_host(gen.integers(0, 2**62, (1,)))[0])


# -- combining partial results: the logsumexp rule ---------------------------------

def merge_partial(o: Any, lse: Any, o_part: Any, lse_part: Any) -> None:
    """In place: fold the attention of the same rows over other keys into (o, lse).

    Each pair is softmax-normalised over its own keys, with L = log sum exp(S). Over
    the union of keys:

        L   = log(e^L_a + e^L_b)
        out = (e^(L_a - L) o_a + e^(L_b - L) o_b)

    o: (..., L, Ev), lse: (..., L). A row with no visible key has L = -inf and o = 0
    on both sides, and keeps them.
    """
    top = xp.maximum(lse, lse_part)
    top = xp.where(top == NEG_INF, 0.0, top)               # both empty: any finite shift
    a = xp.exp(lse - top)
    b = xp.exp(lse_part - top)
    total = a + b
    empty = total == 0
    total = xp.where(empty, 1.0, total)
    o *= (a / total)[..., None]
    o += (b / total)[..., None] * o_part
    lse[...] = xp.where(empty, NEG_INF, top + xp.log(total))


def apply_attention(op: Any, query: Tensor, key: Tensor, value: Tensor, attn_mask: Any,
                    dropout_p: float, is_causal: bool, scale: float | None, generator: Any,
                    enable_gqa: bool = False, window: int | None = None,
                    document_ids: Any = None, **options: Any) -> Tensor:
    """Check the arguments the way PyTorch's ``scaled_dot_product_attention`` does, then
    run ``op`` (``NaiveAttention`` or ``FlashAttention``) under the active autocast.

    Under ``precision.autocast`` the inputs, output and gradients are rounded to its
    format; inside, the op computes in the dtype of its inputs.
    """
    def run(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        q_, k_, v_ = (t.data if isinstance(t, Tensor) else t for t in (q, k, v))
        check_qkv(q_, k_, v_, enable_gqa)
        check_options(attn_mask, dropout_p, is_causal)
        mask = prepare_mask(mask_array(attn_mask), q_, k_)
        structure = make_structure(q_, k_, is_causal, window, document_ids)
        seed = draw_seed(generator) if dropout_p > 0 else 0
        return op.apply(q, k, v, mask, structure=structure, scale=default_scale(q_, scale),
                        dropout_p=dropout_p, seed=seed, **options)
    return autocast_matmul(run, query, key, value)
