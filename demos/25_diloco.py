"""Demo 25: when the network is the bottleneck: HSDP, DiLoCo and Streaming DiLoCo.

Four ranks as two islands of two (ranks 0, 1 and 2, 3), a fast emulated link inside
an island and a slow one between them (comm/transport/link.py). The same GPT learns
the shipped corpus five ways:

    DDP              every step, an all-reduce over all four ranks, across the slow link
    HSDP             fully_shard on the (island, local) mesh: the weights sharded inside an
                     island, each rank's gradient piece all-reduced across (M/2 per rank)
    DiLoCo H         fully_shard inside each island (fast link); every H steps the two
                     islands average theta_global - theta_local over the slow link and
                     take one outer Nesterov step (lr 0.7, momentum 0.9)
    Streaming F=2    the same with the model in 2 fragments synchronised in turn,
                     overlapped with tau = 1 inner step, mixed back with alpha = 0.5, the
                     outer gradients sent as 4-bit E3M0 codes (one power-of-two scale each)

It prints, per run, the held-out loss at the start and the end, the training time
(evaluation left out), and the bytes each rank put on the slow link
(``dist.get_link_bytes()``), and checks that every run trains, that DiLoCo puts at most
1/H of DDP's bytes on the slow link and that HSDP puts less than DDP's.

    python demos/25_diloco.py                        # ~40 s on 2 cores
    python demos/25_diloco.py --figure /tmp/d.png    # loss vs time and vs slow-link bytes
"""
import argparse
import contextlib
import sys
import time

from minidist.comm import World
from _args import positive, positive_int
from _corpus import load_corpus, windows
from _launched import one_process_only


def build(args, how, model, mesh):
    """(the inner optimizer, the context to train in) for one way of training."""
    from minidist.distributed.fsdp import fully_shard
    from minidist.optim import SGD, AdamW
    from minidist.parallel import DistributedDataParallel
    from minidist.parallel.diloco import DiLoCo
    kind, H, F = how
    if kind == "DDP":
        return DistributedDataParallel(model), AdamW(model.parameters(), lr=args.lr), None
    shard_over = mesh if kind == "HSDP" else mesh["local"]     # inside an island
    for block in model.blocks:
        fully_shard(block, mesh=shard_over)
    fully_shard(model, mesh=shard_over)
    inner = AdamW(model.parameters(), lr=args.lr)
    if kind == "HSDP":
        return model, inner, None
    outer = SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
    half = len(model.blocks) // 2
    fragments = [[model.wte, model.lm_head, model.wpe, *model.blocks[:half]],
                 [*model.blocks[half:], model.ln_f]] if F == 2 else None
    return model, inner, DiLoCo(model, inner, outer, sync_every=H, group=mesh["island"],
                                fragments=fragments, fragment_sync_delay=1 if F > 1 else 0,
                                fragment_update_alpha=0.5 if F > 1 else 0.0,
                                outer_grad_format="e3m0" if F > 1 else None)


def train_rank(args, how):
    """One rank: the GPT on its own windows of the corpus (AdamW inner)."""
    import minidist.distributed as dist
    from minidist import backend
    from minidist.autograd import no_grad
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.nn import GPT, GPTConfig
    chars, data = load_corpus()
    model = GPT(GPTConfig(block_size=args.block, vocab_size=len(chars), n_layer=2, n_head=2,
                          n_embd=args.width, seed=0))
    mesh = init_device_mesh(backend.device_type(), (2, 2), mesh_dim_names=("island", "local"))
    forward, inner, diloco = build(args, how, model, mesh)
    held_x, held_y = next(windows(data, 16, args.block, seed=7))
    stream = windows(data, args.batch, args.block, seed=100 + dist.get_rank())
    losses, times, sent, clock = [], [], [], 0.0
    first = dist.get_link_bytes().between
    with diloco or contextlib.nullcontext():       # DiLoCo's hook is on inside the with
        for _ in range(args.steps):
            start = time.perf_counter()
            _, loss = forward(*next(stream))
            loss.backward()
            inner.step()                           # every H-th (H/F-th) also synchronises
            inner.zero_grad()
            clock += time.perf_counter() - start
            with no_grad():                        # the held-out loss (not timed; it moves
                losses.append(float(model(held_x, held_y)[1].item()))   # nothing across)
            times.append(clock)
            # every byte so far: a streaming sync's all-gather runs on in the background
            sent.append(dist.get_link_bytes().between - first)
    return dict(losses=losses, times=times, sent=sent)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=positive_int, default=100)
    parser.add_argument("--width", type=positive_int, default=32, help="n_embd of the GPT")
    parser.add_argument("--block", type=positive_int, default=32, help="characters per window")
    parser.add_argument("--batch", type=positive_int, default=8, help="windows per rank per step")
    parser.add_argument("--lr", type=positive, default=3e-3)
    parser.add_argument("--fast-gbps", type=positive, default=2.0, help="inside an island, GB/s")
    parser.add_argument("--slow-gbps", type=positive, default=0.01, help="between islands, GB/s")
    parser.add_argument("--figure", metavar="PATH", help="save the two panels as a PNG")
    args = parser.parse_args()
    one_process_only("it starts its own world of 2 islands x 2 ranks")

    runs = {"DDP": ("DDP", 1, 1), "HSDP": ("HSDP", 1, 1), "DiLoCo H=10": ("DiLoCo", 10, 1),
            "DiLoCo H=50": ("DiLoCo", 50, 1), "Streaming F=2, e3m0": ("DiLoCo", 10, 2)}
    results = {}
    with World(4, node_size=2, link_gbps=args.fast_gbps, inter_node_gbps=args.slow_gbps) as world:
        for label, how in runs.items():
            ranks = world.run(train_rank, args, how)
            results[label] = dict(ranks[0], sent=[sum(s) / 4 for s in
                                                  zip(*(r["sent"] for r in ranks))])
    print(f"2 islands x 2 ranks ({args.fast_gbps:g} GB/s inside, {args.slow_gbps:g} GB/s between), "
          f"a 2-layer GPT (n_embd {args.width}) on the corpus, {args.steps} AdamW steps\n")
    print(f"{'run':<22}{'first loss':>11}{'last loss':>11}{'train s':>9}{'MB across':>11}")
    for label, r in results.items():
        print(f"{label:<22}{r['losses'][0]:>11.4f}{r['losses'][-1]:>11.4f}"
              f"{r['times'][-1]:>9.2f}{r['sent'][-1] / 1e6:>11.3f}")
    if args.figure:
        from _figures import diloco_runs
        diloco_runs(args.figure, results)
    trains = all(r["losses"][-1] < r["losses"][0] for r in results.values())
    ddp = results["DDP"]["sent"][-1]
    fewer = all(results[f"DiLoCo H={h}"]["sent"][-1] * h <= ddp for h in (10, 50))
    hsdp = results["HSDP"]["sent"][-1] < ddp
    ok = trains and fewer and hsdp
    print(f"\ncheck: every run trains (last loss < first): {trains}; DiLoCo puts <= 1/H of "
          f"DDP's bytes on the slow link: {fewer}; HSDP fewer than DDP: {hsdp}  "
          f"{'ok' if ok else 'FAILED'}")
    sys.exit(0 if ok else 1)
