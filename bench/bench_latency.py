"""Where the time of a small all-reduce (or all-to-all) goes: the latency path, taken apart.

    python bench/bench_latency.py                 # world 2, 1 KiB of float32
    python bench/bench_latency.py --worlds 2 4 --size 16K
    python bench/bench_latency.py --collective all_to_all_single --size 4K
    python bench/bench_latency.py --ab 9          # the call path: before / now, in turn

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

With ``--collective all_to_all_single`` (N equal parts) the same for the
all-to-all's path through the board (alltoall_board.py):

    all_to_all_single  dist.all_to_all_single(y, x): the whole call
    board call         alltoall_board.call: without api.py's lookup of the split plan
    flag round         as above
    copy in            x into my slot (one rank, no peer)
    copy out           part r of every slot into y, in rank order (one rank, no peer)

On a machine shared with other work every part that waits for a peer moves
with the load. So at world 2 it also times rank 0 alone ("one rank alone"):
before each call rank 0 writes, for rank 1, the two words a peer would (its
ticket for that call, its acknowledgement of rank 0's last post) with rank 1's
record and counts as rank 0's own, so ``dist.all_reduce`` and
``dist.all_to_all_single`` run their whole path without waiting: what is left
is one rank's own work (Python, copy, fold), which a burst of load elsewhere
lengthens far less than a wait for a peer.

With ``--ab ROUNDS`` it only compares the call path of the latency path
before its last cuts (``calls_before``: the flight recorder reading its own
clock, the stats added counter by counter, each record copied to compare it,
the copy in through backend.to_host) and of now, switched round by round in
the same processes:
dist.all_reduce, dist.all_to_all_single and a send / recv round trip on both
ranks, and rank 0 alone; it prints the best round of each and the median of
now / before per round (on a loaded machine only the ratio counts).

Then the alpha of each algorithm (``--alpha-size``, 64 bytes: the time of a call
that moves next to nothing), ``allgather`` both through the board and, in a
world started with MINIDIST_BOARD=0, through the channels (the Bruck rounds).
"""
from __future__ import annotations

import argparse
import time

from _args import byte_size, positive_int

# What the call path of before (``calls_before``) uses, imported once here: an
# import inside a function costs a microsecond per call.
from minidist import backend
from minidist.comm.collectives import alltoall_board, oneshot
from minidist.comm.transport.board import ticket_of
from minidist.comm.transport.reduce_op import finish
from minidist.trace import recorder as trace


def _windows(fn, iters: int, barrier) -> list[float]:
    out = []
    for _ in range(5):
        barrier()
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        out.append((time.perf_counter() - t) / iters)
    return out


def flag_round(g, peers: list[int]):
    """The board alone, for one call: claim, post, wait, acknowledge (no data)."""
    from minidist.comm.transport.board import ticket_of
    t = g.transport

    def one_round():
        g.next_collective_tag()
        ticket = ticket_of(g.ctx, g.calls)
        t.board_claim("flag round")
        t.board_post(ticket, 0, 0, peers)
        t.board_wait(peers, ticket, "flag round")
        t.board.ack(peers)
    return one_round


