"""FP8 scaling: delayed scales from the amax history (old scale kept when amax is
0 or not finite), current scales from the tensor, saturating E4M3 / E5M2 casts
around each matmul."""
from __future__ import annotations

import numpy as np
import pytest

from minidist import Tensor, backend
from minidist.nn import functional as F
from minidist.precision import (FP8_E4M3FN, FP8_E5M2, CurrentScaling, DelayedScaling,
                                ScalingState, fp8_autocast)

from precision.helpers import quantize_host, same


def state(history=3, margin=0, algo="max", delayed=True) -> ScalingState:
    return ScalingState(FP8_E4M3FN, margin, history, algo, delayed)


def cast(s: ScalingState, values) -> np.ndarray:
    return backend.to_host(s.cast(backend.from_host(np.array(values, np.float32))))


def test_delayed_scale_follows_the_amax_history():
    s = state(history=3)
    assert cast(s, [1000.0, 0.01]).tolist()[0] == 448.0       # scale 1: saturates
    s.update()
    assert float(s.scale) == np.float32(448.0 / 1000.0)
    for amax in (10.0, 20.0, 5.0):                            # window of 3 steps
        cast(s, [amax])
        s.update()
    assert float(s.scale) == np.float32(448.0 / 20.0)          # 1000 has left the window
    cast(s, [1.0])
    s.update()
    assert float(s.scale) == np.float32(448.0 / 20.0)          # still the max of 20, 5, 1


def test_most_recent_and_margin():
    s = state(algo="most_recent", margin=2)
    cast(s, [100.0])
    s.update()
    cast(s, [7.0])
    s.update()
    assert float(s.scale) == np.float32(448.0 / 7.0 / 4.0)


@pytest.mark.parametrize("bad", [0.0, np.inf, np.nan])
def test_delayed_scale_kept_when_amax_is_zero_or_not_finite(bad):
    s = state(history=1)
    cast(s, [2.0])
    s.update()
    kept = float(s.scale)
    cast(s, [bad, 0.0])
    s.update()
    assert float(s.scale) == kept


def test_cast_is_a_saturating_scaled_quantize():
    s = state(history=1)
    cast(s, [0.5])
    s.update()                                                   # scale = 896
    x = np.random.default_rng(0).uniform(-1, 1, 1000).astype(np.float32)
    sc = np.float32(896.0)
    want = quantize_host(x * sc, FP8_E4M3FN, saturate=True) * (np.float32(1) / sc)
    assert same(cast(s, x), want)


def test_current_scaling_uses_the_tensors_own_amax():
    s = state(delayed=False)
    x = np.array([3e-3, -1.5e-3, 2e-4], np.float32)
    sc = np.float32(448.0) / np.float32(3e-3)
    want = quantize_host(x * sc, FP8_E4M3FN, saturate=True) * (np.float32(1) / sc)
    assert same(cast(s, x), want)


def test_fp8_linear_casts_inputs_e4m3_and_output_gradient_e5m2():
    rng = np.random.default_rng(1)
    X = rng.standard_normal((6, 8)).astype(np.float32)
    W = rng.standard_normal((4, 8)).astype(np.float32)
    G = (rng.standard_normal((6, 4)) * 1e-3).astype(np.float32)
    x, w = (Tensor(backend.from_host(a), requires_grad=True) for a in (X, W))
    recipe = CurrentScaling()
    with fp8_autocast(recipe):
        y = F.linear(x, w)
    y.backward(backend.from_host(G))

    def q(a, fmt):
        sc = np.float32(fmt.max) / np.abs(a).max()
        return quantize_host(a * sc, fmt, saturate=True) * (np.float32(1) / sc)
    x8, w8, g8 = q(X, FP8_E4M3FN), q(W, FP8_E4M3FN), q(G, FP8_E5M2)
    assert np.allclose(backend.to_host(y.data), x8 @ w8.T, rtol=1e-6, atol=1e-6)
    assert np.allclose(backend.to_host(x.grad), g8 @ w8, rtol=1e-6, atol=1e-9)
    assert np.allclose(backend.to_host(w.grad), g8.T @ x8, rtol=1e-6, atol=1e-9)
    assert len(recipe.sites) == 1 and len(recipe.scales()) == 3


def test_delayed_recipe_numbers_sites_and_updates_between_steps():
    X = backend.from_host(np.full((2, 4), 2.0, np.float32))
    W = Tensor(backend.from_host(np.ones((3, 4), np.float32)), requires_grad=True)
    recipe = DelayedScaling(amax_history_len=4)
    for _ in range(2):
        with fp8_autocast(recipe):
            y = F.linear(F.linear(Tensor(X), W), Tensor(backend.from_host(np.ones((2, 3), np.float32))))
        y.sum().backward()
    assert len(recipe.sites) == 2
    assert recipe.scales()[:2] == [224.0, 448.0]      # x amax 2, W amax 1 -> 448 / amax
    with fp8_autocast(recipe):
        with pytest.raises(RuntimeError, match="same order"):
            F.linear(Tensor(X), W, Tensor(backend.from_host(np.zeros(3, np.float32))))


def test_recipe_arguments_are_checked():
    with pytest.raises(ValueError):
        DelayedScaling(amax_compute_algo="mean")
    with pytest.raises(ValueError):
        DelayedScaling(amax_history_len=0)
