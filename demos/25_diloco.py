"""Demo 25: when the network is the bottleneck: DiLoCo and Streaming DiLoCo.

Four ranks as two islands of two (ranks 0, 1 and 2, 3), a fast emulated link inside
an island and a slow one between them (comm/transport/link.py). The same model is
trained four ways (minidist/parallel/diloco/):

    DDP              every step, an all-reduce over all four ranks, across the slow link
    DiLoCo H         DDP inside each island (fast link); every H steps the two islands
                     average theta_global - theta_local over the slow link and take one
                     outer Nesterov step (lr 0.7, momentum 0.9)
    Streaming F      the same with the model in F fragments synchronised in turn,
                     overlapped with tau = 1 inner step, mixed back with alpha = 0.5, the
                     outer gradients rounded to 4-bit E3M0 (one power-of-two scale each)

It prints, per run, the held-out loss at the end, the wall time, and the bytes each
rank sent across the islands, and checks that every run trains and that DiLoCo sends
at most 1/H of DDP's bytes across the slow link (``minidist calc diloco`` has the model).

    python demos/25_diloco.py                        # ~30 s on 2 cores
    python demos/25_diloco.py --figure /tmp/d.png    # loss vs time and vs slow-link bytes
"""
import argparse
import contextlib
import sys
import time

from minidist.comm import World
from _args import positive, positive_int
from _launched import one_process_only
from _teacher import tanh_mlp
from _teacher import teacher as teacher_matrix


def train_rank(args, how):
    """One rank: a 3-layer tanh MLP regressing a fixed random teacher (AdamW inner)."""
    import minidist.distributed as dist
    from minidist.autograd import Tensor, no_grad
    from minidist import backend
    from minidist.backend import Generator, xp
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.optim import SGD, AdamW
    from minidist.parallel import DistributedDataParallel
    from minidist.parallel.diloco import DiLoCo

    w = args.width
    model = tanh_mlp(w)
    mesh = init_device_mesh(backend.device_type(), (2, 2), mesh_dim_names=("island", "local"))
    kind, H, F = how
    slow = mesh.get_group("island") if kind != "DDP" else None     # the groups that cross
    ddp = DistributedDataParallel(model, group=None if kind == "DDP" else mesh.get_group("local"))
    inner = AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    diloco = contextlib.nullcontext()
    if kind != "DDP":
        outer = SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
        layers = [model[0], model[2], model[4]]
        fragments = [layers[:2], layers[2:]] if F == 2 else None
        diloco = DiLoCo(model, inner, outer, sync_every=H, group=mesh["island"],
                        fragments=fragments, fragment_sync_delay=1 if F > 1 else 0,
                        fragment_update_alpha=0.5 if F > 1 else 0.0,
                        outer_grad_format="e3m0" if F > 1 else None)
    teacher = teacher_matrix(w)
    data = Generator(100 + dist.get_rank())
    held_x = Generator(7).normal((256, w))
    held_y = xp.tanh(held_x @ teacher)
    stats = dist.get_stats(slow)
    sent0, start = stats.bytes_sent, time.perf_counter()
    losses, times, sent = [], [], []
    with diloco:                                   # DiLoCo's hook is on inside the with
        for _ in range(args.steps):
            x = data.normal((args.batch, w))
            diff = ddp(Tensor(x)) - Tensor(xp.tanh(x @ teacher))
            (diff * diff).mean().backward()
            inner.step()                           # every H-th (H/F-th) also synchronises
            inner.zero_grad()
            with no_grad():
                d = model(Tensor(held_x)) - Tensor(held_y)
                losses.append(float((d * d).mean().item()))
            times.append(time.perf_counter() - start)
            sent.append(stats.bytes_sent - sent0)
    return dict(losses=losses, times=times, sent=sent)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=positive_int, default=100)
    parser.add_argument("--width", type=positive_int, default=128)
    parser.add_argument("--batch", type=positive_int, default=32, help="samples per rank per step")
    parser.add_argument("--lr", type=positive, default=3e-3)
    parser.add_argument("--fast-gbps", type=positive, default=2.0, help="inside an island, GB/s")
    parser.add_argument("--slow-gbps", type=positive, default=0.01, help="between islands, GB/s")
    parser.add_argument("--figure", metavar="PATH", help="save the two panels as a PNG")
    args = parser.parse_args()
    one_process_only("it starts its own world of 2 islands x 2 ranks")

    runs = {"DDP": ("DDP", 1, 1), "DiLoCo H=10": ("DiLoCo", 10, 1),
            "DiLoCo H=50": ("DiLoCo", 50, 1), "Streaming F=2, e3m0": ("DiLoCo", 10, 2)}
    results = {}
    with World(4, node_size=2, link_gbps=args.fast_gbps, inter_node_gbps=args.slow_gbps) as world:
        for label, how in runs.items():
            results[label] = world.run(train_rank, args, how)[0]
    print(f"2 islands x 2 ranks ({args.fast_gbps:g} GB/s inside, {args.slow_gbps:g} GB/s between), "
          f"3 x Linear({args.width}) MLP, {args.steps} AdamW steps\n")
    print(f"{'run':<22}{'first loss':>11}{'last loss':>11}{'wall s':>8}{'MB across':>11}")
    for label, r in results.items():
        print(f"{label:<22}{r['losses'][0]:>11.4f}{r['losses'][-1]:>11.4f}"
              f"{r['times'][-1]:>8.2f}{r['sent'][-1] / 1e6:>11.3f}")
    if args.figure:
        from _figures import diloco_runs
        diloco_runs(args.figure, results)
    trains = all(r["losses"][-1] < r["losses"][0] for r in results.values())
    ddp = results["DDP"]["sent"][-1]
    fewer = all(results[f"DiLoCo H={h}"]["sent"][-1] * h <= ddp for h in (10, 50))
    ok = trains and fewer
    print(f"\ncheck: every run trains (last loss < first): {trains}; DiLoCo sends <= 1/H of "
          f"DDP's bytes across the islands: {fewer}  {'ok' if ok else 'FAILED'}")
    sys.exit(0 if ok else 1)
