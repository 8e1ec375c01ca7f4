"""The fused Adam / AdamW kernel (CuPy) gives the chain's bits: adam.py's fourteen
array operations and optim/fused_adam.py's one launch, on the same arrays, over
steps, dtypes, weight decay on and off, L2 and decoupled. On the CPU backends the
chain runs and the kernel never does."""
import numpy as np
import pytest

from minidist import backend
from minidist.optim import fused_adam
from minidist.optim.adam import adam_update, adamw_update

on_gpu = pytest.mark.skipif(backend.get_backend() != "cupy",
                            reason="the fused kernel runs on CuPy only (a GPU)")


def run(update, dtype, fused, weight_decay, steps=5, seed=0):
    rng = np.random.default_rng(seed)
    n = 4099                                          # not a multiple of a block
    param = backend.from_host(rng.standard_normal(n).astype(dtype))
    m, v = backend.from_host(np.zeros(n, dtype)), backend.from_host(np.zeros(n, dtype))
    grads = [backend.from_host((rng.standard_normal(n) * 10.0 ** rng.integers(-30, 3, n))
                               .astype(dtype)) for _ in range(steps)]
    fused_adam.ENABLED = fused
    try:
        for t, g in enumerate(grads, start=1):
            update(param, g, m, v, t, lr=1e-3, eps=1e-8, weight_decay=weight_decay)
    finally:
        fused_adam.ENABLED = True
    return [backend.to_host(a) for a in (param, m, v)]


@on_gpu
@pytest.mark.parametrize("update", [adam_update, adamw_update])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_the_fused_kernel_gives_the_chains_bits(update, dtype, weight_decay):
    for got, want in zip(run(update, dtype, True, weight_decay),
                         run(update, dtype, False, weight_decay)):
        np.testing.assert_array_equal(got.view(f"u{got.itemsize}"), want.view(f"u{want.itemsize}"))


def test_the_kernel_runs_only_on_cupy_with_alike_contiguous_arrays():
    a = backend.from_host(np.zeros((4, 4), "float32"))
    assert fused_adam.applies(a, a) == (backend.get_backend() == "cupy")
    assert not fused_adam.applies(a, a.T[::2])                  # strided: the chain
    assert not fused_adam.applies(a, backend.from_host(np.zeros((4, 4), "float64")))
