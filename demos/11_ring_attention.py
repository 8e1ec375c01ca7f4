"""Demo 11: ring attention, the sequence split across processes (context parallelism).

N processes each hold 1/N of a long sequence's queries, keys and values. The
K/V blocks travel around the ring while each rank merges its partial results
with the logsumexp rule (minidist/parallel/context/ring_attention.py); backward sends the
dK/dV accumulators around with them. The parent gathers every rank's rows and
compares output and gradients with attention computed in one process.

With causal attention, a contiguous split leaves rank N-1 with about 2N-1 times the
work of rank 0; the zigzag split (rank r holds chunks r and 2N-1-r of 2N) evens it
out. The demo prints the work (query-key pairs scored) per rank for both: in a ring
every step waits for the slowest rank, so the busiest rank sets the pace.

With --window W (a sliding window: row i sees keys i - W + 1 .. i) each block is
masked by the global positions of its queries and keys, and the blocks wholly
outside the window are skipped; the demo prints the share of the causal work left.

    python demos/11_ring_attention.py                      # 4 processes, ~15 s
    python demos/11_ring_attention.py -n 2 --length 4096 --no-causal
    python demos/11_ring_attention.py --window 256

The check: max |ring - single process| over output and gradients <= 1e-10 (float64).
With --figure PATH (no figure without it) it saves the work per rank of each
split as a PNG (needs matplotlib):

    python demos/11_ring_attention.py --figure /tmp/ring_attention.png
"""
import argparse
import sys

import numpy as np

import minidist
from minidist.attention import flash_attention
from minidist.autograd import Tensor
from minidist.backend import from_host, to_host
from minidist.distributed import get_rank, get_stats, get_world_size
from minidist.parallel import plan_work, ring_attention, shard_sequence, unshard_sequence
from _args import non_negative_int, positive_int
from _launched import one_process_only


def on_rank(arrays, causal, layout, window):
    """Each rank: its shard of q, k, v, dO -> ring attention forward + backward."""
    rank, size = get_rank(), get_world_size()
    q, k, v, do = (shard_sequence(from_host(a), rank, size, layout) for a in arrays)
    qt, kt, vt = (Tensor(a, requires_grad=True) for a in (q, k, v))
    out = ring_attention(qt, kt, vt, is_causal=causal, layout=layout, window=window)
    out.backward(do)
    sent = get_stats().bytes_sent
    return [to_host(a) for a in (out.data, qt.grad, kt.grad, vt.grad)], sent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", "--world-size", type=positive_int, default=4)
    parser.add_argument("--length", type=positive_int, default=2048, help="whole sequence length")
    parser.add_argument("--heads", type=positive_int, default=4)
    parser.add_argument("--d", type=positive_int, default=32, help="head dim")
    parser.add_argument("--no-causal", dest="causal", action="store_false")
    parser.add_argument("--window", type=positive_int, default=None,
                        help="sliding window: keys per row (causal only)")
    parser.add_argument("--seed", type=non_negative_int, default=0)
    parser.add_argument("--figure", metavar="PATH", help="save the work per rank as a PNG")
    args = parser.parse_args()
    one_process_only("it starts its own worlds and compares ring attention with one process")
    n = args.world_size
    if args.length % (2 * n):
        parser.error(f"--length ({args.length}) must be divisible by 2 x -n ({2 * n}): "
                     "the zigzag layout gives each rank two chunks")
    if args.window is not None and not args.causal:
        parser.error("--window needs causal attention (drop --no-causal)")
    rng = np.random.default_rng(args.seed)
    arrays = [rng.standard_normal((1, args.heads, args.length, args.d)) for _ in range(4)]

    # the reference: one process attends over the whole sequence
    q, k, v = (Tensor(from_host(a), requires_grad=True) for a in arrays[:3])
    out = flash_attention(q, k, v, is_causal=args.causal, window=args.window)
    out.backward(from_host(arrays[3]))
    want = [to_host(a) for a in (out.data, q.grad, k.grad, v.grad)]

    print(f"sequence {args.length}, heads {args.heads}, d = {args.d}, causal={args.causal}, "
          f"{n} processes; each holds {args.length // n} positions"
          + (f"; window {args.window}" if args.window else ""))
    worst, work_of = 0.0, {}
    layouts = ["zigzag", "contiguous"] if args.causal else ["contiguous"]
    for layout in layouts:
        results = minidist.launch(on_rank, n, arrays, args.causal, layout, args.window)
        c = args.length // n
        work = work_of[layout] = [plan_work(r, n, c, args.causal, layout, args.window)
                                  for r in range(n)]
        print(f"\n{layout} split:")
        print(f"{'rank':>6} {'query-key pairs':>16} {'share':>6} {'MiB sent':>9}")
        for rank, (_, sent) in enumerate(results):
            print(f"{rank:>6} {work[rank]:>16,} {work[rank] / sum(work):>6.1%} "
                  f"{sent / 2**20:>9.2f}")
        print(f"  busiest rank / average = {max(work) / (sum(work) / n):.2f}")
        if args.window:
            causal = sum(plan_work(r, n, c, True, layout) for r in range(n))
            print(f"  the window leaves {sum(work) / causal:.1%} of the causal pairs")
        for i, name in enumerate(("out", "dq", "dk", "dv")):
            got = unshard_sequence([from_host(r[0][i]) for r in results], layout)
            err = float(np.abs(to_host(got) - want[i]).max())
            worst = max(worst, err)
            print(f"  max |ring - single process| {name:>3}: {err:.1e}")

    if args.figure:
        from _figures import ring_work
        ring_work(args.figure, work_of, n, args.length, args.causal)
    ok = worst <= 1e-10
    print(f"\ncheck: max |ring - single process| = {worst:.1e}  (tolerance 1e-10): "
          f"{'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":   # the ranks are spawned: they import this file, not run it
    sys.exit(main())
