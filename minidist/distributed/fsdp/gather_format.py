"""FSDP's parameter all-gather in a low-precision format: cast before the gather, not after.

A unit's forward needs its parameters whole. Gathering them in float32 and rounding the
result to ``param_dtype`` moves 4 bytes an element to use 2; rounding each piece first
and sending its codes (precision/encoding.py) moves only what the format holds:

    param_dtype = "bfloat16" / "float16"    each piece's codes, uint16: 2 bytes an element
    param_dtype = an 8-bit format           its codes, uint8: 1 byte (rounded, unscaled)
    float8_all_gather = True                (torchtitan's enable_fsdp_float8_all_gather)
        rank r's piece P_r of each parameter scaled by s_r = 2^floor(log2(448 / amax|P_r|))
        (a power of two: scaling is exact), rounded to e4m3fn (saturating) and sent as
        1-byte codes, its scale beside them (4 bytes a parameter and rank):
            W = [decode(codes_0) / s_0; ...; decode(codes_{N-1}) / s_{N-1}]  (row blocks)

Rounding one element does not depend on the others, so rounding before the gather gives
the values rounding after it gave, bit for bit; only the bytes on the wire change. The
float8 gather equals its plain math exactly: quantise each piece as above, then gather.
Tests: tests/distributed/test_fsdp_gather_format.py.
"""
from __future__ import annotations

import math
from typing import Any

from minidist.backend import to_host, xp
from minidist.comm.group import ProcessGroup
from minidist.distributed.fsdp.reduce_format import emulated_format
from minidist.distributed.tensor import _collectives as coll
from minidist.distributed.tensor.placement_types import chunk_sizes
from minidist.precision.encoding import decode, encode

E4M3 = "float8_e4m3fn"
E4M3_MAX = 448.0         # the largest finite e4m3fn value


def float8_scale(piece: Any) -> float:
    """s = 2^floor(log2(448 / amax|piece|)): the piece's largest magnitude lands in
    [224, 448]; 1 for a piece of zeros (or no rows)."""
    amax = float(to_host(xp.abs(piece).max())) if piece.size else 0.0
    if amax == 0.0 or not math.isfinite(amax):
        return 1.0
    return 2.0 ** math.floor(math.log2(E4M3_MAX / amax))


class EncodedGather:
    """An all-gather of codes (all_gather_dim0): ``wait()`` gives the decoded parameters,
    in the pieces' dtype."""

    def __init__(self, inner: Any, fmt: Any, dtypes: list, scaled: int, n: int):
        self.inner, self.fmt, self.dtypes = inner, fmt, dtypes
        self.scaled, self.n = scaled, n     # scaled: how many parameters carry scales

    def wait(self) -> list:
        fulls = self.inner.wait() if isinstance(self.inner, coll.GatheredDim0) else self.inner
        if not self.scaled:
            return decode_as_one(fulls, self.fmt, self.dtypes)
        codes, raw = fulls[:-1], fulls[-1]
        scales = xp.ascontiguousarray(raw).view(xp.float32).reshape(self.n, self.scaled)
        out = decode_as_one(codes, self.fmt, self.dtypes)
        for i, (w, d) in enumerate(zip(out, self.dtypes)):
            c = chunk_sizes(w.shape[0], self.n)[0]
            for r in range(self.n):               # rank r's rows, unscaled by its s_r
                w[r * c:(r + 1) * c] /= scales[r, i].astype(d)
        return out


def gather_pieces(pieces: list, lengths: list[int], group: ProcessGroup, policy: Any,
                  async_op: bool) -> Any:
    """``coll.all_gather_dim0`` of the pieces, in the policy's gather format (module
    docstring): the whole parameters, or (``async_op``) something to ``wait()`` on."""
    fmt = emulated_format(policy.param_dtype)
    if policy.float8_all_gather:
        fmt = emulated_format(E4M3)
    if fmt is None:
        return coll.all_gather_dim0(pieces, lengths, group, async_op)
    dtypes = [p.dtype for p in pieces]
    if policy.float8_all_gather:
        scales = [float8_scale(p) for p in pieces]
        codes = encode_as_one([p * s for p, s in zip(pieces, scales)], fmt, saturate=True)
        raw = xp.asarray(scales, dtype=xp.float32).view(xp.uint8)     # (4 P,) bytes
        codes.append(raw)
        lengths = list(lengths) + [group.size * raw.size]              # every rank 4 P
    else:
        codes = encode_as_one(pieces, fmt)
    inner = coll.all_gather_dim0(codes, lengths, group, async_op)
    gathered = EncodedGather(inner, fmt, dtypes, len(pieces) if policy.float8_all_gather
                             else 0, group.size)
    return gathered if async_op else gathered.wait()


def encode_as_one(pieces: list, fmt: Any, saturate: bool = False) -> list:
    """``[encode(p, fmt, saturate) for p in pieces]``, by one ``encode`` of the pieces
    side by side (a unit holds a dozen parameters, some of a few hundred elements: one
    call instead of a dozen); each piece's codes a view of the one result."""
    if len({str(p.dtype) for p in pieces}) != 1:         # mixed dtypes: one call each
        return [encode(p, fmt, saturate=saturate) for p in pieces]
    flat = encode(xp.concatenate([p.reshape(-1) for p in pieces]), fmt, saturate=saturate)
    return split_like(flat, pieces)


def decode_as_one(fulls: list, fmt: Any, dtypes: list) -> list:
    """``[decode(f, fmt, d) for f, d in zip(fulls, dtypes)]`` by one ``decode`` of the
    codes side by side; each result a view of the one decoded array."""
    if len({str(d) for d in dtypes}) != 1:
        return [decode(f, fmt, str(d)) for f, d in zip(fulls, dtypes)]
    flat = decode(xp.concatenate([f.reshape(-1) for f in fulls]), fmt, str(dtypes[0]))
    return split_like(flat, fulls)


def split_like(flat: Any, arrays: list) -> list:
    """Views of ``flat`` cut into the sizes and shapes of ``arrays``, in order."""
    out, start = [], 0
    for a in arrays:
        out.append(flat[start:start + a.size].reshape(a.shape))
        start += a.size
    return out
