"""Demo 13: diagnosing a data-parallel run (source documents, exercise 35.23).

Four ranks train an MLP with DataParallelNaive. At one step, one rank goes
wrong in two quiet ways real jobs do: a bit of its synced gradient is
corrupted (bad memory, a stray in-place write), and it logs its own local
loss instead of the all-reduced one. Nothing crashes. The diagnostics of
minidist/parallel/diagnostics.py catch both, at O(1) data per rank per step:

    (a) ||g_r|| per rank, before and after the gradient sync: after it, every
        rank must hold the same gradient, so the norms must be bitwise equal;
    (b) the loss each rank logs, gathered and compared to the last bit;
    (c) time in each collective vs compute, as a table at the end.

    python demos/13_diagnostics.py                 # 4 processes, ~5 s
    python demos/13_diagnostics.py --bug-step -1   # a healthy run: nothing flagged
"""
import argparse
import sys
import time

import numpy as np

from minidist.comm import World
from _args import non_negative_int, positive_int
from _launched import one_process_only


def train_rank(args):
    """One rank's training loop, with the diagnostics recorded every step."""
    from minidist.autograd import Tensor
    from minidist.backend import Generator, from_host
    from minidist.distributed import ReduceOp, all_reduce, get_rank, get_stats
    from minidist.nn import MLP
    from minidist.optim import SGD
    from minidist.parallel import DataParallelNaive
    from minidist.parallel.diagnostics import Diagnostics, check_loss_sync, grad_norms_per_rank

    rank = get_rank()
    model = DataParallelNaive(MLP(args.width, 4 * args.width, generator=Generator(0)))
    opt = SGD(model.parameters(), lr=0.05)
    rng = np.random.default_rng(100 + rank)           # each rank its own data
    diag = Diagnostics()
    get_stats().reset()
    start = time.perf_counter()
    for step in range(args.steps):
        x = Tensor(from_host(rng.standard_normal((args.batch, args.width)).astype("float32")))
        out = model(x)
        loss = (out * out).mean()                      # any loss will do
        opt.zero_grad()
        loss.backward()
        before = grad_norms_per_rank(model.parameters())
        model.sync_gradients()
        buggy = step == args.bug_step and rank == args.bug_rank
        if buggy:                                      # silent corruption of one element
            first = next(iter(model.parameters()))
            first.grad.reshape(-1)[0] += 1e-3
        after = grad_norms_per_rank(model.parameters())
        logged = from_host(np.array([loss.item()], dtype="float64"))
        if not buggy:                                  # the right thing: log the global mean
            all_reduce(logged, op=ReduceOp.AVG)
        else:                                          # the bug: skip it on this rank...
            all_reduce(from_host(np.zeros(1)), op=ReduceOp.AVG)  # ...but keep the collectives paired
        diag.record(step, before, after, check_loss_sync(float(logged[0])))
        opt.step()
    seconds = time.perf_counter() - start
    return diag.problems(), diag.report(seconds) if rank == 0 else ""


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", "--world-size", type=positive_int, default=4)
    parser.add_argument("--steps", type=positive_int, default=6)
    parser.add_argument("--batch", type=positive_int, default=16, help="samples per rank per step")
    parser.add_argument("--width", type=positive_int, default=128)
    parser.add_argument("--bug-step", type=int, default=3, help="-1: no bug")
    parser.add_argument("--bug-rank", type=non_negative_int, default=1)
    args = parser.parse_args()
    one_process_only("it starts its own world of --world-size ranks to run and diagnose")
    if not -1 <= args.bug_step < args.steps or args.bug_rank >= args.world_size:
        parser.error(f"--bug-step must be -1 or a step below --steps ({args.steps}), and "
                     f"--bug-rank a rank below -n ({args.world_size}); got {args.bug_step}, "
                     f"{args.bug_rank}")

    with World(args.world_size) as world:
        results = world.run(train_rank, args)
    problems, report = results[0]
    print(report)
    print("\nflagged:" if problems else "\nflagged: nothing")
    for p in problems:
        print("  " + p)
    expected = [] if args.bug_step < 0 else [
        f"step {args.bug_step}: gradient norms differ after sync on ranks [{args.bug_rank}]",
        f"step {args.bug_step}: logged losses differ"]
    same_everywhere = all(r[0] == problems for r in results)
    ok = same_everywhere and len(problems) == len(expected) and all(
        p.startswith(e) for p, e in zip(problems, expected))
    print(f"\ncheck: every rank flags {'nothing' if not expected else f'step {args.bug_step} on rank {args.bug_rank}'}"
          f" and nothing else: {'ok' if ok else 'FAILED'}")
    sys.exit(0 if ok else 1)
