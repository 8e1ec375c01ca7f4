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
tiles that straddle it are masked element by element. With dropout, P~ (forward)
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
from minidist.backend import xp

BLOCK_Q = 512   # rows of Q per tile; big tiles amortise the per-call overhead of NumPy and BLAS
BLOCK_K = 512   # rows of K / V per tile


def _flat(a: Any) -> Any:
    """(..., L, E) -> (n, L, E), n = product of the leading dims (a view when possible)."""
    return a.reshape((-1,) + tuple(a.shape[-2:]))


def _tile_scores(q_i: Any, k_t: Any, scale: float, lead: tuple, mask: Any, is_causal: bool,
                 i0: int, j0: int) -> Any:
    """S = scale * Q_i K_j^T, masked, for the tile whose corner is (i0, j0): (n, bq, bk)."""
    s = xp.matmul(q_i, k_t)
    s *= scale
    bq, bk = s.shape[-2:]
    if mask is not None:
        # view the tile with the caller's leading dims, so the mask broadcasts
        common.apply_mask(s.reshape(lead + (bq, bk)), mask[..., i0:i0 + bq, j0:j0 + bk])
    if is_causal and j0 + bk - 1 > i0:       # straddles the diagonal: mask elementwise
        common.apply_causal(s, i0, j0)
    return s


def _causal_k_end(i1: int, lk: int, is_causal: bool) -> int:
    """Keys a Q tile ending at row i1 can see: j <= i for some row i < i1."""
    return min(i1, lk) if is_causal else lk


def flash_forward(q: Any, k: Any, v: Any, mask: Any = None, is_causal: bool = False,
                  scale: float = 1.0, dropout_p: float = 0.0, seed: int = 0,
                  block_q: int = BLOCK_Q, block_k: int = BLOCK_K) -> tuple[Any, Any]:
    """Arrays q (..., Lq, E), k (..., Lk, E), v (..., Lk, Ev) -> O (..., Lq, Ev), L (..., Lq).

    ``mask`` as returned by ``common.prepare_mask``. Rows that see no key get O = 0
    and L = -inf.
    """
    lead, lq, lk = q.shape[:-2], q.shape[-2], k.shape[-2]
    q3, v3 = _flat(q), _flat(v)
    k_t = xp.swapaxes(_flat(k), -1, -2)                          # (n, E, Lk)
    n, ev = q3.shape[0], v3.shape[-1]
    out = xp.empty((n, lq, ev), dtype=q.dtype)
    lse = xp.empty((n, lq), dtype=q.dtype)
    for i0 in range(0, lq, block_q):
        i1 = min(i0 + block_q, lq)
        q_i = q3[:, i0:i1]                                       # (n, bq, E)
        m = xp.full((n, i1 - i0, 1), common.NEG_INF, dtype=q.dtype)
        l = xp.zeros((n, i1 - i0, 1), dtype=q.dtype)
        acc = xp.zeros((n, i1 - i0, ev), dtype=q.dtype)
        for j0 in range(0, _causal_k_end(i1, lk, is_causal), block_k):
            j1 = min(j0 + block_k, lk)
            s = _tile_scores(q_i, k_t[:, :, j0:j1], scale, lead, mask, is_causal, i0, j0)
            m_new = xp.maximum(m, s.max(axis=-1, keepdims=True))
            # a row that has seen only masked keys so far has m_new = -inf;
            # shift it by 0 instead, so exp gives 0 rather than exp(-inf + inf) = NaN
            m_safe = xp.where(m_new == common.NEG_INF, 0.0, m_new)
            s -= m_safe
            p = xp.exp(s, out=s)                                 # P~: (n, bq, bk)
            alpha = xp.exp(m - m_safe)                           # correction of the old sums
            l *= alpha
            l += p.sum(axis=-1, keepdims=True)
            if dropout_p > 0:
                p *= common.dropout_scale(seed, dropout_p, n, (i0, i1), (j0, j1), lq, lk,
                                          q.dtype)
            acc *= alpha
            acc += xp.matmul(p, v3[:, j0:j1])
            m = m_new
        seen = l > 0
        l_safe = xp.where(seen, l, 1.0)
        out[:, i0:i1] = acc / l_safe
        lse[:, i0:i1] = xp.where(seen, m + xp.log(l_safe), common.NEG_INF)[..., 0]
    return out.reshape(lead + (lq, ev)), lse.reshape(lead + (lq,))


