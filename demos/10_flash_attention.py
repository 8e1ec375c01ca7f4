"""Demo 10: flash attention, the online softmax by hand, then memory and error at size.

Part 1 follows one row of attention scores through the online softmax, one tile
at a time, printing the running max m, the correction exp(m_old - m_new) applied
to the old sum, the running sum l and the running output, beside the plain
softmax of the whole row. Part 2 runs naive and flash attention (forward and
backward, minidist/attention) at larger sequence lengths and prints the peak
extra memory of each and the error of each against a float64 result.

    python demos/10_flash_attention.py                     # s up to 1024, ~5 s on 2 cores
    python demos/10_flash_attention.py --full              # s up to 2048, ~20 s
    python demos/10_flash_attention.py --lengths 512 1024 2048 4096 --causal

The checks: the online softmax equals the plain one, flash equals naive in
float64 (1e-10, output and gradients), and flash holds less memory. With
--figure PATH (no figure without it) it saves part 2's memory vs sequence
length as a PNG (needs matplotlib):

    python demos/10_flash_attention.py --figure /tmp/attention.png
"""
import argparse
import sys

import numpy as np

from minidist import backend
from minidist.attention import flash_attention, naive_attention
from minidist.autograd import Tensor
from _args import non_negative_int, positive_int, quick_or_full

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--row", type=non_negative_int, default=8,
                    help="scores in the tiny example row")
parser.add_argument("--tile", type=positive_int, default=3, help="tile width in the tiny example")
parser.add_argument("--lengths", type=positive_int, nargs="+",
                    help="sequence lengths of part 2 (default 256 512 1024; --full adds 2048)")
parser.add_argument("--heads", type=positive_int, default=4)
parser.add_argument("--d", type=positive_int, default=64, help="head dim")
parser.add_argument("--block", type=positive_int, default=128, help="flash tile size (rows = cols)")
parser.add_argument("--causal", action="store_true")
parser.add_argument("--seed", type=non_negative_int, default=0)
parser.add_argument("--figure", metavar="PATH",
                    help="save part 2's memory as a PNG (default: none)")
parser.add_argument("--full", action="store_true", help="part 2 up to s = 2048")
args = parser.parse_args()
quick_or_full(args, quick=dict(lengths=[256, 512, 1024]), full=dict(lengths=[256, 512, 1024, 2048]))
rng = np.random.default_rng(args.seed)
ok = True

# -- part 1: the online softmax, tile by tile ----------------------------------------------
s = np.round(rng.normal(0, 2, args.row), 2)        # one row of scores  S[i, :]
v = np.round(rng.normal(0, 1, args.row), 2)        # one value per key  V[:, 0]
print(f"scores s = {s}\nvalues v = {v}\n")
print("online softmax: m_new = max(m, max s_tile), l = exp(m - m_new) l + sum exp(s_tile - m_new)")
print(f"{'tile':>10} | {'m':>6} {'m_new':>6} {'exp(m-m_new)':>12} {'l':>8} {'out = acc / l':>13}")
m, l, acc = -np.inf, 0.0, 0.0
for j0 in range(0, args.row, args.tile):
    tile = s[j0:j0 + args.tile]
    m_new = max(m, tile.max())
    correction = np.exp(m - m_new)                  # rescales what was summed under the old max
    p = np.exp(tile - m_new)
    l = correction * l + p.sum()
    acc = correction * acc + p @ v[j0:j0 + args.tile]
    print(f"{f'[{j0}:{j0 + len(tile)})':>10} | {m:>6.2f} {m_new:>6.2f} {correction:>12.4f} "
          f"{l:>8.4f} {acc / l:>13.6f}")
    m = m_new
plain = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
online = np.exp(s - m) / l                          # what flash's backward recomputes: exp(s - L)
print(f"\nlogsumexp L = m + log l = {m + np.log(l):.6f}   (plain: "
      f"{np.log(np.exp(s).sum()):.6f})")
print(f"{'softmax (plain)':>16}: {np.array2string(plain, precision=4)}")
print(f"{'exp(s - L)':>16}: {np.array2string(online, precision=4)}")
err = max(np.abs(plain - online).max(), abs(acc / l - plain @ v))
ok &= err < 1e-12
print(f"check: max |online - plain softmax| = {err:.1e}  (tolerance 1e-12): "
      f"{'ok' if err < 1e-12 else 'FAILED'}\n")


# -- part 2: memory and error at larger sizes ------------------------------------------------
def fwd_bwd(fn, arrays, **kw):
    """Forward + backward; returns host (O, dq, dk, dv) and the peak extra bytes."""
    with backend.MemoryTracker() as mem:
        q, k, v = (Tensor(a, requires_grad=True) for a in arrays[:3])
        out = fn(q, k, v, is_causal=args.causal, **kw)
        out.backward(arrays[3])
        results = [backend.to_host(t) for t in (out.data, q.grad, k.grad, v.grad)]
    return results, mem.peak


MiB = 2.0**20
print(f"heads {args.heads}, d = {args.d}, flash tiles {args.block} x {args.block}, "
      f"causal={args.causal}; forward + backward")
print(f"{'s':>6} | {'naive MiB':>9} {'flash MiB':>9} {'ratio':>6} | {'|flash-naive| f64':>17} | "
      f"{'f32 err naive':>13} {'f32 err flash':>13}")
memory = []
for length in args.lengths:
    host = [rng.standard_normal((1, args.heads, length, args.d)) for _ in range(4)]
    f64 = [backend.from_host(a) for a in host]
    f32 = [backend.from_host(a.astype("float32")) for a in host]
    naive64, mem_naive = fwd_bwd(naive_attention, f64)
    flash64, mem_flash = fwd_bwd(flash_attention, f64, block_q=args.block, block_k=args.block)
    diff = max(np.abs(a - b).max() for a, b in zip(flash64, naive64))
    # float32 errors against float64 on the same (float32-representable) inputs
    gold = fwd_bwd(naive_attention, [backend.from_host(a.astype("float32").astype("float64"))
                                     for a in host])[0]
    naive32 = fwd_bwd(naive_attention, f32)[0]
    flash32 = fwd_bwd(flash_attention, f32, block_q=args.block, block_k=args.block)[0]
    err_naive = max(np.abs(a - g).max() for a, g in zip(naive32, gold))
    err_flash = max(np.abs(a - g).max() for a, g in zip(flash32, gold))
    memory.append((mem_naive, mem_flash))
    ok &= diff <= 1e-10 and mem_flash < mem_naive and err_flash <= 2 * err_naive + 1e-6
    print(f"{length:>6} | {mem_naive / MiB:>9.1f} {mem_flash / MiB:>9.1f} "
          f"{mem_naive / mem_flash:>5.1f}x | {diff:>17.1e} | {err_naive:>13.1e} {err_flash:>13.1e}")

if args.figure:
    from _figures import attention_memory
    attention_memory(args.figure, args.lengths, *zip(*memory), args.heads, args.d)
print(f"check: flash = naive within 1e-10 in float64, float32 error <= 2x naive's, "
      f"less memory: {'ok' if ok else 'FAILED'}")
sys.exit(0 if ok else 1)
