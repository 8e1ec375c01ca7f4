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

What it costs the cores, kept small: the pieces are encoded side by side in one pass
(float8: their scales from one transfer of every piece's amax, the product with the
scales one multiply), the gathered (N, W) buffer of codes is decoded in one pass
(bfloat16 to float32 is a shift: a code is a float32's top half) and unscaled by one
division by the scales laid out beside it (one row a rank), then cut into parameters;
the scales travel in the same all-gather as the codes, no collective of their own.
fully_shard encodes a unit's pieces once a step: its forward's codes serve the
backward's gather again (state.py), as the parameters do not change in between.
Tests: tests/distributed/test_fsdp_gather_format.py.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

from minidist.backend import to_host, xp
from minidist.comm.group import ProcessGroup
from minidist.distributed.fsdp.reduce_format import emulated_format
from minidist.distributed.tensor import _collectives as coll
from minidist.precision.encoding import decode, encode

E4M3 = "float8_e4m3fn"
E4M3_MAX = 448.0         # the largest finite e4m3fn value


def float8_scales(pieces: list) -> list[float]:
    """s = 2^floor(log2(448 / amax|piece|)) for each piece: its largest magnitude lands in
    [224, 448]; 1 for a piece of zeros (or no rows). Every amax comes to the host at once."""
    amaxes = [xp.abs(p).max() if p.size else xp.zeros((), dtype=p.dtype) for p in pieces]
    scales = []
    for amax in to_host(xp.stack(amaxes).astype(xp.float64)).tolist() if pieces else []:
        if amax == 0.0 or not math.isfinite(amax):
            scales.append(1.0)
        else:
            scales.append(2.0 ** math.floor(math.log2(E4M3_MAX / amax)))
    return scales


class EncodedPieces(NamedTuple):
    """A unit's pieces in the gather format, ready to all-gather (``encode_pieces``)."""
    codes: list          # each piece's codes; float8: then the scales' bytes, (4 P,) uint8
    lengths: list[int]   # each whole parameter's rows; float8: then the N ranks' 4 P bytes
    fmt: Any             # the emulated format of the codes
    dtypes: list         # the pieces' dtypes, which the gather gives back
    scaled: int          # float8: P, the parameters that carry a scale; 0 otherwise


def encodes(policy: Any) -> bool:
    """Whether the policy gathers the pieces in a format of their own (module docstring)."""
    return emulated_format(E4M3 if policy.float8_all_gather else policy.param_dtype) is not None


def encode_pieces(pieces: list, lengths: list[int], n: int, policy: Any) -> EncodedPieces | None:
    """The pieces in the policy's gather format (module docstring), encoded side by side in
    one pass; None where the policy gathers the pieces as they are."""
    if not encodes(policy):
        return None
    fmt = emulated_format(E4M3 if policy.float8_all_gather else policy.param_dtype)
    flat = xp.concatenate([p.reshape(-1) for p in pieces])              # (sum sizes,)
    if not policy.float8_all_gather:
        return EncodedPieces(split_like(encode(flat, fmt), pieces), list(lengths), fmt,
                             [p.dtype for p in pieces], 0)
    scales = float8_scales(pieces)
    per_element = xp.repeat(xp.asarray(scales, dtype=flat.dtype), [p.size for p in pieces])
    codes = split_like(encode(flat * per_element, fmt, saturate=True), pieces)
    raw = xp.asarray(scales, dtype=xp.float32).view(xp.uint8)          # (4 P,) bytes
    return EncodedPieces(codes + [raw], list(lengths) + [n * raw.size], fmt,
                         [p.dtype for p in pieces], len(pieces))


class EncodedGather:
    """An all-gather of codes (``gather_encoded``): ``wait()`` gives the decoded
    parameters, in the pieces' dtypes."""

    def __init__(self, inner: coll.GatheredDim0, encoded: EncodedPieces):
        self.inner, self.encoded = inner, encoded

    def wait(self) -> list:
        enc = self.encoded
        buf = self.inner.buffer()                                      # (N, W) codes
        wide = "float64" if any(str(d) == "float64" for d in enc.dtypes) else "float32"
        values = decode(buf, enc.fmt, wide)                            # (N, W), one pass
        if enc.scaled:
            widths = [width for _, width, _ in self.inner.cut[:enc.scaled]]
            w = sum(widths)                                            # the codes; scales after
            scales = xp.ascontiguousarray(buf[:, w:]).view(xp.float32)  # (N, P): s_r of each
            values[:, :w] /= xp.repeat(scales.astype(wide), widths, axis=1)
        fulls = self.inner.cut_apart(values)[:len(enc.dtypes)]
        return [f if str(f.dtype) == str(d) else f.astype(d) for f, d in zip(fulls, enc.dtypes)]


def gather_encoded(encoded: EncodedPieces, group: ProcessGroup, async_op: bool) -> Any:
    """All-gather the codes by one ``all_gather_dim0`` (the scales with them): the whole
    parameters, or (``async_op``) something to ``wait()`` on."""
    inner = coll.start_all_gather_dim0(encoded.codes, encoded.lengths, group, async_op)
    gathered = EncodedGather(inner, encoded)
    return gathered if async_op else gathered.wait()


def gather_pieces(pieces: list, lengths: list[int], group: ProcessGroup, policy: Any,
                  async_op: bool) -> Any:
    """``coll.all_gather_dim0`` of the pieces, in the policy's gather format (module
    docstring): the whole parameters, or (``async_op``) something to ``wait()`` on."""
    encoded = encode_pieces(pieces, lengths, group.size, policy)
    if encoded is None:
        return coll.all_gather_dim0(pieces, lengths, group, async_op)
    return gather_encoded(encoded, group, async_op)


def split_like(flat: Any, arrays: list) -> list:
    """Views of ``flat`` cut into the sizes and shapes of ``arrays``, in order."""
    out, start = [], 0
    for a in arrays:
        out.append(flat[start:start + a.size].reshape(a.shape))
        start += a.size
    return out
