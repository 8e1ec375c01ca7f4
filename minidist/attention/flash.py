"""Flash attention: tiled online-softmax forward and backward, never the full Lq x Lk.

Forward (Q tiles outer, K/V tiles inner). For a Q tile, keep per row a running
max m, a running sum l and an unnormalised output acc. For each K/V tile j::

    S     = scale * Q_i K_j^T (+ mask)                  (n, bq, bk)
    m_new = max(m, rowmax(S))
    P~    = exp(S - m_new)
    l     = exp(m - m_new) * l + rowsum(P~)             the old sum, corrected
    acc   = exp(m - m_new) * acc + P~ V_j
    m     = m_new

then O_i = acc / l, and the only thing saved for backward besides O is the row
logsumexp L = m + log l: (n, Lq) numbers instead of (n, Lq, Lk).

Backward (K/V tiles outer, Q tiles inner, as FlashAttention-2), from O, L, dO::

    D  = rowsum(dO * O)                                  (n, Lq)
    P  = exp(S - L)                                      recomputed, exact softmax
    dV_j += P^T dO_i ;  dP = dO_i V_j^T ;  dS = P * (dP - D)
    dQ_i += scale dS K_j ;  dK_j += scale dS^T Q_i

With ``is_causal`` the tiles entirely above the diagonal are skipped, and only the
tiles that straddle it are masked element by element (likewise outside a sliding
window; packed documents are masked tile by tile from their ids). With grouped-query
attention (k, v with Hkv < Hq heads) the arrays are viewed as (n, g, L, E), g = Hq / Hkv
query heads per key/value head, and each K/V tile (n, 1, bk, E) broadcasts over its
group in the matmul; dK and dV sum over the group. With dropout, P~ (forward)
and P (backward) are multiplied by keep / (1 - p) after l and D use the undropped
values; each tile regenerates its draws from the seed (common.dropout_scale).

On NumPy, tiles are batched over all heads at once (n = batch * heads), so the
per-tile Python overhead is paid once per tile, not once per head.
"""
from __future__ import annotations

from typing import Any

from minidist.attention import common
from minidist.autograd.function import Function
from minidist.autograd.tensor import Tensor
from minidist import backend
from minidist.backend import xp

BLOCK_Q = 512   # rows of Q per tile; big tiles amortise the per-call overhead of NumPy and BLAS
BLOCK_K = 512   # rows of K / V per tile
# On CuPy every array op of a tile is a kernel launch of its own, so fewer, larger tiles:
# causal s = 4096, 8 heads, forward + backward on an H100 took 33-52 ms with 512-row tiles,
# 13 ms with 1024 (4.3x SDPA's), 11 ms with 2048, and a 1024 tile still holds 1/11 of the
# naive op's memory at s = 4096, 1/37 at 8192 (docs/gpu.md, "Measured figures").
GPU_BLOCK = 1024


def default_tiles() -> tuple[int, int]:
    """(block_q, block_k) that ``flash_attention`` uses when given none: 512 on the
    CPU backends, 1024 on CuPy."""
    if backend.get_backend() == "cupy":
        return GPU_BLOCK, GPU_BLOCK
    return BLOCK_Q, BLOCK_K


def _grouped(q: Any, k: Any) -> tuple[int, int]:
    """(n_kv, g): the key/value heads n_kv (product of k's leading dims) and the query
    heads per key/value head g (1 unless grouped-query attention)."""
    n_q, n_kv = 1, 1
    for size in q.shape[:-2]:
        n_q *= size
    for size in k.shape[:-2]:
        n_kv *= size
    return n_kv, n_q // n_kv


def _view(a: Any, n: int, g: int) -> Any:
    """(..., L, E) -> (n, g, L, E): query heads grouped under their key/value head."""
    return a.reshape((n, g) + tuple(a.shape[-2:]))


def _group_sum(a: Any) -> Any:
    """(n, g, L, E) -> (n, 1, L, E): a key/value head's gradient is the sum over its group."""
    return a if a.shape[1] == 1 else a.sum(axis=1, keepdims=True)


def _tile_scores(q_i: Any, k_t: Any, scale: float, lead: tuple, mask: Any,
                 structure: common.Structure, i0: int, j0: int) -> Any:
    """S = scale * Q_i K_j^T, masked, for the tile whose corner is (i0, j0): (n, g, bq, bk).

    K_j (n, 1, E, bk) broadcasts over the g query heads of its group: the repeated
    K / V of grouped-query attention is never made."""
    s = xp.matmul(q_i, k_t)
    s *= scale
    bq, bk = s.shape[-2:]
    if mask is not None:
        # view the tile with the caller's leading dims, so the mask broadcasts
        common.apply_mask(s.reshape(lead + (bq, bk)), mask[..., i0:i0 + bq, j0:j0 + bk])
    structure.apply(s, i0, j0)
    return s


