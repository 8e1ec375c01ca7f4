"""DDP step time: naive vs bucketed vs bucketed-and-overlapped, and weak scaling.

    python bench/bench_ddp.py                      # world 2, 8 layers of 1024 x 1024
    python bench/bench_ddp.py --layers 4 --width 512 --rounds 5

The model is a stack of ``--layers`` Linear(width, width) + tanh in float32 and
a small per-rank batch, so that all-reducing the gradients (4 * layers * width^2
bytes) is a real share of the step. One training step (forward, backward,
gradient sync, SGD) is timed for

- ``compute``:   forward + backward + SGD with no gradient sync (``no_sync``):
                 the floor that perfect overlap would reach;
- ``naive``:     DataParallelNaive, one all-reduce per parameter after backward;
- ``bucketed``:  DistributedDataParallel(overlap=False), one all-reduce per
                 bucket, all after backward;
- ``overlap``:   DistributedDataParallel(overlap=True), each bucket's all-reduce
                 started from the gradient hooks while backward goes on.

Variants alternate within each round (so a burst of other load hits all of
them) and the median over rounds is reported, with each variant's time as a
ratio to naive, and how much communication time each bucketed variant leaves
exposed (its step minus ``compute``). Then the weak-scaling efficiency: the step time of the overlap
variant at world 1 over world N, with the same per-rank batch (1.0 = perfect).
Each rank uses one BLAS thread, so that N ranks on N cores do not oversubscribe.
"""
from __future__ import annotations

import argparse
import os
import statistics
from _args import non_negative, positive, positive_int

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")   # before NumPy loads, here and in the spawned ranks


def mlp(layers: int, width: int):
    """``layers`` x (Linear(width, width), tanh) in float32, layer i seeded with i
    (also used by bench_zero.py)."""
    from minidist.backend import Generator
    from minidist.nn import Linear, Sequential

    class Tanh(Sequential):
        def forward(self, x):
            return x.tanh()

    mods = []
    for i in range(layers):
        mods += [Linear(width, width, generator=Generator(i)), Tanh()]
    return Sequential(*mods)


def time_steps(variant: str, layers: int, width: int, batch: int, steps: int,
               bucket_mb: float, spin_s: float | None = None) -> float:
    """On every rank: median seconds per training step of ``variant``."""
    import contextlib
    import time

    import minidist.distributed as dist
    from minidist.autograd import Tensor
    from minidist.backend import Generator, synchronize
    from minidist.optim import SGD
    from minidist.parallel import DataParallelNaive, DistributedDataParallel

    model = mlp(layers, width)
    if variant == "naive":
        wrapped = DataParallelNaive(model)
    else:
        wrapped = DistributedDataParallel(model, bucket_cap_mb=bucket_mb,
                                          overlap=variant == "overlap")
    opt = SGD(model.parameters(), lr=1e-3)
    x = Tensor(Generator(100 + dist.get_rank()).normal((batch, width)))
    if spin_s is not None:
        from minidist.comm.group import world_group
        world_group().transport.spin_s = spin_s  # how long a waiting rank polls before sleeping
    times, cpu_main, cpu_comm = [], [], []
    for i in range(steps + 2):                       # 2 warm-up steps
        dist.barrier()
        t, c = time.perf_counter(), time.thread_time()
        with wrapped.no_sync() if variant == "compute" else contextlib.nullcontext():
            wrapped(x).sum().backward()
        if variant == "naive":
            wrapped.sync_gradients()
        opt.step()
        opt.zero_grad()
        synchronize()                                # a GPU backend computes asynchronously
        times.append(time.perf_counter() - t)
        cpu_main.append(time.thread_time() - c)      # this (the main) thread's CPU time
        events = getattr(wrapped, "timeline", [])[:-1] if variant != "compute" else []
        cpu_comm.append(sum(e["cpu_ms"] for e in events) / 1e3)  # the background thread's
    timeline = getattr(wrapped, "timeline", [])
    return (statistics.median(times[2:]), timeline,
            [b.nbytes for b in getattr(wrapped, "buckets", [])],
            statistics.median(cpu_main[2:]), statistics.median(cpu_comm[2:]))


