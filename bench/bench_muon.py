"""Sharded Muon's optimizer step: gather vs round robin vs AdamW, at world 2 and 4.

    python bench/bench_muon.py                     # GPT blocks h = 256, 4 layers: 16 matrices
    python bench/bench_muon.py --hidden 512 --layers 2 --worlds 2 4 8

Every rank holds torch.chunk's rows of each matrix (fully_shard's Shard(0) pieces) and
a random gradient; only the optimizer step is timed (median over steps, the slowest
rank; bytes: the mean over ranks, as the formula). Muon's two schemes (distributed/muon.py) against AdamW on the same pieces, which
needs no communication at all. Per scheme: the bytes this rank sent per step (counted
by the process group) beside calc.muon_step_costs' formula, and the Newton-Schulz
iterations and FLOPs run in the world per step (round robin: 1/N of gather's).
"""
from __future__ import annotations

import argparse
import os
import statistics
from _args import positive_int

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")   # before NumPy loads, here and in the spawned ranks


def time_step(kind: str, hidden: int, layers: int, steps: int):
    """On every rank: (median seconds per step, bytes sent per step, iterations per step,
    iteration FLOPs per step)."""
    import time

    import minidist.distributed as dist
    from minidist.autograd import Tensor
    from minidist.backend import Generator, synchronize
    from minidist.calc import gpt_block_matrices, newton_schulz_flops
    from minidist.comm.group import resolve
    from minidist.distributed.muon import ShardedMuon, row_chunks
    from minidist.distributed.tensor.placement_types import shard_slice
    from minidist.optim import AdamW

    shapes = gpt_block_matrices(hidden, layers)
    n, r = dist.get_world_size(), dist.get_rank()
    gen = Generator(0)
    params, pieces = [], {}
    for shape in shapes:
        whole = gen.normal(shape).astype("float32") * 0.02
        p = Tensor(shard_slice(whole, 0, n, r).copy(), requires_grad=True)
        params.append(p)
        pieces[id(p)] = row_chunks(shape, None)
    if kind == "adamw":
        opt = AdamW(params, lr=1e-3)
    else:
        opt = ShardedMuon(params, pieces, scheme=kind, lr=0.02)
    stats = resolve(None).stats
    times, sent = [], []
    for step in range(steps + 1):                     # 1 warm-up step
        for p in params:
            p.grad = Generator(100 + step).normal(p.shape).astype("float32")
        dist.barrier()
        before = stats.bytes_sent
        t = time.perf_counter()
        opt.step()
        synchronize()
        times.append(time.perf_counter() - t)
        sent.append(stats.bytes_sent - before)
    iterations = getattr(opt, "iterations_run", 0) / (steps + 1)
    flops = 0.0
    if kind != "adamw":   # which matrices this rank iterated: all (gather) or its own
        mine = range(len(shapes)) if kind == "gather" else range(r, len(shapes), n)
        flops = sum(newton_schulz_flops(*shapes[i]) for i in mine)
    return statistics.median(times[1:]), statistics.median(sent[1:]), iterations, flops


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=positive_int, default=256)
    ap.add_argument("--layers", type=positive_int, default=4)
    ap.add_argument("--worlds", type=positive_int, nargs="+", default=[2, 4])
    ap.add_argument("--steps", type=positive_int, default=5, help="timed steps")
    args = ap.parse_args()
    from minidist.calc import gpt_block_matrices, muon_step_costs
    from minidist.comm import World

    shapes = gpt_block_matrices(args.hidden, args.layers)
    print(f"optimizer step on {len(shapes)} GPT block matrices (h = {args.hidden}, "
          f"{args.layers} layers, {sum(a * b for a, b in shapes) / 1e6:.2f} M float32), "
          f"rows cut over the world; median of {args.steps} steps, slowest rank")
    for n in args.worlds:
        model = {c.scheme: c for c in muon_step_costs(shapes, n)}
        with World(n, run_timeout=600.0) as world:
            rows = {}
            for kind in ("adamw", "gather", "round_robin"):
                ranks = world.run(time_step, kind, args.hidden, args.layers, args.steps)
                rows[kind] = (max(t for t, *_ in ranks), sum(b for _, b, *_ in ranks) / n,
                              sum(i for *_, i, _ in ranks), sum(f for *_, f in ranks))
        print(f"world {n}:")
        for kind, (t, sent, iterations, flops) in rows.items():
            line = f"  {kind:>11} {1e3 * t:9.1f} ms/step  sent {sent / 1e6:7.2f} MB/rank (mean)"
            if kind in model:
                line += (f" (formula {model[kind].bytes_per_rank / 1e6:6.2f})  "
                         f"{iterations:4.0f} iterations, {flops / 1e9:7.2f} GFLOP in the world")
            print(line)
        g, rr = rows["gather"], rows["round_robin"]
        print(f"  round_robin / gather: time {rr[0] / g[0]:.2f}, bytes {rr[1] / g[1]:.2f}, "
              f"iteration FLOPs {rr[3] / g[3]:.3f} (1/N = {1 / n:.3f})")


if __name__ == "__main__":
    main()