def _first(start: int, block: int) -> int:
    """The start of the tile (on the grid of ``block``) that holds index ``start``."""
    return (start // block) * block


def flash_forward(q: Any, k: Any, v: Any, mask: Any = None, is_causal: bool = False,
                  scale: float = 1.0, dropout_p: float = 0.0, seed: int = 0,
                  block_q: int = BLOCK_Q, block_k: int = BLOCK_K,
                  structure: common.Structure | None = None) -> tuple[Any, Any]:
    """Arrays q (..., Lq, E), k (..., Lk, E), v (..., Lk, Ev) -> O (..., Lq, Ev), L (..., Lq).

    k and v may have fewer heads than q (grouped-query attention, dim -3). ``mask`` as
    returned by ``common.prepare_mask``; ``structure`` (causal, window, documents)
    replaces ``is_causal`` when given. Rows that see no key get O = 0 and L = -inf.
    """
    structure = structure or common.Structure(is_causal)
    lead, lq, lk = q.shape[:-2], q.shape[-2], k.shape[-2]
    n, g = _grouped(q, k)
    q4, v4 = _view(q, n, g), _view(v, n, 1)                      # (n, g, Lq, E), (n, 1, Lk, Ev)
    k_t = xp.swapaxes(_view(k, n, 1), -1, -2)                    # (n, 1, E, Lk)
    ev = v4.shape[-1]
    out = xp.empty((n, g, lq, ev), dtype=q.dtype)
    lse = xp.empty((n, g, lq), dtype=q.dtype)
    for i0 in range(0, lq, block_q):
        i1 = min(i0 + block_q, lq)
        q_i = q4[:, :, i0:i1]                                    # (n, g, bq, E)
        m = xp.full((n, g, i1 - i0, 1), common.NEG_INF, dtype=q.dtype)
        l = xp.zeros((n, g, i1 - i0, 1), dtype=q.dtype)
        acc = xp.zeros((n, g, i1 - i0, ev), dtype=q.dtype)
        start, stop = structure.keys(i0, i1, lk)
        for j0 in range(_first(start, block_k), stop if start < stop else 0, block_k):
            j1 = min(j0 + block_k, lk)
            s = _tile_scores(q_i, k_t[..., j0:j1], scale, lead, mask, structure, i0, j0)
            m_new = xp.maximum(m, s.max(axis=-1, keepdims=True))
            # a row that has seen only masked keys so far has m_new = -inf;
            # shift it by 0 instead, so exp gives 0 rather than exp(-inf + inf) = NaN
            m_safe = xp.where(m_new == common.NEG_INF, 0.0, m_new)
            s -= m_safe
            p = xp.exp(s, out=s)                                 # P~: (n, g, bq, bk)
            alpha = xp.exp(m - m_safe)                           # correction of the old sums
            l *= alpha
            l += p.sum(axis=-1, keepdims=True)
            if dropout_p > 0:
                p *= common.dropout_scale(seed, dropout_p, n * g, (i0, i1), (j0, j1), lq, lk,
                                          q.dtype).reshape(p.shape)
            acc *= alpha
            acc += xp.matmul(p, v4[:, :, j0:j1])                 # (n, g, bq, Ev)
            m = m_new
        seen = l > 0
        l_safe = xp.where(seen, l, 1.0)
        out[:, :, i0:i1] = acc / l_safe
        lse[:, :, i0:i1] = xp.where(seen, m + xp.log(l_safe), common.NEG_INF)[..., 0]
    return out.reshape(lead + (lq, ev)), lse.reshape(lead + (lq,))


def _row_terms(o4: Any, do4: Any, lse: Any) -> tuple[Any, Any]:
    """Per query row: D = rowsum(dO * O) and L, both (n, g, Lq, 1); a row that saw no
    key (L = -inf) gets L = +inf, so that exp(S - L) = 0 there, not NaN."""
    delta = (do4 * o4).sum(axis=-1, keepdims=True)
    lse4 = lse.reshape(delta.shape)
    return delta, xp.where(lse4 == common.NEG_INF, -common.NEG_INF, lse4)


def flash_backward(q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, mask: Any = None,
                   is_causal: bool = False, scale: float = 1.0, dropout_p: float = 0.0,
                   seed: int = 0, block_q: int = BLOCK_Q, block_k: int = BLOCK_K,
                   structure: common.Structure | None = None) -> tuple[Any, Any, Any]:
    """Gradients (dq, dk, dv) from the output O, its logsumexp L and dO alone.

    O and L may be those of a larger attention (more keys than k holds, as in ring
    attention): then P = exp(S - L) is this block's share of the global softmax,
    and the results are this block's contributions to the gradients. With grouped
    heads, dK and dV of a key/value head sum over the g query heads that read it.
    """
    structure = structure or common.Structure(is_causal)
    lead, lq, lk = q.shape[:-2], q.shape[-2], k.shape[-2]
    n, g = _grouped(q, k)
    q4, do4 = _view(q, n, g), _view(do, n, g)                    # (n, g, Lq, E)
    k4, v4 = _view(k, n, 1), _view(v, n, 1)                      # (n, 1, Lk, E)
    k_t, v_t = xp.swapaxes(k4, -1, -2), xp.swapaxes(v4, -1, -2)  # (n, 1, E, Lk), (n, 1, Ev, Lk)
    delta, lse4 = _row_terms(_view(o, n, g), do4, lse)           # D, L: (n, g, Lq, 1)
    dq = xp.zeros(q4.shape, dtype=q.dtype)
    dk, dv = xp.empty(k4.shape, dtype=q.dtype), xp.empty(v4.shape, dtype=q.dtype)
    for j0 in range(0, lk, block_k):
        j1 = min(j0 + block_k, lk)
        dk_j = xp.zeros((n, 1, j1 - j0, k4.shape[-1]), dtype=q.dtype)
        dv_j = xp.zeros((n, 1, j1 - j0, v4.shape[-1]), dtype=q.dtype)
        # rows that see none of these keys (causal: before j0; window: too far after)
        start, stop = structure.rows(j0, j1, lq)
        for i0 in range(_first(start, block_q), stop if start < stop else 0, block_q):
            i1 = min(i0 + block_q, lq)
            s = _tile_scores(q4[:, :, i0:i1], k_t[..., j0:j1], scale, lead, mask, structure,
                             i0, j0)
            s -= lse4[:, :, i0:i1]
            p = xp.exp(s, out=s)                                 # P: (n, g, bq, bk)
            do_i = do4[:, :, i0:i1]
            dp = xp.matmul(do_i, v_t[..., j0:j1])                # dP: (n, g, bq, bk)
            if dropout_p > 0:
                keep = common.dropout_scale(seed, dropout_p, n * g, (i0, i1), (j0, j1), lq, lk,
                                            q.dtype).reshape(p.shape)
                dv_j += _group_sum(xp.matmul(xp.swapaxes(p * keep, -1, -2), do_i))
                dp *= keep
            else:
                dv_j += _group_sum(xp.matmul(xp.swapaxes(p, -1, -2), do_i))
            dp -= delta[:, :, i0:i1]
            dp *= p                                              # dS
            dq[:, :, i0:i1] += xp.matmul(dp, k4[:, :, j0:j1])
            dk_j += _group_sum(xp.matmul(xp.swapaxes(dp, -1, -2), q4[:, :, i0:i1]))
        dk_j *= scale
        dk[:, :, j0:j1] = dk_j
        dv[:, :, j0:j1] = dv_j
    dq *= scale
    return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape)


