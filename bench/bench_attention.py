"""Flash vs naive attention: forward + backward time and peak extra memory, in one run.

For each sequence length s, both ops run forward and backward on the same
q, k, v (batch x heads x s x d) and the same upstream gradient. Time is the
median of ``--repeats`` runs, the two ops alternating so machine noise hits
both alike. Peak extra memory is measured in a separate run under tracemalloc
(``backend.MemoryTracker``): every array allocated during forward + backward
beyond the inputs, outputs and gradients included.

    python bench/bench_attention.py                       # s = 1024 .. 8192, d = 64
    python bench/bench_attention.py --lengths 512 1024 --repeats 2
    python bench/bench_attention.py --threads 1        # BLAS on one thread

Flash makes many small matrix products (7 per tile pair) where naive makes 6
large ones; on a loaded machine BLAS threads that wait for each other cost the
small ones most, so compare with ``--threads 1`` when the machine is busy.

Targets at s = 4096: flash's peak extra memory at most 1/16 of naive's, its
time at most 1.2x naive's.
"""
import argparse
import os
import statistics
from _args import positive_int

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--lengths", type=positive_int, nargs="+", default=[1024, 2048, 4096, 8192])
parser.add_argument("--d", type=positive_int, default=64, help="head dim")
parser.add_argument("--batch", type=positive_int, default=1)
parser.add_argument("--heads", type=positive_int, default=2)
parser.add_argument("--dtype", default="float32")
parser.add_argument("--causal", action="store_true")
parser.add_argument("--block-q", type=positive_int, default=None,
                    help="flash tile rows (default: op's)")
parser.add_argument("--block-k", type=positive_int, default=None,
                    help="flash tile cols (default: op's)")
parser.add_argument("--repeats", type=positive_int, default=3)
parser.add_argument("--threads", type=positive_int, default=os.cpu_count() or 1,
                    help="BLAS threads")
args = parser.parse_args()

# thread counts must be fixed before NumPy loads its BLAS thread pool
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(args.threads)

import numpy as np  # noqa: E402

from minidist import backend  # noqa: E402
from minidist.attention import flash_attention, naive_attention  # noqa: E402
from minidist.autograd import Tensor  # noqa: E402

blocks = {k: v for k, v in (("block_q", args.block_q), ("block_k", args.block_k)) if v}


def naive(q, k, v):
    return naive_attention(q, k, v, is_causal=args.causal)


def flash(q, k, v):
    return flash_attention(q, k, v, is_causal=args.causal, **blocks)


def inputs(s: int):
    rng = np.random.default_rng(s)
    shape = (args.batch, args.heads, s, args.d)
    arrays = [rng.standard_normal(shape).astype(args.dtype) for _ in range(4)]
    return [backend.from_host(a) for a in arrays]


def step(fn, q, k, v, do) -> None:
    """Forward + backward; the graph, outputs and gradients are dropped on return."""
    qt, kt, vt = (Tensor(a, requires_grad=True) for a in (q, k, v))
    out = fn(qt, kt, vt)
    out.backward(do)


def seconds(fn, arrays) -> float:
    with backend.Timer() as t:
        step(fn, *arrays)
    return t.seconds


def peak_bytes(fn, arrays) -> int:
    with backend.MemoryTracker() as mem:
        step(fn, *arrays)
    return mem.peak


MiB = 2.0**20
print(f"attention forward + backward, batch {args.batch} x heads {args.heads}, d = {args.d}, "
      f"{args.dtype}, causal={args.causal}, backend {backend.get_backend()}, "
      f"{args.threads} BLAS thread(s)")
print(f"{'s':>6} | {'naive ms':>9} {'flash ms':>9} {'time x':>7} | "
      f"{'naive MiB':>10} {'flash MiB':>10} {'memory /':>9}")
results = {}
for s in args.lengths:
    arrays = inputs(s)
    step(flash, *arrays)                                   # warm up both
    step(naive, *arrays)
    times = {"naive": [], "flash": []}
    for _ in range(args.repeats):
        times["naive"].append(seconds(naive, arrays))
        times["flash"].append(seconds(flash, arrays))
    t_naive, t_flash = statistics.median(times["naive"]), statistics.median(times["flash"])
    m_naive, m_flash = peak_bytes(naive, arrays), peak_bytes(flash, arrays)
    results[s] = (t_flash / t_naive, m_naive / m_flash)
    print(f"{s:>6} | {1e3 * t_naive:>9.1f} {1e3 * t_flash:>9.1f} {t_flash / t_naive:>6.2f}x | "
          f"{m_naive / MiB:>10.1f} {m_flash / MiB:>10.1f} {m_naive / m_flash:>8.1f}x", flush=True)

if 4096 in results:
    time_ratio, memory_ratio = results[4096]
    ok = time_ratio <= 1.2 and memory_ratio >= 16
    print(f"check: s=4096 flash time {time_ratio:.2f}x naive (target <= 1.2), "
          f"memory 1/{memory_ratio:.0f} of naive (target <= 1/16)"
          f"{'' if ok else '  FAILED'}")
