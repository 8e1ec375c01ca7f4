"""The comparison suite: each check computes one thing on two backends from the same inputs.

    rounding       (bitwise)  fp16, bf16, fp8 e4m3fn saturating, fp8 e5m2, fp16 from
                              float64, bf16 stochastic, fp8 codes
    data movement  (bitwise)  reshape / permute / split / stack / slice / gather and
                              their gradients, embedding gather + scatter_add,
                              broadcast / all-gather / reduce-scatter / all-reduce on 2 ranks
    float math     (twice)    Linear, flash attention, GPT logits and gradients, AdamW

Inputs are drawn on the host with NumPy, so both backends start from the same
bits. Where a gradient adds repeated picks (scatter_add) the values are any
floats: the repeats are added in their order on every backend
(``backend.ordered_scatter``), so the sums must have NumPy's bits. The rules are
in compare.py; ``quick`` picks small sizes (a few seconds on a CPU).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from minidist import backend
from minidist.attention import flash_attention
from minidist.autograd import Tensor, concat, split, stack
from minidist.backend import xp
from minidist.comm.launch.world import launch
from minidist.nn import GPT, GPTConfig
from minidist.nn import functional as F
from minidist.optim import AdamW
from minidist.precision import BF16, FP8_E4M3FN, FP8_E5M2, FP16, encode, quantize
from minidist.selftest.compare import BITWISE, TWICE, Check


def _host(arr: Any) -> np.ndarray:
    """A host copy that later work on the backend cannot change."""
    return backend.to_host(arr).copy()


def _dyadic(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    """Multiples of 1/8 in [-8, 8): any sum of a few of them is exact in float32."""
    return (rng.integers(-64, 64, shape) / 8).astype("float32")


def _leaf(host: np.ndarray, dtype: Any = None) -> Tensor:
    return Tensor(backend.from_host(host if dtype is None else host.astype(dtype)),
                  requires_grad=True)


# -- rounding ---------------------------------------------------------------------------

def _values(quick: bool) -> dict:
    """float32 values across every range a format has: zeros, infinities, NaN,
    subnormals, overflow, and exact ties (halfway between two neighbours)."""
    rng = np.random.default_rng(1)
    n = 4096 if quick else 1 << 18
    spread = rng.choice([-1.0, 1.0], n) * 2.0 ** rng.uniform(-30, 20, n)
    ties = []
    for m in (2, 3, 7, 10):        # mantissa bits of e5m2, e4m3, bf16, fp16
        k = rng.integers(2 ** m, 2 ** (m + 1), n // 8)
        e = rng.integers(-20, 17, n // 8)
        ties.append((2 * k + 1) * 2.0 ** (e - m - 1))   # (k + 1/2) grid steps of binade e
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65520.0, 448.0, 464.0, 57344.0]
    x = np.concatenate([special, spread, *ties, -ties[0]]).astype("float32")
    return {"x": x}


def _values64(quick: bool) -> dict:
    x = _values(quick)["x"].astype("float64")
    finer = np.random.default_rng(2).uniform(-2 ** -30, 2 ** -30, x.shape)
    return {"x": x * (1 + finer)}   # bits below float32's: double rounding would show


def _rounding(fmt, **options):
    def compute(inputs: dict, dtype: Any) -> dict:
        x = backend.from_host(inputs["x"])
        return {"rounded": _host(quantize(x, fmt, **options))}
    return compute


def _stochastic(inputs: dict, dtype: Any) -> dict:
    x = backend.from_host(inputs["x"])
    return {"rounded": _host(quantize(x, BF16, rounding="stochastic",
                                      rng=backend.Generator(7)))}


def _codes(inputs: dict, dtype: Any) -> dict:
    return {"codes": _host(encode(backend.from_host(inputs["x"]), FP8_E4M3FN))}


# -- data movement ----------------------------------------------------------------------

def _shape_inputs(quick: bool) -> dict:
    rng = np.random.default_rng(3)
    return {"x": _dyadic(rng, (4, 6, 8)), "ids": np.array([3, 0, 3, 7, 1, 3]),
            "g": _dyadic(rng, (2, 3, 6))}


def _shape_ops(inputs: dict, dtype: Any) -> dict:
    """Views, copies and picks, forward and backward (repeated ids add in backward)."""
    x = _leaf(inputs["x"])                                         # (4, 6, 8)
    y = x.permute(2, 0, 1).reshape(8, 24)                          # (8, 24)
    a, b, c = split(y, 8, axis=1)                                  # 3 x (8, 8)
    z = stack([c, a[::-1]], axis=0)[:, 1:7:2]                      # (2, 3, 8)
    picked = z[:, :, backend.from_host(inputs["ids"])]             # (2, 3, 6)
    out = concat([picked, b[None, :3, :6] * 2], axis=0)[:2]        # (2, 3, 6)
    out.backward(backend.from_host(inputs["g"]))
    return {"out": _host(out.data), "x.grad": _host(x.grad)}


def _embedding_inputs(quick: bool) -> dict:
    rng = np.random.default_rng(4)
    vocab, batch, steps, dim = (11, 4, 16, 8) if quick else (50, 16, 256, 64)
    return {"weight": rng.standard_normal((vocab, dim)).astype("float32"),
            "ids": rng.integers(0, vocab, (batch, steps)),        # many repeats
            "g": rng.standard_normal((batch, steps, dim)).astype("float32")}


def _embedding(inputs: dict, dtype: Any) -> dict:
    weight = _leaf(inputs["weight"])
    out = F.embedding(backend.from_host(inputs["ids"]), weight)    # (B, T, C)
    out.backward(backend.from_host(inputs["g"]))
    return {"out": _host(out.data), "weight.grad": _host(weight.grad)}


def _collective_inputs(quick: bool) -> dict:
    n = 1000 if quick else 3 << 19   # the large case streams through several 1 MiB slots
    return {"x": np.random.default_rng(5).standard_normal((2, n)).astype("float32")}


def _collectives(inputs: dict, dtype: Any) -> dict:
    """A world of 2 processes on the active backend (ranks take the parent's)."""
    per_rank = launch(_collectives_on_rank, 2, inputs["x"])
    return {f"rank {r}: {name}": arr for r, res in enumerate(per_rank) for name, arr in res.items()}


def _collectives_on_rank(x: np.ndarray) -> dict:
    import minidist.distributed as dist
    r = dist.get_rank()
    mine = backend.from_host(x[r])                                 # (n,)
    n = mine.size
    out = {}
    b = mine.copy()
    dist.broadcast(b, src=1)
    out["broadcast"] = b
    gathered = xp.empty(2 * n, dtype=mine.dtype)
    dist.all_gather_into_tensor(gathered, mine)
    out["all_gather"] = gathered
    part = xp.empty(n // 2, dtype=mine.dtype)
    dist.reduce_scatter_tensor(part, mine[:n // 2 * 2])
    out["reduce_scatter"] = part
    for algorithm in ("ring", "allgather"):
        s = mine.copy()
        dist.all_reduce(s, algorithm=algorithm)
        out[f"all_reduce {algorithm}"] = s
    avg = mine.copy()
    dist.all_reduce(avg, op=dist.ReduceOp.AVG)
    out["all_reduce avg"] = avg
    return {name: _host(arr) for name, arr in out.items()}


# -- float math (the twice rule) --------------------------------------------------------

def _normal(seed: int, **shapes) -> dict:
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(shape).astype("float32") for name, shape in shapes.items()}


def _linear_inputs(quick: bool) -> dict:
    b, i, o = (8, 64, 48) if quick else (256, 1024, 768)
    return _normal(6, x=(b, i), w=(o, i), b=(o,), g=(b, o))


def _linear(inputs: dict, dtype: Any) -> dict:
    x, w, b = (_leaf(inputs[k], dtype) for k in ("x", "w", "b"))
    y = F.linear(x, w, b)                                          # (B, out)
    y.backward(backend.from_host(inputs["g"].astype(dtype)))
    return {"y": _host(y.data), "x.grad": _host(x.grad), "w.grad": _host(w.grad),
            "b.grad": _host(b.grad)}


def _attention_inputs(quick: bool) -> dict:
    shape = (1, 2, 64, 16) if quick else (2, 4, 512, 64)           # (B, heads, s, d)
    return _normal(7, q=shape, k=shape, v=shape, do=shape)


def _flash(inputs: dict, dtype: Any) -> dict:
    q, k, v = (_leaf(inputs[name], dtype) for name in ("q", "k", "v"))
    out = flash_attention(q, k, v, is_causal=True)                 # (B, heads, s, d)
    out.backward(backend.from_host(inputs["do"].astype(dtype)))
    return {"out": _host(out.data), "dq": _host(q.grad), "dk": _host(k.grad),
            "dv": _host(v.grad)}


def _gpt_config(quick: bool) -> GPTConfig:
    if quick:
        return GPTConfig(block_size=16, vocab_size=32, n_layer=2, n_head=2, n_embd=32)
    return GPTConfig(block_size=64, vocab_size=65, n_layer=2, n_head=4, n_embd=64)


def _gpt_inputs(quick: bool) -> dict:
    cfg = _gpt_config(quick)
    rng = np.random.default_rng(8)
    shape = (2 if quick else 8, cfg.block_size)
    return {"idx": rng.integers(0, cfg.vocab_size, shape),
            "targets": rng.integers(0, cfg.vocab_size, shape), "quick": quick}


def _gpt(inputs: dict, dtype: Any) -> dict:
    # float32 weights (drawn on the host, the same on every backend), cast up for the gold
    model = GPT(_gpt_config(inputs["quick"])).to_dtype(dtype)
    logits, loss = model(backend.from_host(inputs["idx"]), backend.from_host(inputs["targets"]))
    loss.backward()
    grads = {f"{name}.grad": _host(p.grad) for name, p in model.named_parameters()}
    return {"logits": _host(logits.data), "loss": _host(loss.data), **grads}


def _adamw_inputs(quick: bool) -> dict:
    n = 1000 if quick else 1 << 20
    return _normal(9, w=(n,), g1=(n,), g2=(n,), g3=(n,))


def _adamw(inputs: dict, dtype: Any) -> dict:
    """Three AdamW steps: elementwise, held to the twice rule rather than bit for bit,
    since a GPU compiler may contract or approximate float arithmetic."""
    w = _leaf(inputs["w"], dtype)
    opt = AdamW([w], lr=1e-2)
    for key in ("g1", "g2", "g3"):
        w.grad = backend.from_host(inputs[key].astype(dtype))
        opt.step()
    return {"w": _host(w.data)}


CHECKS = [
    Check("round fp16", BITWISE, _values, _rounding(FP16)),
    Check("round bf16", BITWISE, _values, _rounding(BF16)),
    Check("round fp8 e4m3fn saturating", BITWISE, _values, _rounding(FP8_E4M3FN, saturate=True)),
    Check("round fp8 e5m2", BITWISE, _values, _rounding(FP8_E5M2)),
    Check("round fp16 from float64", BITWISE, _values64, _rounding(FP16)),
    Check("round bf16 stochastic", BITWISE, _values, _stochastic),
    Check("encode fp8 e4m3fn codes", BITWISE, _values, _codes),
    Check("shape ops and gather, fwd+bwd", BITWISE, _shape_inputs, _shape_ops),
    Check("embedding gather + scatter_add", BITWISE, _embedding_inputs, _embedding),
    Check("collectives on 2 ranks", BITWISE, _collective_inputs, _collectives),
    Check("linear fwd+bwd", TWICE, _linear_inputs, _linear),
    Check("flash attention fwd+bwd", TWICE, _attention_inputs, _flash),
    Check("gpt logits and gradients", TWICE, _gpt_inputs, _gpt),
    Check("adamw 3 steps", TWICE, _adamw_inputs, _adamw),
]
