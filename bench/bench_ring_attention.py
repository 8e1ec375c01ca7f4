"""Ring attention with a sliding window against the causal ring, in one run.

    python bench/bench_ring_attention.py                         # 2 ranks, 2048 tokens
    python bench/bench_ring_attention.py -n 4 --length 4096 --windows 128 512

Each rank holds its shard (``--layout``, zigzag by default) of a (1, heads, length, d)
float32 q, k, v and runs ring attention forward and backward; a time is the slowest
rank's, best of ``--repeats`` windows. The reference is causal ring attention in the
same layout, measured in the same world, alternating with each window, so the load
of the machine falls on both. For each window: its time, the share of the causal
query-key pairs it scores (``plan_work``), the hops K/V travel (``RingMasks.steps``
less one), and the time over the causal ring's. Under zigzag the K/V blocks travel the
whole ring for any window wider than one key; under ``--layout contiguous`` a window
shortens the ring too. Inside a visible block flash attention skips only whole tiles
outside the window: ``--block 128`` (block_q = block_k) lets a small window skip more
of them.
"""
from __future__ import annotations

import argparse
import time

from _args import positive_int


def ring_times(length: int, heads: int, d: int, windows: list, repeats: int,
               blocks: dict, layout: str) -> dict:
    """On every rank: best forward + backward time (s) of each window (None: causal)."""
    import numpy as np

    import minidist.distributed as dist
    from minidist.autograd import Tensor
    from minidist.backend import from_host, synchronize
    from minidist.parallel import ring_attention, shard_sequence
    rank, n = dist.get_rank(), dist.get_world_size()
    rng = np.random.default_rng(0)
    q, k, v, do = (shard_sequence(from_host(rng.standard_normal((1, heads, length, d))
                                            .astype(np.float32)), rank, n, layout)
                     for _ in range(4))

    def step(window):
        qt, kt, vt = (Tensor(a, requires_grad=True) for a in (q, k, v))
        options = dict(blocks, layout=layout)
        if window is not None:
            options["window"] = window
        ring_attention(qt, kt, vt, is_causal=True, **options).backward(do)

    best = {w: float("inf") for w in windows}
    for w in windows:                                   # warm up
        step(w)
    for _ in range(repeats):
        for w in windows:                               # alternating
            dist.barrier()
            t = time.perf_counter()
            step(w)
            synchronize()
            best[w] = min(best[w], time.perf_counter() - t)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", "--world-size", type=positive_int, default=2)
    parser.add_argument("--length", type=positive_int, default=2048)
    parser.add_argument("--heads", type=positive_int, default=4)
    parser.add_argument("--d", type=positive_int, default=64)
    parser.add_argument("--windows", type=positive_int, nargs="*", default=[64, 256, 1024])
    parser.add_argument("--repeats", type=positive_int, default=5)
    parser.add_argument("--layout", choices=["zigzag", "contiguous"], default="zigzag")
    parser.add_argument("--block", type=positive_int, default=None,
                        help="flash attention's tile size (block_q = block_k)")
    args = parser.parse_args()
    n = args.world_size
    if args.length % (2 * n):
        parser.error(f"--length ({args.length}) must be divisible by 2 x -n ({2 * n}): "
                     f"the zigzag layout gives each rank two chunks")
    from minidist.comm import World
    from minidist.parallel import plan_work
    from minidist.parallel.context.ring_masks import RingMasks
    windows = [None] + args.windows
    with World(n, run_timeout=600.0) as world:
        blocks = {} if args.block is None else dict(block_q=args.block, block_k=args.block)
        per_rank = world.run(ring_times, args.length, args.heads, args.d, windows,
                             args.repeats, blocks, args.layout)
    slowest = {w: max(times[w] for times in per_rank) for w in windows}
    c = args.length // n
    causal_pairs = sum(plan_work(r, n, c, layout=args.layout) for r in range(n))
    print(f"ring attention, {args.layout}, {n} ranks, sequence {args.length}, {args.heads} heads, "
          f"d = {args.d}, float32, forward + backward (slowest rank, best of {args.repeats}), "
          f"tiles {args.block or 'default'}")
    print(f"{'window':>8} {'ms':>9} {'pairs':>7} {'K/V hops':>9} {'time / causal':>14}")
    for w in windows:
        pairs = sum(plan_work(r, n, c, layout=args.layout, window=w)
                    for r in range(n)) / causal_pairs
        hops = RingMasks(True, w, None, args.layout, n, c).steps() - 1
        print(f"{'causal' if w is None else w:>8} {slowest[w] * 1e3:>9.1f} {pairs:>7.1%} "
              f"{hops:>9} {slowest[w] / slowest[None]:>13.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
