"""A Linear whose three matmuls run on block-quantized operands: ``BlockScaling``.

y = x W^T needs three products per step, each contracting a different axis
(x2: (N, in), W: (out, in), g2 = dL/dy: (N, out)):

    forward   y2 = Q(x2, along in)   @ Q(W, along in)^T       contract over in
    dgrad     dx = Q(g2, along out)  @ Q(W, along out)        contract over out
    wgrad     dW = Q(g2, along N)^T  @ Q(x2, along N)         contract over N

A block scale must be constant along the axis a dot product runs over, so each
operand is quantized along *that product's* contraction axis: W once along
in (forward) and again along out (dgrad); x2 and g2 once along their feature
axis and again along the tokens. Every Q starts from the float32 tensor (as
Transformer Engine's rowwise / columnwise copies do), returns the dequantized
values (exactly the format's values times their scales), and the product
and its sums are float32: what a block-scaled tensor-core GEMM computes.

Recipes (``BlockScaling(recipe)``):

    "mxfp8"          MX, E4M3 elements, power-of-two scale per 32     (mx.py)
    "mxfp4"          MX, E2M1 elements, power-of-two scale per 32
    "nvfp4"          E2M1, E4M3 scale per 16, FP32 per tensor        (nvfp4.py)
    "fp8_blockwise"  DeepSeek-V3: E4M3, FP32 scale per 1x128 tile of x2 and g2,
                     per 128x128 block of W                           (blockwise_fp8.py)

NVFP4's training options (NVIDIA, "Pretraining LLMs with NVFP4", 2025), usable
with any recipe: ``stochastic_grad`` rounds the gradient g2 stochastically in
both backward products (unbiased: E[Q(g)] = g); ``hadamard`` multiplies the
wgrad operands, in groups of 16 tokens, by H = H16 diag(signs) / 4 (a random-
sign 16x16 Hadamard, orthogonal: (H g)^T (H x) = g^T x), which spreads an
outlier over its group before the quantization; ``keep_bf16`` lists weights
(e.g. the last blocks' parameters) whose Linear runs in BF16 instead.
Other matmul-like ops (attention's products) run in BF16 under this policy.

    with block_autocast(BlockScaling("nvfp4", stochastic_grad=True, hadamard=True)):
        _, loss = model(x, y)
    loss.backward()
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

from minidist import backend
from minidist.autograd.function import Function
from minidist.autograd.tensor import Tensor
from minidist.backend import xp
from minidist.precision.autocast import AmpPolicy, use_policy
from minidist.precision.block_recipes import block_recipe

RECIPES = ("mxfp8", "mxfp4", "nvfp4", "fp8_blockwise")
HADAMARD_SIZE = 16


def hadamard_matrix(signs: Any) -> Any:
    """H16 diag(signs) / 4: Sylvester's 16x16 Hadamard with random column signs, orthogonal."""
    h = xp.ones((1, 1), dtype="float32")
    while h.shape[0] < HADAMARD_SIZE:
        h = xp.concatenate([xp.concatenate([h, h], 1), xp.concatenate([h, -h], 1)], 0)
    return h * signs[None, :] / xp.float32(4)


def hadamard_rows(a: Any, h: Any) -> Any:
    """Apply h to every group of 16 rows of a (N, C); N zero-padded to a multiple of 16."""
    n = a.shape[0]
    pad = -n % HADAMARD_SIZE
    if pad:
        a = xp.concatenate([a, xp.zeros((pad,) + a.shape[1:], a.dtype)], 0)
    g = a.reshape(-1, HADAMARD_SIZE, a.shape[1])               # (N/16, 16, C)
    return xp.matmul(h, g).reshape(-1, a.shape[1])              # (N + pad, C)