class FlashAttention(Function):
    """Flash attention as an autograd op: saves q, k, v, O and L, nothing Lq x Lk."""

    @staticmethod
    def forward(ctx, q, k, v, mask=None, is_causal=False, scale=1.0, dropout_p=0.0, seed=0,
                block_q=BLOCK_Q, block_k=BLOCK_K, structure=None):
        structure = structure or common.Structure(is_causal)
        o, lse = flash_forward(q, k, v, mask, scale=scale, dropout_p=dropout_p, seed=seed,
                               block_q=block_q, block_k=block_k, structure=structure)
        ctx.save_for_backward(q, k, v, o, lse, mask)
        ctx.options = dict(scale=scale, dropout_p=dropout_p, seed=seed, block_q=block_q,
                           block_k=block_k, structure=structure)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, mask = ctx.saved
        dq, dk, dv = flash_backward(q, k, v, o, lse, do, mask, **ctx.options)
        return dq, dk, dv, None


def flash_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Any = None,
                    dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                    generator: Any = None, block_q: int | None = None,
                    block_k: int | None = None, enable_gqa: bool = False,
                    window: int | None = None, document_ids: Any = None) -> Tensor:
    """Same arguments and result as ``naive_attention`` (and PyTorch's
    ``scaled_dot_product_attention``), computed tile by tile. ``block_q`` / ``block_k``:
    tile sizes (``default_tiles()`` when None: 512 on the CPU, 1024 on CuPy); any sequence
    lengths work, not only multiples of them. With
    ``enable_gqa`` each key/value tile serves its group of query heads by broadcasting;
    with a ``window`` the tiles wholly outside it are skipped, as those above the
    causal diagonal are.

    Under ``precision.autocast`` the inputs, output and gradients are rounded to its
    format; inside, as in the GPU kernels, scores and sums stay in the input dtype.
    """
    default_q, default_k = default_tiles()
    block_q = default_q if block_q is None else block_q
    block_k = default_k if block_k is None else block_k
    for name, b in (("block_q", block_q), ("block_k", block_k)):
        if not isinstance(b, int) or b < 1:
            raise ValueError(f"{name} must be a positive int, got {b!r}")

    return common.apply_attention(FlashAttention, query, key, value, attn_mask, dropout_p,
                                  is_causal, scale, generator, enable_gqa, window, document_ids,
                                  block_q=block_q, block_k=block_k)
