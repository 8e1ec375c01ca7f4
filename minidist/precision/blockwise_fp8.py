"""DeepSeek-V3's fine-grained FP8: an FP32 scale per 1x128 tile or 128x128 block.

Per-tensor FP8 scaling lets one outlier shrink every other value toward E4M3's
subnormals. DeepSeek-V3 (section 3.3.2) scales small groups instead:
activations per 1x128 tile (one token, 128 channels), weights per 128x128
block (128 output x 128 input channels). For each group G:

    s   = amax(G) / 448                     FP32 (E4M3's max is 448)
    P_i = e4m3(V_i / s)                     nearest even, saturating
    V_i ~= P_i * s                          (blockwise_fp8_dequantize)

so every group's largest value maps to 448. Both shapes cut the last two
axes: (rows, cols) with a tile of (1, 128) or a block of (128, 128); scales
have shape (ceil(rows / b0), ceil(cols / b1)) (leading axes kept).

Edge cases, as decided here:
- an all-zero group gets s = 1 (elements 0); a group holding NaN or inf gets
  s = NaN and elements 0.
- lengths not a multiple of the group: padded with zeros (which change no amax).
- group shapes other than (1, 128) and (128, 128) are refused.
"""
from __future__ import annotations

from typing import Any

from minidist.backend import xp
from minidist.precision.block_layout import block_amax, check_float_input, check_scale_shape
from minidist.precision.formats import FP8_E4M3FN
from minidist.precision.rounding import quantize, quiet

TILE = (1, 128)       # activations: one row, 128 columns
BLOCK = (128, 128)    # weights
BLOCK_SHAPES = (TILE, BLOCK)


def _check(x: Any, block: tuple, what: str) -> tuple[int, int]:
    check_float_input(x, what)
    block = tuple(block)
    if block not in BLOCK_SHAPES:
        raise ValueError(f"{what}: block {block} is not one DeepSeek-V3 uses; choose "
                         f"{TILE} (activation tiles) or {BLOCK} (weight blocks)")
    if x.ndim < 2:
        raise ValueError(f"{what} cuts the last two axes and needs at least 2 dims, got "
                         f"shape {tuple(x.shape)}; reshape to (1, n) for one row")
    return block


def _to_groups(x: Any, block: tuple) -> Any:
    """(..., R, C) -> (..., R/b0, C/b1, b0 * b1), zero-padded to whole groups."""
    b0, b1 = block
    r, c = x.shape[-2:]
    pad = [(0, 0)] * (x.ndim - 2) + [(0, -r % b0), (0, -c % b1)]
    if pad[-1][1] or pad[-2][1]:
        x = xp.pad(x, pad)
    lead = x.shape[:-2]
    g = x.reshape(lead + (x.shape[-2] // b0, b0, x.shape[-1] // b1, b1))  # (..., nr, b0, nc, b1)
    g = xp.swapaxes(g, -3, -2)                                             # (..., nr, nc, b0, b1)
    return g.reshape(g.shape[:-2] + (b0 * b1,))                            # (..., nr, nc, b0*b1)


def _from_groups(g: Any, block: tuple, shape: tuple) -> Any:
    b0, b1 = block
    nr, nc = g.shape[-3:-1]
    g = g.reshape(g.shape[:-1] + (b0, b1))                                 # (..., nr, nc, b0, b1)
    g = xp.swapaxes(g, -3, -2)                                             # (..., nr, b0, nc, b1)
    full = g.reshape(g.shape[:-4] + (nr * b0, nc * b1))
    return xp.ascontiguousarray(full[..., :shape[-2], :shape[-1]])


def blockwise_fp8_quantize(x: Any, block: tuple = TILE) -> tuple[Any, Any]:
    """(elements, scales): E4M3 values in x's dtype, FP32 scales (..., R/b0, C/b1)."""
    block = _check(x, block, "blockwise_fp8_quantize")
    groups = _to_groups(x, block)                                # (..., nr, nc, G)
    with quiet():
        amax = block_amax(groups).astype("float32")                # (..., nr, nc)
        bad = ~xp.isfinite(amax)
        s = amax / xp.float32(FP8_E4M3FN.max)
        s[(amax == 0) | bad] = 1
        scaled = groups / s[..., None].astype(x.dtype)
        scaled[bad] = 0
    elements = quantize(scaled, FP8_E4M3FN, saturate=True)
    s[bad] = xp.nan
    return _from_groups(elements, block, x.shape), s


def blockwise_fp8_dequantize(elements: Any, scales: Any, block: tuple = TILE) -> Any:
    """P * s per group, in elements' dtype."""
    block = _check(elements, block, "blockwise_fp8_dequantize")
    r, c = elements.shape[-2:]
    want = elements.shape[:-2] + (-(-r // block[0]), -(-c // block[1]))
    check_scale_shape(scales, elements, want, f"{block} groups")
    groups = _to_groups(elements, block)
    with quiet():
        out = groups * scales[..., None].astype(elements.dtype)
    return _from_groups(out, block, elements.shape)
