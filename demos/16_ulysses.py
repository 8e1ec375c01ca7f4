"""Demo 16: Ulysses vs ring attention, the two ways to split a sequence over ranks.

Both give every rank 1/N of the sequence and compute exact attention. Ring attention
(demo 11) passes K/V blocks round the ring: 2 (N-1) blocks a rank in forward.
Ulysses (minidist/parallel/context/ulysses.py) does one all-to-all per q, k, v to
make each rank hold H/N heads over the whole sequence, attends locally, and one
all-to-all brings the output back: 4 (N-1)/N blocks a rank, N/2 times fewer bytes.
For a few sequence lengths the demo runs both forward + backward, prints the bytes
each rank sent beside the formulas of minidist.calc, and the time, and checks both
against attention in one process.

    python demos/16_ulysses.py                 # 4 processes, a few seconds
    python demos/16_ulysses.py -n 2 --lengths 256 512

The check: max |parallel - single process| over output and gradients <= 1e-10
(float64). With --figure PATH it draws bytes and time per length (needs matplotlib).
"""
import argparse
import sys
import time

import numpy as np

import minidist
from minidist.attention import flash_attention
from minidist.autograd import Tensor
from minidist.backend import from_host, to_host
from minidist.calc import sequence_parallel_bytes
from minidist.distributed import barrier, get_rank, get_stats, get_world_size
from minidist.parallel import (ring_attention, shard_sequence, split_sequence,
                               ulysses_attention, unshard_sequence)
from _args import positive_int
from _launched import one_process_only


def on_rank(arrays, method):
    """Each rank: its shard through Ulysses or ring attention, forward and backward."""
    rank, n = get_rank(), get_world_size()
    if method == "ulysses":
        shards = [split_sequence(from_host(a), rank, n) for a in arrays]
    else:
        shards = [shard_sequence(from_host(a), rank, n, "contiguous") for a in arrays]
    q, k, v = (Tensor(a, requires_grad=True) for a in shards[:3])
    barrier()
    get_stats().reset()
    t = time.perf_counter()
    if method == "ulysses":
        out = ulysses_attention(q, k, v, impl="flash")
    else:
        out = ring_attention(q, k, v, layout="contiguous")
    out.backward(shards[3])
    seconds = time.perf_counter() - t
    sent = get_stats().bytes_sent
    return [to_host(a) for a in (out.data, q.grad, k.grad, v.grad)], sent, seconds


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-n", "--world-size", type=positive_int, default=4)
    p.add_argument("--lengths", type=positive_int, nargs="+", default=[256, 512, 1024])
    p.add_argument("--heads", type=positive_int, default=4)
    p.add_argument("--d", type=positive_int, default=16, help="head dim")
    p.add_argument("--figure", metavar="PATH")
    args = p.parse_args()
    one_process_only("it starts its own worlds, Ulysses and ring attention beside one process")
    n, H, D = args.world_size, args.heads, args.d
    if n < 2 or H % n:
        p.error(f"Ulysses needs -n ({n}) of at least 2 that divides --heads ({H})")
    if any(length % n for length in args.lengths):
        p.error(f"every --lengths value must be divisible by -n ({n}), got {args.lengths}")
    print(f"{n} processes, {H} heads of d = {D}, float64, forward + backward, not causal")
    print(f"{'length':>7} | {'Ulysses KiB/rank':>17} {'formula':>8} {'ms':>7} | "
          f"{'ring KiB/rank':>14} {'formula':>8} {'ms':>7} | ring/Ulysses bytes")
    worst, rows = 0.0, []
    for s in args.lengths:
        rng = np.random.default_rng(s)
        arrays = [rng.standard_normal((1, H, s, D)) for _ in range(4)]
        q, k, v = (Tensor(from_host(a), requires_grad=True) for a in arrays[:3])
        out = flash_attention(q, k, v)
        out.backward(from_host(arrays[3]))
        want = [to_host(a) for a in (out.data, q.grad, k.grad, v.grad)]
        calc = sequence_parallel_bytes(s, H * D, n, 1, 8, H)
        measured = {}
        for method in ("ulysses", "ring"):
            results = minidist.launch(on_rank, n, arrays, method)
            for i in range(4):
                got = unshard_sequence([from_host(r[0][i]) for r in results], "contiguous")
                worst = max(worst, float(np.abs(to_host(got) - want[i]).max()))
            measured[method] = (max(r[1] for r in results), max(r[2] for r in results))
        (ub, ut), (rb, rt) = measured["ulysses"], measured["ring"]
        rows.append((s, ub, ut, rb, rt))
        print(f"{s:>7} | {ub / 1024:>17.1f} {calc.ulysses_step / 1024:>8.1f} {ut * 1e3:>7.1f} | "
              f"{rb / 1024:>14.1f} {calc.ring_step / 1024:>8.1f} {rt * 1e3:>7.1f} | "
              f"{rb / ub:.2f}  (N/2 = {n / 2:.1f} in forward)")
    print("(formula: forward + backward; in backward the ring sends K, V round again and "
          "dK, dV back to their owners)")
    ok = worst <= 1e-10
    print(f"\ncheck: max |parallel - single process| = {worst:.1e}  (tolerance 1e-10): "
          f"{'ok' if ok else 'FAILED'}")
    if args.figure:
        from _figures import ulysses_vs_ring
        ulysses_vs_ring(args.figure, rows, n)
    return 0 if ok else 1


if __name__ == "__main__":   # the ranks are spawned: they import this file, not run it
    sys.exit(main())
