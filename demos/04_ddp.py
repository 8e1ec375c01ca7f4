"""Demo 04: data parallelism equals one process, and its buckets overlap backward.

N processes each take 1/N of every global batch, run forward and backward on
it, and average their gradients with DistributedDataParallel (buckets of
gradients all-reduced while backward goes on). The same steps are then taken
in this one process on the whole batch; in float64 the parameters agree to the
last few bits:

    g = (1/N) sum_r g_r  =  gradient of the mean loss over the N*B samples

The model is a stack of ``--layers`` MLP blocks (4 parameter tensors each).
It prints max |ddp - single| (and the naive DDP's), the number of all-reduces
side by side (naive: one per parameter per step; bucketed: one per bucket),
whether the link between ranks is emulated and at what speed, and the bucket
timeline of the last step: when each bucket's gradients were ready, when its
all-reduce ran in the background, relative to the end of backward, and the
fraction of the communication hidden behind backward.

    python demos/04_ddp.py                # 4 processes, ~5 s
    minidist run -n 4 demos/04_ddp.py     # the same, each process a rank of minidist run
    python demos/04_ddp.py -n 2 --steps 5 --bucket-mb 0.05
    python demos/04_ddp.py --figure /tmp/buckets.png   # also draw the timeline
    python demos/04_ddp.py --link-gbps 0.5   # bytes take time on a wire: watch overlap
    MINIDIST_LINK_GBPS=0.5 python demos/04_ddp.py      # the same, from the environment

With --figure PATH (no figure without it) it saves that bucket timeline as a
PNG (needs matplotlib).

Code: minidist/parallel/data/ddp.py (bucketed), naive.py (the oracle), buckets.py.
"""
import argparse
import sys

import numpy as np

from minidist import backend
from minidist import distributed as dist
from minidist.comm import World
from minidist.autograd import Tensor
from minidist.nn import MLP, Sequential
from minidist.comm.transport.link import ENV as LINK_ENV, link_bytes_per_s
from minidist.optim import AdamW
from minidist.parallel.data.timeline import render
from _args import positive, positive_int

TOLERANCE = 1e-12


def link_line(link_gbps):
    """Say whether bytes take time on an emulated wire, and how fast it is."""
    gbps, source = link_gbps, "--link-gbps"
    if gbps is None:
        gbps, source = link_bytes_per_s(None) / 1e9, f"{LINK_ENV}"
    if gbps:
        return (f"link: emulated, {gbps:g} GB/s between each pair of ranks (set by {source}; "
                f"comm/transport/link.py)")
    return (f"link: shared memory, no emulated wire (the CPUs copy every byte); "
            f"--link-gbps or {LINK_ENV} emulates one")


def data(args):
    rng = np.random.default_rng(0)
    shape = (args.steps, args.world_size * args.batch)
    return rng.standard_normal(shape + (args.width,)), rng.standard_normal(shape + (args.width,))


def loss_of(out, y):
    diff = out - Tensor(backend.from_host(y))
    return (diff * diff).mean()


def make_model(args, seed):
    gen = backend.Generator(seed)
    return Sequential(*[MLP(args.width, 4 * args.width, dtype="float64", generator=gen)
                        for _ in range(args.layers)])


def train_rank(args, naive):
    """One rank: its slice of every batch, DDP (or naive DDP), AdamW."""
    from minidist.backend import from_host, to_host
    from minidist.distributed import get_rank, get_stats
    from minidist.parallel import DataParallelNaive, DistributedDataParallel
    rank, b = get_rank(), args.batch
    model = make_model(args, rank)   # different weights per rank: DDP broadcasts rank 0's
    ddp = DataParallelNaive(model) if naive else \
        DistributedDataParallel(model, bucket_cap_mb=args.bucket_mb)
    opt = AdamW(model.parameters(), lr=1e-3)
    x, y = data(args)
    before = get_stats().per_collective.get("all_reduce", {}).get("calls", 0)
    for s in range(args.steps):
        out = ddp(Tensor(from_host(x[s, rank * b:(rank + 1) * b])))
        loss_of(out, y[s, rank * b:(rank + 1) * b]).backward()
        if naive:
            ddp.sync_gradients()
        opt.step()
        opt.zero_grad()
    calls = get_stats().per_collective["all_reduce"]["calls"] - before
    params = {n: to_host(p.data).copy() for n, p in model.named_parameters()}
    timeline = [] if naive else ddp.timeline
    buckets = 0 if naive else len(ddp.buckets)
    return params, calls, timeline, buckets


