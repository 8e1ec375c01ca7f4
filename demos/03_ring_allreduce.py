"""Demo 03: ring all-reduce, its bytes per rank, and its two regimes.

Part 1 runs a ring all-reduce of M bytes on N processes and prints the bytes
each rank sent next to the formula 2(N-1)/N * M (the ring's bandwidth
optimality: it does not grow with N), and the naive algorithm's root, which
sends (N-1) * M.

Part 2 sweeps the message size from 1 KiB up, times the ring, fits the
alpha-beta model T = 2(N-1) * alpha + 2(N-1)/N * M / beta to the timings and
prints measured time next to the model: small messages are latency-bound
(the alpha term dominates, time hardly depends on M), large ones are
bandwidth-bound (time grows linearly with M, busbw flattens out).

    python demos/03_ring_allreduce.py              # 4 processes, ~15 s
    python demos/03_ring_allreduce.py -n 2 --max-mib 64
    python demos/03_ring_allreduce.py --figure /tmp/ring.png   # also draw the sweep

With --figure PATH (no figure without it) it saves time and bus bandwidth vs
message size, measured and fitted, as a PNG (needs matplotlib).

Code: minidist/comm/collectives/ring.py (the algorithm), minidist/comm/collectives/cost.py (the model).
"""
import argparse
import sys
import time

import minidist
import minidist.distributed as dist
from minidist.backend import xp
from minidist.comm.collectives import cost
from _args import positive_int
from _launched import one_process_only


def bytes_per_rank(m_bytes: int) -> list:
    """Run ring and naive all-reduce once; return what this rank sent in each."""
    out = {}
    for alg in ("ring", "naive"):
        x = xp.ones(m_bytes // 4, dtype="float32")
        dist.all_reduce(x, algorithm=alg)
        out[alg] = dist.get_stats().last["bytes_sent"]
    return out


def sweep(sizes: list, algorithm: str) -> list:
    """Average time of one all-reduce per size (this rank's view)."""
    times = []
    for size in sizes:
        x = xp.zeros(size // 4, dtype="float32")
        iters = max(3, min(200, (16 << 20) // size))
        dist.all_reduce(x, algorithm=algorithm)  # warm up
        dist.barrier()
        t = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x, algorithm=algorithm)
        times.append((time.perf_counter() - t) / iters)
    return times


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", "--world-size", type=positive_int, default=4)
    parser.add_argument("--mib", type=positive_int, default=8, help="M for part 1, in MiB")
    parser.add_argument("--max-mib", type=positive_int, default=16,
                        help="largest size of the sweep")
    parser.add_argument("--figure", metavar="PATH", help="save the sweep as a PNG (default: none)")
    args = parser.parse_args()
    one_process_only("it starts its own world to time the ring all-reduce against the naive one")
    n = args.world_size
    if n < 2:
        parser.error("-n must be at least 2: with one process nothing travels")

    with minidist.comm.World(n) as world:
        m = args.mib << 20
        sent = world.run(bytes_per_rank, m)
        print(f"Part 1: all-reduce of M = {args.mib} MiB on N = {n} processes\n")
        print(f"{'rank':>4} {'ring sent':>12} {'2(N-1)/N * M':>14} {'naive sent':>12}")
        for r, s in enumerate(sent):
            print(f"{r:>4} {s['ring']:>12,} {2 * (n - 1) / n * m:>14,.0f} {s['naive']:>12,}")
        formula = 2 * (n - 1) / n * m
        # chunks differ by at most one element when N does not divide M / 4
        ring_ok = all(abs(s["ring"] - formula) <= 2 * (n - 1) * 4 for s in sent)
        naive_ok = sent[0]["naive"] == (n - 1) * m
        print()

        sizes = [1 << k for k in range(10, 21 + (args.max_mib.bit_length() - 1), 2)]
        per_rank = world.run(sweep, sizes, "ring")
        times = [max(t) for t in zip(*per_rank)]  # done when the slowest rank is done
        alpha, beta = cost.fit_alpha_beta(sizes, times, n)
        print(f"Part 2: ring all-reduce sweep; fitted alpha = {alpha * 1e6:.1f} us per step, "
              f"beta = {beta / 1e9:.2f} GB/s\n")
        print(f"{'M':>9} {'measured':>11} {'model':>11} {'busbw GB/s':>11} "
              f"{'alpha term':>11} {'beta term':>11}  regime")
        for size, t in zip(sizes, times):
            model = cost.ring_all_reduce(size, n, alpha, beta)
            a_term = model.steps * alpha
            b_term = model.bytes_sent / beta
            busbw = cost.bus_bandwidth(size, n, t)[1] / 1e9
            regime = "latency-bound" if a_term > b_term else "bandwidth-bound"
            label = f"{size >> 10} KiB" if size < (1 << 20) else f"{size >> 20} MiB"
            print(f"{label:>9} {t * 1e6:>9.0f}us {model.seconds * 1e6:>9.0f}us {busbw:>11.2f} "
                  f"{a_term * 1e6:>9.0f}us {b_term * 1e6:>9.0f}us  {regime}")
    if args.figure:
        from _figures import bandwidth
        bandwidth(args.figure, sizes, times, alpha, beta, n)
    # The sweep's times are measured, not checked (they depend on the machine);
    # the check is part 1's byte counts, which do not.
    print(f"\ncheck: every rank's ring bytes = 2(N-1)/N * M (to one element per step), "
          f"naive root = (N-1) * M: {'ok' if ring_ok and naive_ok else 'FAILED'}")
    sys.exit(0 if ring_ok and naive_ok else 1)
