"""26.10 the online-softmax tile update of flash attention.

The learner writes the update that folds one tile of scores into the running
max m, the running sum l and the unnormalised output acc. Graded by folding
the tiles of a random split of the keys and comparing acc / l with
softmax(S) V computed at once, including tiles that are entirely masked.
"""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from minidist.exercises.core import Exercise, Property


@st.composite
def problems(draw, masked: bool = False):
    rows, keys, ev = draw(st.integers(1, 3)), draw(st.integers(1, 9)), draw(st.integers(1, 3))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    s = rng.normal(size=(rows, keys)) * draw(st.sampled_from([1.0, 10.0, 300.0]))
    v = rng.normal(size=(keys, ev))
    cuts = sorted(draw(st.sets(st.integers(1, keys - 1), max_size=keys - 1)) if keys > 1 else [])
    if masked:                       # a first tile the rows cannot see at all
        s = np.concatenate([np.full((rows, 2), -np.inf), s], axis=1)
        v = np.concatenate([rng.normal(size=(2, ev)), v])
        cuts = [2] + [c + 2 for c in cuts]
    return s, v, cuts


def fold(s_impl, s: np.ndarray, v: np.ndarray, cuts: list[int]):
    """Fold the tiles [0, c1), [c1, c2), ... with the subject's update, on arrays
    of the active backend (as flash.py does); the state comes back to the host."""
    from minidist.backend import from_host, to_host, xp
    rows, ev = s.shape[0], v.shape[1]
    m = xp.full((rows, 1), -xp.inf)
    l = xp.zeros((rows, 1))
    acc = xp.zeros((rows, ev))
    edges = [0, *cuts, s.shape[1]]
    for lo, hi in zip(edges[:-1], edges[1:]):
        m, l, acc = s_impl.online_softmax_update(m, l, acc, from_host(s[:, lo:hi].copy()),
                                                 from_host(v[lo:hi].copy()))
    return to_host(m), to_host(l), to_host(acc)


def _softmax_v(s, v):
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True)) @ v


def _matches_softmax(subject, problem):
    s, v, cuts = problem
    m, l, acc = fold(subject, s, v, cuts)
    out, want = acc / l, _softmax_v(s, v)
    assert np.all(np.isfinite(out)), f"acc / l has NaN or inf: {out.tolist()}"
    assert np.allclose(out, want, rtol=1e-10, atol=1e-12), \
        f"tiles cut at {cuts}: acc / l = {out.tolist()}, softmax(S) V = {want.tolist()}"


def _running_stats(subject, problem):
    s, v, cuts = problem
    m, l, _ = fold(subject, s, v, cuts)
    assert m.shape == (s.shape[0], 1), f"m has shape {m.shape}, expected {(s.shape[0], 1)}"
    assert np.array_equal(m[:, 0], s.max(axis=1)), \
        f"tiles cut at {cuts}: m = {m[:, 0].tolist()}, the row max is {s.max(axis=1).tolist()}"
    want = np.exp(s - s.max(axis=1, keepdims=True)).sum(axis=1)
    assert np.allclose(l[:, 0], want, rtol=1e-10), \
        f"tiles cut at {cuts}: l = {l[:, 0].tolist()}, sum exp(s - m) = {want.tolist()}"


ONLINE_SOFTMAX = Exercise(
    id="26.10", title="the online-softmax tile of flash attention", kind="implement",
    filename="ex_26_10_online_softmax.py",
    docs="docs/attention.md (flash attention)",
    starter='''"""Exercise 26.10 (b): the online-softmax update of FlashAttention.

The running state of a block of query rows is the max m_prev (rows, 1), the
sum of exponentials l_prev (rows, 1) and the unnormalised output acc_prev
(rows, Ev). Fold in a new tile of scores s_new (rows, bk) with its values
v_new (bk, Ev):

    m_new  = max(m_prev, rowmax(s_new))
    l_corr = exp(m_prev - m_new) * l_prev            the old sum, rescaled
    l_new  = l_corr + rowsum(exp(s_new - m_new))
    acc    = exp(m_prev - m_new) * acc_prev + exp(s_new - m_new) @ v_new

Start from m = -inf, l = 0, acc = 0; after the last tile, O = acc / l equals
softmax(S) V. A row may see a tile of only -inf (masked) scores: -inf - -inf
is NaN, so shift such rows by 0 instead.

Interface: arrays of minidist.backend.xp (NumPy, or CuPy on a GPU) in, a
tuple (m_new, l_new, acc_new) out. Check: `minidist exercise check 26.10`.
"""
from minidist.backend import xp


def online_softmax_update(m_prev, l_prev, acc_prev, s_new, v_new):
    raise NotImplementedError
''',
    properties=[
        Property("acc / l equals softmax(S) V for any cut of the keys into tiles",
                 _matches_softmax, dict(problem=problems()), examples=25,
                 hint="docs/attention.md: the old acc needs the same correction factor as l"),
        Property("m is the row max and l the sum of exp(s - m) after the last tile",
                 _running_stats, dict(problem=problems()), examples=20,
                 hint="m_new takes the max with the previous m, not only the new tile's"),
        Property("a fully masked first tile gives no NaN", _matches_softmax,
                 dict(problem=problems(masked=True)), examples=10,
                 hint="exp(-inf - (-inf)) is NaN: where m_new is -inf, subtract 0"),
    ],
    solution='''from minidist.backend import xp


def online_softmax_update(m_prev, l_prev, acc_prev, s_new, v_new):
    # the lines of minidist/attention/flash.py's flash_forward, for one tile
    m_new = xp.maximum(m_prev, s_new.max(axis=-1, keepdims=True))
    m_safe = xp.where(m_new == -xp.inf, 0.0, m_new)
    p = xp.exp(s_new - m_safe)
    alpha = xp.exp(m_prev - m_safe)
    l_new = alpha * l_prev + p.sum(axis=-1, keepdims=True)
    acc = alpha * acc_prev + p @ v_new
    return m_new, l_new, acc
''',
    wrong={
        "acc not rescaled": '''from minidist.backend import xp


def online_softmax_update(m_prev, l_prev, acc_prev, s_new, v_new):
    m_new = xp.maximum(m_prev, s_new.max(axis=-1, keepdims=True))
    m_safe = xp.where(m_new == -xp.inf, 0.0, m_new)
    p = xp.exp(s_new - m_safe)
    alpha = xp.exp(m_prev - m_safe)
    return m_new, alpha * l_prev + p.sum(axis=-1, keepdims=True), acc_prev + p @ v_new
''',
        "max of the new tile only": '''from minidist.backend import xp


def online_softmax_update(m_prev, l_prev, acc_prev, s_new, v_new):
    m_new = s_new.max(axis=-1, keepdims=True)
    m_safe = xp.where(m_new == -xp.inf, 0.0, m_new)
    p = xp.exp(s_new - m_safe)
    alpha = xp.exp(xp.where(m_prev == -xp.inf, -xp.inf, m_prev - m_safe))
    return m_new, alpha * l_prev + p.sum(axis=-1, keepdims=True), alpha * acc_prev + p @ v_new
''',
        "no guard for masked rows": '''from minidist.backend import xp


def online_softmax_update(m_prev, l_prev, acc_prev, s_new, v_new):
    m_new = xp.maximum(m_prev, s_new.max(axis=-1, keepdims=True))
    p = xp.exp(s_new - m_new)
    alpha = xp.exp(m_prev - m_new)
    return m_new, alpha * l_prev + p.sum(axis=-1, keepdims=True), alpha * acc_prev + p @ v_new
''',
    })

EXERCISES = [ONLINE_SOFTMAX]
