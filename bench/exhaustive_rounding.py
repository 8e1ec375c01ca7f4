"""quantize vs ml_dtypes on every one of the 2^32 float32 bit patterns.

For each format, all 2^32 patterns are rounded by ``quantize`` and by the
ml_dtypes cast (``x.astype(ref).astype(float32)``) in chunks of 2^24, and the
mismatches are counted. The MX formats' two documented differences
(tests/precision/test_mx_elements.py: NaN stays NaN in FP6 / FP4; E8M0 of a
float32 subnormal in (2^-127, 1.5 * 2^-127) is 2^-127, the nearer power of two)
are counted apart, so "other" must be 0. Takes minutes per format on one core.

    python bench/exhaustive_rounding.py                        # the MX types
    python bench/exhaustive_rounding.py --formats e4m3fn e2m1fn
"""
import argparse
import sys
import time

import ml_dtypes
import numpy as np

from minidist import backend
from minidist.precision import get_format, quantize

REFS = {"fp6_e2m3fn": ml_dtypes.float6_e2m3fn, "fp6_e3m2fn": ml_dtypes.float6_e3m2fn,
        "fp4_e2m1fn": ml_dtypes.float4_e2m1fn, "fp8_e8m0fnu": ml_dtypes.float8_e8m0fnu,
        "fp8_e4m3fn": ml_dtypes.float8_e4m3fn, "fp8_e5m2": ml_dtypes.float8_e5m2,
        "bf16": ml_dtypes.bfloat16, "fp16": np.float16}
parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--formats", nargs="+", default=["e2m3fn", "e3m2fn", "e2m1fn", "e8m0fnu"])
parser.add_argument("--chunk-log2", type=int, default=24, choices=range(16, 33))
args = parser.parse_args()

CHUNK = 2 ** args.chunk_log2
failed = False
for name in args.formats:
    fmt = get_format(name)
    if fmt.name not in REFS:
        sys.exit(f"no ml_dtypes reference for {fmt.name}; choose from {sorted(REFS)}")
    start, other, documented = time.perf_counter(), 0, 0
    for lo in range(0, 2 ** 32, CHUNK):
        x = np.arange(lo, lo + CHUNK, dtype=np.uint64).astype(np.uint32).view(np.float32)
        got = backend.to_host(quantize(backend.from_host(x), fmt))
        with np.errstate(all="ignore"):
            want = x.astype(REFS[fmt.name]).astype(np.float32)
        bad = (got.view(np.uint32) != want.view(np.uint32)) & ~(np.isnan(got) & np.isnan(want))
        known = np.isnan(x) & np.isnan(got) if fmt.special == "finite" else np.zeros_like(bad)
        if fmt.special == "fnu":
            known = (x > np.float32(2.0 ** -127)) & (x < np.float32(1.5 * 2.0 ** -127))
        documented += int((bad & known).sum())
        other += int((bad & ~known).sum())
    failed |= other > 0
    print(f"{fmt.name:>12}: 2^32 inputs, {other} mismatches, {documented} documented "
          f"differences, {time.perf_counter() - start:.0f} s", flush=True)
sys.exit(1 if failed else 0)
