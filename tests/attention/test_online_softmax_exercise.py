"""flash_forward's tile update under the properties of exercise 26.10 (one suite, two subjects)."""
import numpy as np
import pytest

from minidist.attention.flash import flash_forward
from minidist.backend import from_host, to_host
from minidist.exercises.grading import run_property
from minidist.exercises.online_softmax import ONLINE_SOFTMAX


class _FlashTile:
    """One tile of flash_forward as the exercise's update: flash_forward on the keys so
    far returns O and L = m + log l, from which the running state is rebuilt."""

    def __init__(self):
        self.s, self.v = [], []

    def online_softmax_update(self, m_prev, l_prev, acc_prev, s_new, v_new):
        # the exercise hands arrays of the backend; this adapter works on the host
        m_prev, l_prev, s_new, v_new = (to_host(a) for a in (m_prev, l_prev, s_new, v_new))
        if not np.isfinite(m_prev).any() and not np.any(l_prev):
            self.s, self.v = [], []                  # a new fold starts
        self.s.append(s_new)
        self.v.append(v_new)
        s, v = np.concatenate(self.s, axis=1), np.concatenate(self.v)
        rows, keys = s.shape
        # scores as q k^T: q = s (rows, keys), k = identity (keys, keys), scale 1
        out, lse = flash_forward(from_host(s[None]), from_host(np.eye(keys)[None]),
                                 from_host(v[None]), block_q=rows, block_k=2)
        out, lse = to_host(out), to_host(lse)
        m = s.max(axis=1, keepdims=True)
        l = np.exp(lse[0][:, None] - np.where(np.isfinite(m), m, 0.0))
        return from_host(m), from_host(l), from_host(out[0] * l)


@pytest.mark.parametrize("prop", ONLINE_SOFTMAX.properties, ids=lambda p: p.name)
def test_flash_forward_holds_the_exercise_property(prop):
    result = run_property(prop, _FlashTile(), max_examples=10)
    assert result.passed, "\n".join(result.lines())