def measure(world, variants, args, last: dict | None = None) -> dict:
    """Median step time of each variant; ``last`` gets rank 0's last timeline and
    bucket sizes of each variant."""
    per_round: dict[str, list[float]] = {v: [] for v in variants}
    cpu: dict[str, list] = {}
    for _ in range(args.rounds):
        for v in variants:
            ranks = world.run(time_steps, v, args.layers, args.width, args.batch, args.steps,
                              args.bucket_mb, args.spin_s)
            per_round[v].append(max(r[0] for r in ranks))  # a step is done when every rank is
            if last is not None:
                last[v] = ranks[0][1:3]
                cpu.setdefault(v, []).append(ranks[0][3:])
    if last is not None:   # rank 0's median CPU ms per step: (main thread, comm thread)
        last["cpu"] = {v: tuple(1e3 * statistics.median(c[i] for c in cs) for i in (0, 1))
                       for v, cs in cpu.items()}
    return {v: statistics.median(ts) for v, ts in per_round.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", type=positive_int, default=2)
    ap.add_argument("--layers", type=positive_int, default=8)
    ap.add_argument("--width", type=positive_int, default=1024)
    ap.add_argument("--batch", type=positive_int, default=32, help="samples per rank")
    ap.add_argument("--bucket-mb", type=positive, default=8.0)
    ap.add_argument("--steps", type=positive_int, default=5, help="timed steps per measurement")
    ap.add_argument("--rounds", type=positive_int, default=5)
    ap.add_argument("--spin-s", type=non_negative, default=None,
                    help="seconds a waiting receive polls before sleeping (default: the "
                         "transport's); 0 frees the core for compute at once")
    ap.add_argument("--link-gbps", type=non_negative, default=2.0,
                    help="the emulated link of the second run, GB/s (0: skip that run)")
    args = ap.parse_args()
    from minidist.comm import World

    grad_mb = 4 * args.layers * (args.width ** 2 + args.width) / 1e6
    print(f"model: {args.layers} x Linear({args.width}, {args.width}) float32, "
          f"{grad_mb:.1f} MB of gradients; batch {args.batch} per rank; "
          f"buckets of {args.bucket_mb} MB; median of {args.rounds} rounds x {args.steps} steps")
    variants = ["compute", "naive", "bucketed", "overlap"]
    with World(1, link_gbps=0) as world:
        at_1 = measure(world, ["overlap"], args)["overlap"]
    links = [None] + ([args.link_gbps] if args.link_gbps > 0 else [])
    for link in links:
        with World(args.world, link_gbps=link if link else 0) as world:
            last: dict = {}
            at_n = measure(world, variants, args, last)
            report(at_n, at_1, args.world, link)
            wire = overlap_report(at_n, last["overlap"], args.world, link)
            cpu_report(last["cpu"], args.world, wire)


def overlap_report(at_n: dict, last: tuple, world: int, link: float | None) -> float:
    """Rank 0's last overlapped step, bucket by bucket, and the targets; returns
    the last bucket's wire time in s (0 on shared memory)."""
    from minidist.parallel.data.timeline import render
    timeline, sizes = last
    print("overlap, rank 0's last step ('.' ready and queued, '#' all-reducing, "
          "'|' backward ended; ms after forward ended):")
    print(render(timeline))
    if link is None:
        ok = at_n["overlap"] <= at_n["bucketed"]
        print(f"target: overlap <= bucketed on shared memory: {1e3 * at_n['overlap']:.1f} <= "
              f"{1e3 * at_n['bucketed']:.1f} ms  {'met' if ok else 'NOT met'}")
        return 0.0
    last_bytes = sizes[timeline[-2]["bucket"]]
    wire = 2 * (world - 1) / world * last_bytes / (link * 1e9)
    bound = 1.15 * (at_n["compute"] + wire)
    ok = at_n["overlap"] <= bound
    print(f"target: overlap <= 1.15 x (compute + last bucket's wire time) = 1.15 x "
          f"({1e3 * at_n['compute']:.1f} + {1e3 * wire:.1f}) = {1e3 * bound:.1f} ms; "
          f"measured {1e3 * at_n['overlap']:.1f} ms  {'met' if ok else 'NOT met'}")
    return wire


def cpu_report(cpu: dict, world: int, wire: float) -> None:
    """Rank 0's CPU time per step: its main thread's and the background thread's.
    CPU time is what a busy machine inflates least: a rank that is preempted
    waits, but its CPU time does not grow."""
    from minidist.comm.transport.wait import cores_available
    per_rank = cores_available() / world
    print(f"CPU per step on rank 0 ({per_rank:g} core(s) per rank): main thread + background "
          "thread = total")
    for v, (main, comm) in cpu.items():
        print(f"  {v:<10} {main:6.1f} + {comm:5.1f} = {main + comm:6.1f} ms")
    if per_rank > 1:
        return
    print("  with no spare core, a step cannot take less than its total CPU time: the "
          "copies of bucketing and communication come on top of compute, overlap or not")
    if wire:
        main, comm = cpu["overlap"]
        floor, ideal = main + comm + 1e3 * wire, cpu["compute"][0] + 1e3 * wire
        print(f"  floor of the overlapped step here: {main + comm:.1f} + last bucket's wire "
              f"{1e3 * wire:.1f} = {floor:.1f} ms = {floor / ideal:.2f} x (compute + wire)")


def report(at_n: dict, at_1: float, world: int, link: float | None) -> None:
    if link is None:
        print("\n== shared memory: every byte is copied by the ranks' CPUs ==")
    else:
        print(f"\n== emulated link of {link:g} GB/s per pair of ranks: bytes on the wire "
              f"for M / {link:g} GB/s while the CPU is free (comm/transport/link.py) ==")
    base = at_n["naive"]
    print(f"world {world}      step (ms)   vs naive")
    for v in at_n:
        print(f"  {v:<10} {1e3 * at_n[v]:9.1f}   {at_n[v] / base:8.3f}")
    saving = 1 - at_n["overlap"] / at_n["bucketed"]
    exposed = {v: at_n[v] - at_n["compute"] for v in ("bucketed", "overlap")}
    print(f"overlap / bucketed = {at_n['overlap'] / at_n['bucketed']:.3f} "
          f"(saves {100 * saving:.1f}% of the step)")
    print(f"communication not hidden behind compute: bucketed {1e3 * exposed['bucketed']:.1f} "
          f"ms, overlap {1e3 * exposed['overlap']:.1f} ms")
    eff = at_1 / at_n["overlap"]
    print(f"weak scaling: step at world 1 = {1e3 * at_1:.1f} ms, at world "
          f"{world} = {1e3 * at_n['overlap']:.1f} ms -> efficiency {eff:.3f}")

if __name__ == "__main__":
    main()