def parts(size: int, iters: int) -> dict:
    import minidist.distributed as dist
    from minidist.backend import xp
    from minidist.comm.collectives import oneshot
    from minidist.comm.collectives.all_reduce import make_plan
    from minidist.comm.group import resolve
    from minidist.comm.transport.reduce_op import fold_in_order
    g = resolve(None)
    x = xp.zeros(size // 4, dtype="float32")   # zeros: sums that stay finite
    plan = make_plan(g, "allgather", x, dist.ReduceOp.SUM)
    if not oneshot.through_board(plan):
        raise SystemExit(f"{size} bytes do not go through the board here")
    for _ in range(10):
        dist.all_reduce(x)
    out = {"all_reduce": _windows(lambda: dist.all_reduce(x), iters, dist.barrier),
           "one-shot": _windows(lambda: oneshot.call(g, x, plan), iters, dist.barrier)}

    out["flag round"] = _windows(flag_round(g, plan.peers), iters, dist.barrier)

    def copy_in():
        plan.mine[...] = x
    out["copy in"] = _windows(copy_in, iters, dist.barrier)

    def fold():
        fold_in_order(plan.by_rank, x, plan.combine, plan.op)
    out["fold"] = _windows(fold, iters, dist.barrier)
    return out


def a2a_parts(size: int, iters: int) -> dict:
    """The parts of an all_to_all_single of ``size`` bytes per rank, N equal parts."""
    import minidist.distributed as dist
    from minidist.backend import xp
    from minidist.comm.collectives import alltoall_board
    from minidist.comm.collectives.alltoall import source_of
    from minidist.comm.collectives.api import _move_parts
    from minidist.comm.group import resolve
    g = resolve(None)
    n = g.size
    count = size // 4 // n * n
    x, y = xp.ones(count, dtype="float32"), xp.ones(count, dtype="float32")
    splits = [count // n] * n
    for _ in range(10):
        dist.all_to_all_single(y, x, splits, splits)
    key = alltoall_board.call_key(x, y, splits, splits)
    sp = g.small_plans.get(key)
    if sp is None or not sp.everyone_fits:
        raise SystemExit(f"{size} bytes do not go through the board's slots here")
    out = {"all_to_all_single": _windows(lambda: dist.all_to_all_single(y, x, splits, splits),
                                         iters, dist.barrier),
           "board call": _windows(lambda: alltoall_board.call(g, y, x, sp, source_of,
                                                              _move_parts), iters, dist.barrier),
           "flag round": _windows(flag_round(g, sp.plan.peers), iters, dist.barrier)}

    def copy_in():
        sp.my_input[...] = x
    out["copy in"] = _windows(copy_in, iters, dist.barrier)

    def copy_out():
        alltoall_board._copy_out(g, sp, y, x, False)
    out["copy out"] = _windows(copy_out, iters, dist.barrier)
    return out


def alone(size: int, iters: int, rounds: int = 0) -> dict:
    """Rank 0's whole all_reduce and all_to_all_single of ``size`` bytes, rank 1's
    part played by rank 0 (the module docstring); rank 1 waits meanwhile.
    With ``rounds``: each call timed ``rounds`` times with the call path of
    before and of now in turn (``NOTES``), as ``"name (notes)": [seconds per round]``."""
    import minidist.distributed as dist
    from minidist.backend import xp
    from minidist.comm.collectives.alltoall_board import board_plan
    from minidist.comm.group import resolve
    from minidist.comm.transport.base import host_view
    from minidist.comm.transport.board import T_TICKET, ticket_of
    g = resolve(None)
    board, words = g.transport.board, g.transport.board._words
    x, y = xp.zeros(size // 4, dtype="float32"), xp.zeros(size // 4, dtype="float32")
    half = [size // 8, size // 8]
    calls = {"all_reduce": lambda: dist.all_reduce(x),
             "all_to_all_single": lambda: dist.all_to_all_single(y, x, half, half)}
    for call in calls.values():
        call()                                # plans made, rank 1's record and counts seen
    dist.barrier()
    out = {}
    if g.rank == 0:
        number = g.calls                      # restored after, for the last barrier

        def as_rank_1():                      # its ticket for my next call, its ack of my post
            words[board.head[1] + T_TICKET] = ticket_of(g.ctx, g.calls + 1)
            words[board.acks[1]] = board.owed[1]
        a2a = board_plan(g, x.dtype, ())
        records = {"all_reduce": g.small_plans[("call", x.shape, x.dtype, dist.ReduceOp.SUM,
                                                 "auto")].record,
                   "all_to_all_single": a2a.record}
        for name, call in calls.items():
            board.records[1][:] = host_view(records[name])   # rank 1 makes my call
            if name == "all_to_all_single":
                posted = next(iter(a2a.split_plans.values())).posted
                a2a.counts[1][:] = posted          # equal splits: rank 1 posts what I post

            def both(call=call):
                as_rank_1()
                call()
            no_barrier = lambda: None      # noqa: E731  (rank 1 is not in these calls)
            if not rounds:
                whole = min(_windows(both, iters, no_barrier))
                out[name] = whole - min(_windows(as_rank_1, iters, no_barrier))
                continue
            for _ in range(rounds):
                for notes, use in NOTES.items():
                    use(g.transport)
                    whole = min(_windows(both, iters, no_barrier))
                    out.setdefault(f"{name} ({notes})", []).append(
                        whole - min(_windows(as_rank_1, iters, no_barrier)))
            calls_now(g.transport)
        g._calls = number
    dist.barrier()
    return out


def recorder_before(buf, offset: int, rank: int):
    """flight.py's Recorder as it was before the latency path shared its clock
    readings (the "before" of ``--ab``): ``begin`` and ``end`` read the wall clock
    themselves (time.time_ns, microseconds into the int64 words 4, 5)."""
    import time as clock
    from minidist.comm.transport import flight

    class Before(flight.Recorder):
        def begin(self, ctx, number, ranks, text, now=None):
            w = self._words
            w[1] = 0
            if ranks is not self._last_ranks and tuple(ranks) != self._last_key:
                self._last_ranks, self._last_key = ranks, tuple(ranks)
                flight.write_ranks(w, ranks)
            if text is not self._last_text:
                self._last_text = text
                data = text.encode()[:flight.TEXT_MAX]
                self._text[:len(data)] = data
                w[6] = len(data)
            if ctx != self._ctx:
                self._ctx = w[2] = ctx
            self._calls += 1
            self._number = w[3] = number
            w[0] = self._calls
            w[4] = clock.time_ns() // 1000
            w[1] = flight.IN_CALL

        def end(self, now=None):
            w = self._words
            w[5] = clock.time_ns() // 1000
            if self._number >= 0:
                if self._ctx != self._done_ctx:
                    self._done_ctx = w[flight.DONE_WORD] = self._ctx
                w[flight.DONE_WORD + 1] = self._number + 1
            w[1] = flight.FINISHED
    return Before(buf, offset, rank)


def oneshot_call_before(group, tensor, plan) -> None:
    """oneshot.call as it was: its own clock readings in the recorder, the
    stats added counter by counter (stats.add), each peer's record copied to
    compare it (oneshot.check_posts), the copy in through backend.to_host."""
    tag = group.next_collective_tag()
    start = time.perf_counter()
    number = group.calls
    t = group.transport
    board = t.board
    ticket = ticket_of(group.ctx, number)
    t.board_claim(plan.line)
    plan.mine[...] = backend.to_host(tensor)
    if plan.record is not None and board.posted_record is not plan.record:
        board.records[plan.me][:] = backend.to_host(memoryview(plan.record))
        board.posted_record = plan.record
    t.board_post(ticket, plan.nbytes, plan.code, plan.peers)
    t.record_begin(group.ctx, number, group.ranks, plan.line)
    strays = t.board_wait(plan.peers, ticket, plan.line)
    if strays:
        oneshot.another_way(group, plan, strays, tag)
    oneshot.check_posts(group, plan)
    xs = plan.by_rank if plan.on_host else [backend.from_host(x) for x in plan.by_rank]
    combine = plan.combine
    combine(xs[0], xs[1], tensor)
    for x in xs[2:]:
        combine(tensor, x, tensor)
    if plan.avg:
        finish(plan.op, tensor, len(xs))
    board.ack(plan.peers)
    t.record_end()
    stats = group.stats
    stats.add("all_reduce", plan.fields, plan.delta, time.perf_counter() - start)
    if trace.active is not None:
        trace.active.call("all_reduce", group.ranks, start, stats.last, group.group_desc)


def alltoall_call_before(group, output, input, sp, source_of, move) -> None:
    """alltoall_board.call as it was: the recorder's own clock readings, stats.add."""
    tag = group.next_collective_tag()
    start = time.perf_counter()
    stats = group.stats
    before = alltoall_board.board_all_to_all(group, output, input, sp, source_of, group.calls,
                                             tag, move)
    group.transport.record_end()
    if before is None:
        stats.add("all_to_all_single", sp.plan.fields, sp.tally.delta,
                  time.perf_counter() - start)
    else:
        stats.record("all_to_all_single", before, sp.plan.fields, time.perf_counter() - start)
    if trace.active is not None:
        trace.active.call("all_to_all_single", group.ranks, start, stats.last, group.group_desc)


_NOW: dict = {}   # the module attributes that ``calls_before`` replaces, as they are


def calls_before(t) -> None:
    """Put back, in this process, the call path of before (on transport ``t``):
    ``recorder_before``, ``oneshot_call_before``, ``alltoall_call_before``.
    A bench stand-in: nothing reads the records' times in a bench."""
    from minidist.comm.collectives import alltoall_board, oneshot
    from minidist.comm.transport import shm
    _NOW.setdefault("oneshot", oneshot.call)
    _NOW.setdefault("alltoall", alltoall_board.call)
    t._flight = recorder_before(t._seg.buf, shm.flight_offset(t.world_size), t.rank)
    oneshot.call = oneshot_call_before
    alltoall_board.call = alltoall_call_before


def calls_now(t) -> None:
    """The call path of now: flight.Recorder on ``t``, oneshot.call, alltoall_board.call."""
    from minidist.comm.collectives import alltoall_board, oneshot
    from minidist.comm.transport import flight, shm
    t._flight = flight.Recorder(t._seg.buf, shm.flight_offset(t.world_size), t.rank)
    oneshot.call = _NOW.get("oneshot", oneshot.call)
    alltoall_board.call = _NOW.get("alltoall", alltoall_board.call)


NOTES = {"before": calls_before, "now": calls_now}


def ab_calls(size: int, iters: int, rounds: int) -> dict:
    """dist.all_reduce, dist.all_to_all_single (N equal parts) and a send / recv
    round trip of ``size`` bytes, on every rank, timed ``rounds`` times with the
    call path of before and of now in turn (both ranks switch together)."""
    import minidist.distributed as dist
    from minidist.backend import xp
    from minidist.comm.group import resolve
    g = resolve(None)
    n, me = g.size, g.rank
    x, y = xp.zeros(size // 4 // n * n, dtype="float32"), xp.zeros(size // 4 // n * n,
                                                                    dtype="float32")
    parts = [x.size // n] * n
    peer = 1 - me

    def round_trip():      # rank 0 sends first, rank 1 answers: two messages, one each way
        if me == 0:
            dist.send(x, peer)
            dist.recv(y, peer)
        elif me == 1:
            dist.recv(y, peer)
            dist.send(x, peer)
    calls = {"all_reduce": lambda: dist.all_reduce(x),
             "all_to_all_single": lambda: dist.all_to_all_single(y, x, parts, parts),
             "send/recv round trip": round_trip}
    out: dict = {}
    for name, call in calls.items():
        for _ in range(10):
            call()
        for _ in range(rounds):
            for notes, use in NOTES.items():
                use(g.transport)
                out.setdefault(f"{name} ({notes})", []).append(
                    min(_windows(call, iters, dist.barrier)))
    calls_now(g.transport)
    return out


def print_ab(title: str, per_key: dict) -> None:
    """The best round of each variant, and now / before per round (loaded: only the ratio counts)."""
    print(title)
    names = list(dict.fromkeys(k.rsplit(" (", 1)[0] for k in per_key))   # in order
    for name in names:
        before, now = per_key[f"{name} (before)"], per_key[f"{name} (now)"]
        ratios = sorted(a / b for a, b in zip(now, before))
        print(f"  {name:<28} before {min(before) * 1e6:6.2f}  now {min(now) * 1e6:6.2f}  "
              f"now/before per round: median {ratios[len(ratios) // 2]:.3f} "
              f"[{ratios[0]:.3f}, {ratios[-1]:.3f}]")


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


def print_a2a_parts(n: int, size: int, best: dict) -> None:
    from _collective_bench import human
    rest = best["board call"] - best["flag round"] - best["copy in"] - best["copy out"]
    print(f"world {n}, all_to_all_single of {human(size)} float32 per rank, "
          f"microseconds per call")
    for key in ("all_to_all_single", "board call", "flag round", "copy in", "copy out"):
        print(f"  {key:<40} {best[key] * 1e6:7.2f}")
    print(f"  {'Python of the board call (the rest)':<40} {rest * 1e6:7.2f}")
    print(f"  {'api.py dispatch (whole - board call)':<40} "
          f"{(best['all_to_all_single'] - best['board call']) * 1e6:7.2f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worlds", type=positive_int, nargs="+", default=[2])
    p.add_argument("--size", type=byte_size, default=1 << 10)
    p.add_argument("--iters", type=positive_int, default=2000)
    p.add_argument("--alpha-size", type=byte_size, default=64)
    p.add_argument("--ab", type=positive_int, default=0, metavar="ROUNDS",
                   help="only the A/B of the call path (before / now), ROUNDS rounds in turn")
    p.add_argument("--collective", choices=("all_reduce", "all_to_all_single"),
                   default="all_reduce", help="whose parts to time (the alpha sweep: all_reduce's)")
    args = p.parse_args()
    from minidist.comm import World
    from _collective_bench import human, slowest_rank
    if args.ab:
        run_ab(args)
        return
    for n in args.worlds:
        if args.collective == "all_to_all_single":
            with World(n) as world:
                print_a2a_parts(n, args.size, slowest_rank(world.run(a2a_parts, args.size,
                                                                     args.iters)))
        else:
            with World(n) as world:
                print_parts(n, args.size, slowest_rank(world.run(parts, args.size, args.iters)))
        if n == 2:
            with World(n) as world:
                solo = world.run(alone, args.size, args.iters)[0]
            print(f"world 2, one rank alone (its peer's part played by itself; the whole "
                  f"call path, no wait), {human(args.size)}, microseconds per call")
            for key, t in solo.items():
                print(f"  {key:<40} {t * 1e6:7.2f}")
        if args.collective == "all_reduce":
            print_alphas(n, args.alpha_size, max(1, args.iters // 4))


def run_ab(args) -> None:
    """The A/B of the call path: world 2, one process per rank, before and now in turn."""
    from minidist.comm import World
    from _collective_bench import human
    with World(2) as world:
        per_rank = world.run(ab_calls, args.size, args.iters, args.ab)
    rounds = {k: [max(r[k][i] for r in per_rank) for i in range(args.ab)] for k in per_rank[0]}
    print_ab(f"world 2, {human(args.size)}, microseconds per call (slowest rank; best round)",
             rounds)
    with World(2) as world:
        solo = world.run(alone, args.size, args.iters, args.ab)[0]
    print_ab(f"world 2, one rank alone, {human(args.size)}, microseconds per call", solo)


def print_parts(n: int, size: int, best: dict) -> None:
    from _collective_bench import human
    rest = best["one-shot"] - best["flag round"] - best["copy in"] - best["fold"]
    print(f"world {n}, all_reduce of {human(size)} float32, microseconds per call")
    for key in ("all_reduce", "one-shot", "flag round", "copy in", "fold"):
        print(f"  {key:<40} {best[key] * 1e6:7.2f}")
    print(f"  {'Python of the one-shot call (the rest)':<40} {rest * 1e6:7.2f}")
    print(f"  {'api.py dispatch (all_reduce - one-shot)':<40} "
          f"{(best['all_reduce'] - best['one-shot']) * 1e6:7.2f}")


def print_alphas(n: int, alpha_size: int, iters: int) -> None:
    from minidist.comm import World
    from _collective_bench import human, slowest_rank
    with World(n) as world:
        alphas = slowest_rank(world.run(alpha_sweep, alpha_size, iters))
    with World(n, env={"MINIDIST_BOARD": "0"}) as world:
        channels = slowest_rank(world.run(alpha_sweep, alpha_size, iters))
    print(f"world {n}, alpha: microseconds per all_reduce of {human(alpha_size)}")
    print(f"  {'allgather, through the board':<40} {alphas['allgather'] * 1e6:7.2f}")
    print(f"  {'allgather, through the channels':<40} {channels['allgather'] * 1e6:7.2f}")
    for alg in ALPHA_ALGORITHMS[1:]:
        print(f"  {alg:<40} {min(alphas[alg], channels[alg]) * 1e6:7.2f}")

if __name__ == "__main__":
    main()
