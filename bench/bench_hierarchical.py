"""Hierarchical vs flat ring all-reduce on an emulated two-level machine.

    python bench/bench_hierarchical.py           # 2 nodes x 2 ranks, 20 GB/s inside, 2 between

The world is 4 ranks in 2 nodes of 2 (``World(node_size=2)``); the emulated
link carries ``--intra-gbps`` inside a node and ``--inter-gbps`` (10x slower by
default) between nodes (comm/transport/link.py). Each size is all-reduced with
the flat ring and with the hierarchical algorithm (comm/collectives/
hierarchical.py), alternating, and the median is printed with the ratio and
the cost model's times (calc/comm.py) beside them.
"""
from __future__ import annotations

import argparse
import statistics
from _args import positive, positive_int


def time_all_reduce(count: int, algorithm: str, repeats: int) -> tuple[float, int]:
    """On every rank: median seconds of one all-reduce, and bytes sent between nodes."""
    import time

    import minidist.distributed as dist
    from minidist.backend import xp
    x = xp.ones(count, dtype=xp.float32)
    times = []
    stats = dist.get_stats()
    for _ in range(repeats + 1):
        dist.barrier()
        before = stats.inter_node_bytes
        t = time.perf_counter()
        dist.all_reduce(x, algorithm=algorithm)
        times.append(time.perf_counter() - t)
    return statistics.median(times[1:]), stats.inter_node_bytes - before


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--intra-gbps", type=positive, default=20.0)
    ap.add_argument("--inter-gbps", type=positive, default=2.0)
    ap.add_argument("--mb", type=positive, nargs="+", default=[4.0, 16.0, 64.0])
    ap.add_argument("--repeats", type=positive_int, default=5)
    args = ap.parse_args()
    from minidist.calc import comm
    from minidist.comm import World
    nodes, local = 2, 2
    print(f"{nodes} nodes x {local} ranks; link {args.intra_gbps:g} GB/s inside a node, "
          f"{args.inter_gbps:g} GB/s between nodes; median of {args.repeats}")
    print(f"{'MB':>6} {'ring ms':>9} {'hier ms':>9} {'ring/hier':>10} "
          f"{'model ring':>11} {'model hier':>11} {'inter bytes/rank':>17}")
    with World(nodes * local, node_size=local, link_gbps=args.intra_gbps,
               inter_node_gbps=args.inter_gbps) as world:
        for mb in args.mb:
            count = int(mb * 1e6 / 4)
            ring = max(t for t, _ in world.run(time_all_reduce, count, "ring", args.repeats))
            hier_ranks = world.run(time_all_reduce, count, "hierarchical", args.repeats)
            hier = max(t for t, _ in hier_ranks)
            m = count * 4
            model_ring = comm.ring_all_reduce_time(m, nodes * local, args.inter_gbps * 1e9)
            model_hier = comm.hierarchical_all_reduce_time(m, nodes, local,
                                                           args.intra_gbps * 1e9,
                                                           args.inter_gbps * 1e9)
            print(f"{mb:6.1f} {1e3 * ring:9.2f} {1e3 * hier:9.2f} {ring / hier:10.2f} "
                  f"{1e3 * model_ring:11.2f} {1e3 * model_hier:11.2f} "
                  f"{hier_ranks[0][1]:17,d}")


if __name__ == "__main__":
    main()