class BlockScaling:
    """A block-scaled training recipe, the policy behind ``block_autocast``."""

    def __init__(self, recipe: str = "mxfp8", stochastic_grad: bool = False,
                 hadamard: bool = False, keep_bf16: Iterable[Tensor] = (), seed: int = 0):
        if recipe not in RECIPES:
            raise ValueError(f"unknown block-scaling recipe {recipe!r}; choose one of {RECIPES}")
        self.recipe, self.stochastic_grad, self.hadamard = recipe, stochastic_grad, hadamard
        self.keep_bf16 = {id(p) for p in keep_bf16}
        self.rng = backend.Generator(seed)
        signs = xp.where(backend.Generator(seed + 1).random((HADAMARD_SIZE,)) < 0.5, -1, 1)
        self.h = hadamard_matrix(signs.astype("float32"))
        self.bf16 = AmpPolicy("bf16")

    def quantize(self, a: Any, axis: int, role: str) -> Any:
        """a (2-D, float32) block-quantized along ``axis`` and dequantized: Q(a).

        ``role``: "x", "w" or "grad" (fp8_blockwise: W gets 128x128 blocks;
        ``stochastic_grad``: the gradient rounds stochastically).
        """
        rounding = "stochastic" if role == "grad" and self.stochastic_grad else "nearest"
        rng = self.rng if rounding == "stochastic" else None
        name = self.recipe
        if name == "fp8_blockwise":                 # W in 128 x 128 blocks, x and g in 1 x 128 tiles
            name = "fp8_blockwise_block" if role == "w" else "fp8_blockwise_tile"
        recipe = block_recipe(name)
        e, s, t = recipe.quantize(a, axis, rounding, rng)
        return recipe.dequantize(e, s, t, axis)

    def run(self, fn: Callable, args: tuple) -> Tensor:
        """The autocast policy: a Linear (x, W 2-D, bias) block-scaled, anything else BF16."""
        is_linear = (len(args) == 3 and isinstance(args[1], Tensor) and args[1].ndim == 2
                     and isinstance(args[0], Tensor))
        if not is_linear or id(args[1]) in self.keep_bf16:
            return self.bf16.run(fn, args)
        x, weight, bias = args
        if bias is None:
            return BlockLinear.apply(x, weight, recipe=self)
        return BlockLinear.apply(x, weight, bias, recipe=self)

    def begin_step(self) -> None:
        """Nothing to update between steps: every scale comes from the tensor at hand."""


class BlockLinear(Function):
    """y = x W^T + b on block-quantized operands (see the module docstring)."""

    splits_weight_grad = True

    @staticmethod
    def forward(ctx, x, weight, bias=None, recipe: BlockScaling = None):
        n_in = x.shape[-1]
        x2 = x.reshape(-1, n_in)                                 # (N, in)
        y = xp.matmul(recipe.quantize(x2, -1, "x"), recipe.quantize(weight, -1, "w").T)  # (N, out)
        if bias is not None:
            y += bias
        ctx.save_for_backward(x2, weight)
        ctx.x_shape, ctx.recipe = x.shape, recipe
        return y.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad):
        x2, weight = ctx.saved
        q = ctx.recipe.quantize
        g2 = grad.reshape(-1, weight.shape[0])                   # (N, out)
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:                              # contract over out
            gx = xp.matmul(q(g2, -1, "grad"), q(weight, 0, "w")).reshape(ctx.x_shape)
        if ctx.needs_input_grad[1]:                              # contract over N
            gt, xt = g2, x2
            if ctx.recipe.hadamard:
                gt, xt = hadamard_rows(g2, ctx.recipe.h), hadamard_rows(x2, ctx.recipe.h)
            gw = xp.matmul(q(gt, 0, "grad").T, q(xt, 0, "x"))     # (out, in)
        if len(ctx.needs_input_grad) == 2:
            return gx, gw
        if ctx.needs_input_grad[2]:
            gb = g2.sum(axis=0)
        return gx, gw, gb


class block_autocast(use_policy):
    """``with block_autocast(BlockScaling("mxfp8")):`` block-scaled Linears (see above)."""

    def __init__(self, recipe: BlockScaling, enabled: bool = True):
        super().__init__(recipe if enabled else None)