def train_single(args):
    model = make_model(args, 0)
    opt = AdamW(model.parameters(), lr=1e-3)
    x, y = data(args)
    for s in range(args.steps):
        loss_of(model(Tensor(backend.from_host(x[s]))), y[s]).backward()
        opt.step()
        opt.zero_grad()
    return {n: backend.to_host(p.data).copy() for n, p in model.named_parameters()}


def difference(params, single) -> float:
    """max |ddp - single| over every parameter of one rank."""
    return max(float(np.max(np.abs(params[k] - single[k]))) for k in single)


def worst_over_ranks(diff: float) -> float:
    """Under minidist run / mpiexec: the largest of every rank's difference (all_reduce MAX)."""
    t = backend.from_host(np.array([diff]))
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(backend.to_host(t)[0])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", "--world-size", type=positive_int, default=4)
    parser.add_argument("--steps", type=positive_int, default=10)
    parser.add_argument("--batch", type=positive_int, default=8, help="samples per rank per step")
    parser.add_argument("--width", type=positive_int, default=256)
    parser.add_argument("--layers", type=positive_int, default=4, help="MLP blocks, 4 tensors each")
    parser.add_argument("--bucket-mb", type=positive, default=4.5)
    parser.add_argument("--figure", metavar="PATH",
                        help="save the timeline as a PNG (default: none)")
    parser.add_argument("--link-gbps", type=positive, default=None,
                        help="emulate a link of this many GB/s between ranks (comm/transport/link.py)")
    args = parser.parse_args()

    if dist.launched():  # minidist run / mpiexec started us: we are one rank of the world
        dist.init_process_group()
        args.world_size = dist.get_world_size()
        single = train_single(args)
        mine = {naive: train_rank(args, naive) for naive in (True, False)}
        worst_of = {naive: worst_over_ranks(difference(mine[naive][0], single))
                    for naive in (True, False)}
        if dist.get_rank() != 0:
            sys.exit(0)      # rank 0 prints and checks
        results = {naive: [mine[naive]] for naive in (True, False)}
    else:
        single = train_single(args)
        results = {}
        with World(args.world_size, link_gbps=args.link_gbps) as world:
            for naive in (True, False):
                results[naive] = world.run(train_rank, args, naive)
        worst_of = {naive: max(difference(r[0], single) for r in results[naive])
                    for naive in (True, False)}
    n_params = len(single)
    print(f"{args.world_size} ranks x {args.batch} samples, {args.steps} AdamW steps, "
          f"{args.layers} x MLP({args.width}) in float64, {n_params} parameter tensors")
    print(link_line(args.link_gbps) + "\n")
    worst = 0.0
    for naive, label in ((True, "naive DDP"), (False, "bucketed DDP")):
        diff = worst_of[naive]
        worst = max(worst, diff)
        print(f"{label:<13} max |ddp - single| = {diff:.1e}")
    _, _, timeline, buckets = results[False][0]
    naive_calls, bucket_calls = results[True][0][1], results[False][0][1]
    print(f"\n{'':<22}{'naive':>8}{'bucketed':>10}")
    print(f"{'parameter tensors':<22}{n_params:>8}{n_params:>10}")
    print(f"{'buckets':<22}{'-':>8}{buckets:>10}   (<= {args.bucket_mb} MB each)")
    print(f"{'all-reduces per step':<22}{naive_calls / args.steps:>8.0f}"
          f"{bucket_calls / args.steps:>10.0f}")
    print(f"{'all-reduces in all':<22}{naive_calls:>8}{bucket_calls:>10}")
    print("\nbucket timeline of the last step on rank 0 (ms after forward ended; "
          "'.' ready and queued, '#' all-reducing, '|' backward ended):")
    print(render(timeline))
    if args.figure:
        from _figures import bucket_timeline
        bucket_timeline(args.figure, timeline, args.world_size, args.bucket_mb)
    ok = worst <= TOLERANCE
    print(f"\ncheck: max |ddp - single| = {worst:.1e}  (tolerance {TOLERANCE:.0e})  "
          f"{'ok' if ok else 'FAILED'}")
    sys.exit(0 if ok else 1)
