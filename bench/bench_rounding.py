"""quantize vs the reference casts' round trip, elements per second, in one run.

For each format, 10M float32 values (standard normal) are rounded two ways:

    minidist:   quantize(x, fmt)                           (stays float32)
    reference:  x.astype(ref).astype(float32)              (ml_dtypes; NumPy for fp16)

Repeats alternate between the two so machine noise hits both alike; the
median is reported, with the ratio minidist / reference (> 1: faster) and the
targets (>= 1x for the fp8 formats, >= 0.5x for bf16). The results are also
compared bit for bit.

Block scaling, on the same values as (N / 1024, 1024), blocks along the last axis:

    minidist:   mx_quantize(x, fmt) / nvfp4_quantize(x)      (elements and scales)
    reference:  the scales in NumPy (amax per block, frexp / division), the
                elements by the ml_dtypes cast of x / scale   (target >= 1x)

    python bench/bench_rounding.py                  # 10M values, 7 repeats
    python bench/bench_rounding.py --n 1000000 --repeats 15
"""
import argparse
import statistics
import sys

import ml_dtypes
import numpy as np

from minidist import backend
from minidist.precision import mx_quantize, nvfp4_quantize, quantize
from _args import positive_int

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--n", type=positive_int, default=10_000_000, help="float32 values")
parser.add_argument("--repeats", type=positive_int, default=7)
args = parser.parse_args()

CASES = [  # format, reference dtype, target ratio (None: no target)
    ("bf16", ml_dtypes.bfloat16, 0.5),
    ("fp16", np.float16, None),
    ("e4m3fn", ml_dtypes.float8_e4m3fn, 1.0),
    ("e5m2", ml_dtypes.float8_e5m2, 1.0),
]

host = np.random.default_rng(0).standard_normal(args.n).astype(np.float32)
x = backend.from_host(host)
print(f"{args.n:,} float32 values, backend {backend.get_backend()}, "
      f"median of {args.repeats} repeats; reference casts run on the host (NumPy)")
print(f"{'format':>8} {'minidist':>14} {'reference':>14} {'ratio':>7}  target")
ok = True
for name, ref, target in CASES:
    ours, theirs = [], []
    for _ in range(args.repeats):
        with backend.Timer() as t:
            got = quantize(x, name)
        ours.append(t.seconds)
        with backend.Timer() as t:
            want = host.astype(ref).astype(np.float32)
        theirs.append(t.seconds)
    if not np.array_equal(backend.to_host(got).view(np.uint32), want.view(np.uint32)):
        sys.exit(f"{name}: quantize disagrees with the reference cast")
    a, b = args.n / statistics.median(ours), args.n / statistics.median(theirs)
    verdict = "" if target is None else (f">= {target}x " + ("met" if a / b >= target else "MISSED"))
    ok &= target is None or a / b >= target
    print(f"{name:>8} {a / 1e6:10.0f} M/s {b / 1e6:10.0f} M/s {a / b:6.2f}x  {verdict}")


def mx_reference(x, ref, emax, top):
    """OCP MX in NumPy + ml_dtypes: X = 2^(floor(log2 amax) - emax), P = cast(V / X)."""
    b = x.reshape(-1, 32)
    amax = np.abs(b).max(1)
    e = np.maximum(np.frexp(amax)[1] - 1 - emax, -127)
    inverse = np.ldexp(np.float32(1), -e).astype(np.float32)
    p = np.clip(b * inverse[:, None], -top, top).astype(ref).astype(np.float32)
    return p.reshape(x.shape), np.ldexp(np.float32(1), e).astype(np.float32)


def nvfp4_reference(x):
    """NVFP4 in NumPy + ml_dtypes: E4M3 block scales under an FP32 tensor scale."""
    b = x.reshape(-1, 16)
    amax = np.abs(b).max(1)
    s_t = np.float32(np.abs(x).max() / np.float32(2688))
    s_b = np.clip((amax / np.float32(6)) / s_t, np.float32(2.0 ** -9), np.float32(448))
    s_b = s_b.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    p = (b * ((np.float32(1) / s_t) / s_b)[:, None]).astype(ml_dtypes.float4_e2m1fn)
    return p.astype(np.float32).reshape(x.shape), s_b


BLOCK_CASES = [  # name, ours, reference, target
    ("mxfp8", lambda a: mx_quantize(a, "e4m3fn"),
     lambda h: mx_reference(h, ml_dtypes.float8_e4m3fn, 8, 448.0), 1.0),
    ("mxfp4", lambda a: mx_quantize(a, "e2m1fn"),
     lambda h: mx_reference(h, ml_dtypes.float4_e2m1fn, 2, 6.0), 1.0),
    ("nvfp4", lambda a: nvfp4_quantize(a)[:2], nvfp4_reference, 1.0),
]
rows = args.n // 1024
if rows:
    block_host = host[: rows * 1024].reshape(rows, 1024)
    block_x = backend.from_host(block_host)
    for name, ours_fn, ref_fn, target in BLOCK_CASES:
        ours, theirs = [], []
        for _ in range(args.repeats):
            with backend.Timer() as t:
                got = ours_fn(block_x)
            ours.append(t.seconds)
            with backend.Timer() as t:
                want = ref_fn(block_host)
            theirs.append(t.seconds)
        same = all(np.array_equal(backend.to_host(g).ravel().view(np.uint32),
                                  w.ravel().view(np.uint32)) for g, w in zip(got, want))
        if not same:
            sys.exit(f"{name}: block quantization disagrees with the NumPy + ml_dtypes reference")
        a, b = block_host.size / statistics.median(ours), block_host.size / statistics.median(theirs)
        ok &= a / b >= target
        print(f"{name:>8} {a / 1e6:10.0f} M/s {b / 1e6:10.0f} M/s {a / b:6.2f}x  "
              f">= {target}x " + ("met" if a / b >= target else "MISSED"))
print("all results bit-identical to the reference casts")
sys.exit(0 if ok else 1)
