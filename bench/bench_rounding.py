"""quantize vs the reference casts' round trip, elements per second, in one run.

For each format, 10M float32 values (standard normal) are rounded two ways:

    minidist:   quantize(x, fmt)                           (stays float32)
    reference:  x.astype(ref).astype(float32)              (ml_dtypes; NumPy for fp16)

Repeats alternate between the two so machine noise hits both alike; the
median is reported, with the ratio minidist / reference (> 1: faster) and the
targets (>= 1x for the fp8 formats, >= 0.5x for bf16). The results are also
compared bit for bit.

    python bench/bench_rounding.py                  # 10M values, 7 repeats
    python bench/bench_rounding.py --n 1000000 --repeats 15
"""
import argparse
import statistics
import sys

import ml_dtypes
import numpy as np

from minidist import backend
from minidist.precision import quantize
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
print("all results bit-identical to the reference casts")
sys.exit(0 if ok else 1)
