"""Where the time of a small all-reduce goes: the latency path, taken apart.

    python bench/bench_latency.py                 # world 2, 1 KiB of float32
    python bench/bench_latency.py --worlds 2 4 --size 16K

On every rank of a local world it times, per call (best of 5 windows of
``--iters`` calls, each window timed by its slowest rank):

    all_reduce      dist.all_reduce(x): the whole call (auto: through the board)
    one-shot        oneshot.call: the same without api.py's lookup of the plan
    flag round      the board alone: claim, post the ticket, wait for the
                    peers' tickets, acknowledge (no copy, no fold, no stats)
    copy in         x into my slot (one rank, no peer)
    fold            op over the N slots in rank order into x (one rank, no peer)

and prints the parts: the flag round is the wait (alpha); copy and fold are
the bytes; what remains of the one-shot call is its Python (the flight
recorder, the record check, the stats), and all_reduce's dispatch on top.

Then the alpha of each algorithm (``--alpha-size``, 64 bytes: the time of a call
that moves next to nothing), ``allgather`` both through the board and, in a
world started with MINIDIST_BOARD=0, through the channels (the Bruck rounds).
"""
from __future__ import annotations

import argparse
import time

from _args import byte_size, positive_int


def _windows(fn, iters: int, barrier) -> list[float]:
    out = []
    for _ in range(5):
        barrier()
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        out.append((time.perf_counter() - t) / iters)
    return out


def parts(size: int, iters: int) -> dict:
    import minidist.distributed as dist
    from minidist.backend import xp
    from minidist.comm.collectives import oneshot
    from minidist.comm.collectives.all_reduce import make_plan
    from minidist.comm.group import resolve
    from minidist.comm.transport.board import ticket_of
    from minidist.comm.transport.reduce_op import fold_in_order
    g = resolve(None)
    t = g.transport
    x = xp.zeros(size // 4, dtype="float32")   # zeros: sums that stay finite
    plan = make_plan(g, "allgather", x, dist.ReduceOp.SUM)
    if not oneshot.through_board(plan):
        raise SystemExit(f"{size} bytes do not go through the board here")
    for _ in range(10):
        dist.all_reduce(x)
    out = {"all_reduce": _windows(lambda: dist.all_reduce(x), iters, dist.barrier),
           "one-shot": _windows(lambda: oneshot.call(g, x, plan), iters, dist.barrier)}

    def flag_round():
        g.next_collective_tag()
        ticket = ticket_of(g.ctx, g.calls)
        t.board_claim("flag round")
        t.board_post(ticket, plan.nbytes, plan.code, plan.peers)
        t.board_wait(plan.peers, ticket, "flag round")
        t.board.ack(plan.peers)
    out["flag round"] = _windows(flag_round, iters, dist.barrier)

    def copy_in():
        plan.mine[...] = x
    out["copy in"] = _windows(copy_in, iters, dist.barrier)

    def fold():
        fold_in_order(plan.by_rank, x, plan.combine, plan.op)
    out["fold"] = _windows(fold, iters, dist.barrier)
    return out


ALPHA_ALGORITHMS = ("allgather", "recursive_doubling", "tree", "ring", "naive", "direct")


def alpha_sweep(size: int, iters: int) -> dict:
    import minidist.distributed as dist
    from minidist.backend import xp
    x = xp.zeros(size // 4, dtype="float32")
    out = {}
    for alg in ALPHA_ALGORITHMS:
        for _ in range(10):
            dist.all_reduce(x, algorithm=alg)
        out[alg] = _windows(lambda: dist.all_reduce(x, algorithm=alg), iters, dist.barrier)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worlds", type=positive_int, nargs="+", default=[2])
    p.add_argument("--size", type=byte_size, default=1 << 10)
    p.add_argument("--iters", type=positive_int, default=2000)
    p.add_argument("--alpha-size", type=byte_size, default=64)
    args = p.parse_args()
    from minidist.comm import World
    from _collective_bench import human, slowest_rank
    for n in args.worlds:
        with World(n) as world:
            best = slowest_rank(world.run(parts, args.size, args.iters))
        rest = best["one-shot"] - best["flag round"] - best["copy in"] - best["fold"]
        print(f"world {n}, all_reduce of {human(args.size)} float32, microseconds per call")
        for key in ("all_reduce", "one-shot", "flag round", "copy in", "fold"):
            print(f"  {key:<40} {best[key] * 1e6:7.2f}")
        print(f"  {'Python of the one-shot call (the rest)':<40} {rest * 1e6:7.2f}")
        print(f"  {'api.py dispatch (all_reduce - one-shot)':<40} "
              f"{(best['all_reduce'] - best['one-shot']) * 1e6:7.2f}")
        iters = max(1, args.iters // 4)
        with World(n) as world:
            alphas = slowest_rank(world.run(alpha_sweep, args.alpha_size, iters))
        with World(n, env={"MINIDIST_BOARD": "0"}) as world:
            channels = slowest_rank(world.run(alpha_sweep, args.alpha_size, iters))
        print(f"world {n}, alpha: microseconds per all_reduce of {human(args.alpha_size)}")
        print(f"  {'allgather, through the board':<40} {alphas['allgather'] * 1e6:7.2f}")
        print(f"  {'allgather, through the channels':<40} {channels['allgather'] * 1e6:7.2f}")
        for alg in ALPHA_ALGORITHMS[1:]:
            print(f"  {alg:<40} {min(alphas[alg], channels[alg]) * 1e6:7.2f}")


if __name__ == "__main__":
    main()
