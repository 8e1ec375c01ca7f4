"""Flash attention's memory with grouped-query heads: K/V of n_kv_head heads, not n_head.

One causal forward + backward of flash attention (minidist.attention) on q of n_head heads
and k, v of n_kv_head heads, against the same attention with k, v repeated to n_head heads
first (what an implementation without grouped heads does: Hugging Face's eager
``repeat_kv``). Peak bytes allocated during the call are measured
(``backend.MemoryTracker``), inputs excluded; the K/V bytes of each layout are printed
beside them, with the ratio of the two peaks.

    python bench/bench_gqa_memory.py                      # 32 heads, 8 kv heads, T 2048
    python bench/bench_gqa_memory.py --n-kv-head 1        # multi-query
"""
import argparse

from _args import positive_int

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--n-head", type=positive_int, default=32)
parser.add_argument("--n-kv-head", type=positive_int, default=8)
parser.add_argument("--length", type=positive_int, default=2048)
parser.add_argument("--head-dim", type=positive_int, default=64)
parser.add_argument("--block", type=positive_int, default=256, help="flash tile size")
args = parser.parse_args()
if args.n_head % args.n_kv_head:
    parser.error(f"--n-kv-head ({args.n_kv_head}) must divide --n-head ({args.n_head})")

import numpy as np  # noqa: E402

from minidist import backend  # noqa: E402
from minidist.attention import flash_attention  # noqa: E402
from minidist.autograd import Tensor  # noqa: E402

h, kv, T, E = args.n_head, args.n_kv_head, args.length, args.head_dim
rng = np.random.default_rng(0)
q = backend.from_host(rng.standard_normal((1, h, T, E), dtype=np.float32))
k = backend.from_host(rng.standard_normal((1, kv, T, E), dtype=np.float32))
v = backend.from_host(rng.standard_normal((1, kv, T, E), dtype=np.float32))
do = backend.from_host(rng.standard_normal((1, h, T, E), dtype=np.float32))


def peak(repeat: bool) -> int:
    with backend.MemoryTracker() as mem:
        keys, values = k, v
        if repeat:                                   # (1, kv, T, E) -> (1, h, T, E)
            keys = backend.xp.repeat(k, h // kv, axis=1)
            values = backend.xp.repeat(v, h // kv, axis=1)
        qt, kt, vt = (Tensor(a, requires_grad=True) for a in (q, keys, values))
        out = flash_attention(qt, kt, vt, is_causal=True, enable_gqa=not repeat,
                              block_q=args.block, block_k=args.block)
        out.backward(do)
    return mem.peak


grouped, repeated = peak(False), peak(True)
mib = 2.0 ** 20
kv_bytes = 2 * T * E * 4                             # K and V of one head, float32
print(f"flash attention, causal, forward + backward: {h} query heads, T {T}, head dim {E}, "
      f"float32, tiles {args.block}")
print(f"{'K/V layout':<28} {'K/V MiB':>8} {'peak MiB':>9}")
print(f"{f'{kv} kv heads (enable_gqa)':<28} {kv * kv_bytes / mib:8.1f} {grouped / mib:9.1f}")
print(f"{f'repeated to {h} heads':<28} {h * kv_bytes / mib:8.1f} {repeated / mib:9.1f}")
print(f"peak grouped / repeated: {grouped / repeated:.2f}x; saved "
      f"{(repeated - grouped) / mib:.1f} MiB (K/V and their gradients at {h} - {kv} heads: "
      f"{2 * (h - kv) * kv_bytes / mib:.1f} MiB)")