def flash_backward(q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, mask: Any = None,
                   is_causal: bool = False, scale: float = 1.0, dropout_p: float = 0.0,
                   seed: int = 0, block_q: int = BLOCK_Q,
                   block_k: int = BLOCK_K) -> tuple[Any, Any, Any]:
    """Gradients (dq, dk, dv) from the output O, its logsumexp L and dO alone.

    O and L may be those of a larger attention (more keys than k holds, as in ring
    attention): then P = exp(S - L) is this block's share of the global softmax,
    and the results are this block's contributions to the gradients.
    """
    lead, lq, lk = q.shape[:-2], q.shape[-2], k.shape[-2]
    q3, k3, v3, do3 = _flat(q), _flat(k), _flat(v), _flat(do)
    k_t, v_t = xp.swapaxes(k3, -1, -2), xp.swapaxes(v3, -1, -2)  # (n, E, Lk), (n, Ev, Lk)
    n = q3.shape[0]
    delta = (do3 * _flat(o)).sum(axis=-1, keepdims=True)         # D: (n, Lq, 1)
    lse3 = lse.reshape(n, lq, 1)
    # L = -inf marks a row that saw no key: use +inf, so exp(S - L) = 0 there, not NaN
    lse3 = xp.where(lse3 == common.NEG_INF, -common.NEG_INF, lse3)
    dq = xp.zeros(q3.shape, dtype=q.dtype)
    dk = xp.empty(k3.shape, dtype=q.dtype)
    dv = xp.empty(v3.shape, dtype=q.dtype)
    for j0 in range(0, lk, block_k):
        j1 = min(j0 + block_k, lk)
        dk_j = xp.zeros((n, j1 - j0, k3.shape[-1]), dtype=q.dtype)
        dv_j = xp.zeros((n, j1 - j0, v3.shape[-1]), dtype=q.dtype)
        # causal: rows before j0 see none of these keys; start at the tile holding row j0
        first = (j0 // block_q) * block_q if is_causal else 0
        if is_causal and j0 >= lq:       # keys past the last row: no one sees them
            first = lq
        for i0 in range(first, lq, block_q):
            i1 = min(i0 + block_q, lq)
            s = _tile_scores(q3[:, i0:i1], k_t[:, :, j0:j1], scale, lead, mask, is_causal,
                             i0, j0)
            s -= lse3[:, i0:i1]
            p = xp.exp(s, out=s)                                 # P: (n, bq, bk)
            do_i = do3[:, i0:i1]
            dp = xp.matmul(do_i, v_t[:, :, j0:j1])               # dP: (n, bq, bk)
            if dropout_p > 0:
                keep = common.dropout_scale(seed, dropout_p, n, (i0, i1), (j0, j1), lq, lk,
                                            q.dtype)
                dv_j += xp.matmul(xp.swapaxes(p * keep, -1, -2), do_i)
                dp *= keep
            else:
                dv_j += xp.matmul(xp.swapaxes(p, -1, -2), do_i)
            dp -= delta[:, i0:i1]
            dp *= p                                              # dS
            dq[:, i0:i1] += xp.matmul(dp, k3[:, j0:j1])
            dk_j += xp.matmul(xp.swapaxes(dp, -1, -2), q3[:, i0:i1])
        dk_j *= scale
        dk[:, j0:j1] = dk_j
        dv[:, j0:j1] = dv_j
    dq *= scale
    return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape)


class FlashAttention(Function):
    """Flash attention as an autograd op: saves q, k, v, O and L, nothing Lq x Lk."""

    @staticmethod
    def forward(ctx, q, k, v, mask=None, is_causal=False, scale=1.0, dropout_p=0.0, seed=0,
                block_q=BLOCK_Q, block_k=BLOCK_K):
        o, lse = flash_forward(q, k, v, mask, is_causal, scale, dropout_p, seed, block_q,
                               block_k)
        ctx.save_for_backward(q, k, v, o, lse, mask)
        ctx.options = dict(is_causal=is_causal, scale=scale, dropout_p=dropout_p, seed=seed,
                           block_q=block_q, block_k=block_k)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, mask = ctx.saved
        dq, dk, dv = flash_backward(q, k, v, o, lse, do, mask, **ctx.options)
        return dq, dk, dv, None


def flash_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Any = None,
                    dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                    generator: Any = None, block_q: int = BLOCK_Q,
                    block_k: int = BLOCK_K) -> Tensor:
    """Same arguments and result as ``naive_attention`` (and PyTorch's
    ``scaled_dot_product_attention``), computed tile by tile. ``block_q`` / ``block_k``:
    tile sizes; any sequence lengths work, not only multiples of them.

    Under ``precision.autocast`` the inputs, output and gradients are rounded to its
    format; inside, as in the GPU kernels, scores and sums stay in the input dtype.
    """
    for name, b in (("block_q", block_q), ("block_k", block_k)):
        if not isinstance(b, int) or b < 1:
            raise ValueError(f"{name} must be a positive int, got {b!r}")

    return common.apply_attention(FlashAttention, query, key, value, attn_mask, dropout_p,
                                  is_causal, scale, generator, block_q=block_q, block_k=block_k)
