"""ZeRO-3 step time with and without prefetch, and when each unit's gather ran.

    python bench/bench_zero.py                     # world 2, 8 x Linear(1024, 1024), 2 GB/s link
    python bench/bench_zero.py --link-gbps 0       # shared memory

ZeRO-3 (parallel/zero/zero3.py) all-gathers each unit's weights just before it
computes, in forward and again in backward. With ``prefetch=True`` the next
unit's gather is posted while the current one computes. On the emulated link
(comm/transport/link.py) a gather of a unit of P float32 weights is on the wire
for (N-1)/N * 4P / beta, which the previous unit's compute can hide.

The two variants alternate within each round and the median over rounds is
reported, with the ratio prefetch / no prefetch; then rank 0's gather timeline
of the last prefetched step (parallel/zero/gather_timeline.py): per unit use,
when its gather ran ('#'), when the unit waited for it ('.') and computed
('='), and the fraction of gather time hidden before the unit needed it.
"""
from __future__ import annotations

import argparse
import os
import statistics
from _args import non_negative, positive_int

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")   # before NumPy loads, here and in the spawned ranks


def time_steps(prefetch: bool, layers: int, width: int, batch: int, steps: int):
    """On every rank: (median seconds per step, the last step's gather timeline)."""
    import time

    import minidist.distributed as dist
    from minidist.autograd import Tensor
    from minidist.backend import Generator, synchronize
    from minidist.optim import SGD
    from minidist.parallel import Zero3
    from bench_ddp import mlp      # bench/ is on the path: the script's folder

    z = Zero3(mlp(layers, width), SGD, prefetch=prefetch, lr=1e-3)
    x = Tensor(Generator(100 + dist.get_rank()).normal((batch, width)))
    times = []
    for _ in range(steps + 2):                       # 2 warm-up steps
        dist.barrier()
        t = time.perf_counter()
        z(x).sum().backward()
        z.step()
        z.zero_grad()
        synchronize()
        times.append(time.perf_counter() - t)
    return statistics.median(times[2:]), z.gather_timeline


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", type=positive_int, default=2)
    ap.add_argument("--layers", type=positive_int, default=8)
    ap.add_argument("--width", type=positive_int, default=1024)
    ap.add_argument("--batch", type=positive_int, default=256, help="samples per rank")
    ap.add_argument("--steps", type=positive_int, default=5, help="timed steps per measurement")
    ap.add_argument("--rounds", type=positive_int, default=5)
    ap.add_argument("--link-gbps", type=non_negative, default=2.0,
                    help="emulated link, GB/s (0: off)")
    args = ap.parse_args()
    from minidist.comm import World
    from minidist.parallel.zero.gather_timeline import render

    unit_mb = 4 * (args.width ** 2 + args.width) / 1e6
    link = f"an emulated {args.link_gbps:g} GB/s link" if args.link_gbps else "shared memory"
    print(f"ZeRO-3, world {args.world} on {link}: {args.layers} x Linear({args.width}, "
          f"{args.width}) float32 ({unit_mb:.1f} MB per unit), batch {args.batch} per rank; "
          f"median of {args.rounds} rounds x {args.steps} steps")
    if args.link_gbps:
        wire = (args.world - 1) / args.world * unit_mb * 1e6 / (args.link_gbps * 1e9)
        print(f"one unit's gather on the wire: (N-1)/N * {unit_mb:.1f} MB / "
              f"{args.link_gbps:g} GB/s = {1e3 * wire:.2f} ms")
    per_round: dict[bool, list[float]] = {False: [], True: []}
    last = None
    with World(args.world, link_gbps=args.link_gbps) as world:
        for _ in range(args.rounds):
            for prefetch in (False, True):
                ranks = world.run(time_steps, prefetch, args.layers, args.width, args.batch,
                                  args.steps)
                per_round[prefetch].append(max(r[0] for r in ranks))
                if prefetch:
                    last = ranks[0][1]
    off, on = (statistics.median(per_round[p]) for p in (False, True))
    print(f"  no prefetch {1e3 * off:8.1f} ms per step")
    print(f"  prefetch    {1e3 * on:8.1f} ms per step   prefetch / no prefetch = {on / off:.3f}")
    print("rank 0's last prefetched step ('#' gathering, '.' waiting for it, '=' computing; "
          "ms after the first gather was asked for):")
    print(render(last))


if __name__ == "__main__":
    main()
