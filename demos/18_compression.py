"""Demo 18: compress what DDP sends: fp16 and PowerSGD on a slow link.

The same model is trained with DDP five times on an emulated slow link, once
per communication hook (minidist/parallel/data/hooks.py, powersgd.py):

    none        float32 all-reduce:              2(N-1)/N * 4 bytes per number
    fp16        rounded to fp16 and summed there: half the bytes
    PowerSGD r  rank-r approximation of each gradient matrix: r(n + m) numbers
                instead of n * m (Vogels et al. 2019), with error feedback

It prints, per hook, the loss after the last step, the wall time, and the bytes
each rank sent, and checks that every hook still trains (its last loss is
below its first) and that every compression sends fewer bytes than no hook.

    python demos/18_compression.py                     # 2 ranks, 0.5 GB/s link, ~20 s
    python demos/18_compression.py --figure /tmp/c.png # loss vs step, vs time, bytes

With --figure PATH (no figure without it) it draws the three panels (needs
matplotlib).
"""
import argparse
import sys
import time

from minidist.comm import World
from _args import positive, positive_int
from _launched import one_process_only
from _teacher import tanh_mlp
from _teacher import teacher as teacher_matrix


def train_rank(args, hook):
    """One rank: a 3-layer tanh MLP regressing a fixed random teacher, SGD."""
    import minidist.distributed as dist
    from minidist.autograd import Tensor
    from minidist.backend import Generator, xp
    from minidist.optim import SGD
    from minidist.parallel import DistributedDataParallel
    from minidist.parallel.data import hooks, powersgd

    w = args.width
    model = tanh_mlp(w)
    ddp = DistributedDataParallel(model, bucket_cap_mb=args.bucket_mb)
    if hook == "fp16":
        ddp.register_comm_hook(None, hooks.fp16_compress_hook)
    elif hook.startswith("PowerSGD"):
        rank = int(hook.split()[-1])
        ddp.register_comm_hook(powersgd.PowerSGDState(None, rank, start_powerSGD_iter=2),
                               powersgd.powerSGD_hook)
    teacher = teacher_matrix(w)
    data = Generator(100 + dist.get_rank())
    opt = SGD(model.parameters(), lr=args.lr, momentum=0.9)
    stats = dist.get_stats()
    sent0, start = stats.bytes_sent, time.perf_counter()
    losses, times = [], []
    for _ in range(args.steps):
        x = data.normal((args.batch, w))
        y = Tensor(xp.tanh(x @ teacher))                 # (B, w) the teacher's answer
        diff = ddp(Tensor(x)) - y
        loss = (diff * diff).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.item()))               # rank 0's own batch
        times.append(time.perf_counter() - start)
    return dict(losses=losses, times=times, bytes=stats.bytes_sent - sent0)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", "--world-size", type=positive_int, default=2)
    parser.add_argument("--steps", type=positive_int, default=60)
    parser.add_argument("--width", type=positive_int, default=256)
    parser.add_argument("--batch", type=positive_int, default=64, help="samples per rank per step")
    parser.add_argument("--lr", type=positive, default=1.0)
    parser.add_argument("--bucket-mb", type=positive, default=1.0)
    parser.add_argument("--link-gbps", type=positive, default=0.5,
                        help="the emulated link between ranks, GB/s (comm/transport/link.py)")
    parser.add_argument("--figure", metavar="PATH", help="save the three panels as a PNG")
    args = parser.parse_args()
    one_process_only("it starts its own world, on an emulated link of --link-gbps")

    hooks = ["none", "fp16", "PowerSGD 1", "PowerSGD 2", "PowerSGD 4"]
    runs = {}
    with World(args.world_size, link_gbps=args.link_gbps) as world:
        for hook in hooks:
            runs[hook] = world.run(train_rank, args, hook)[0]
    print(f"{args.world_size} ranks, 3 x Linear({args.width}) MLP, {args.steps} SGD steps, "
          f"emulated link of {args.link_gbps:g} GB/s (PowerSGD from step 3)\n")
    print(f"{'hook':<12}{'first loss':>12}{'last loss':>12}{'wall s':>9}{'MB sent':>10}")
    for hook, r in runs.items():
        print(f"{hook:<12}{r['losses'][0]:>12.4f}{r['losses'][-1]:>12.4f}"
              f"{r['times'][-1]:>9.2f}{r['bytes'] / 1e6:>10.2f}")
    if args.figure:
        from _figures import compression
        compression(args.figure, runs)
    trains = all(r["losses"][-1] < r["losses"][0] for r in runs.values())
    smaller = all(runs[h]["bytes"] < runs["none"]["bytes"] for h in hooks[1:])
    ok = trains and smaller
    print(f"\ncheck: every hook trains (last loss < first): {trains}; "
          f"every compression sends fewer bytes than none: {smaller}  {'ok' if ok else 'FAILED'}")
    sys.exit(0 if ok else 1)
