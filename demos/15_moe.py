"""Demo 15: mixture of experts, and expert parallelism with all-to-all.

An MoE block replaces one MLP by E expert MLPs and a router that sends each token
to k of them (minidist/nn/moe.py, router.py). The demo shows, in one process:

1. dropped assignments vs the capacity factor: C = ceil(cf * tokens * k / E);
2. tokens per expert over a short training run, with no balancing, with the
   Switch load-balancing loss, and with DeepSeek-V3's bias (no loss at all);

then, on N processes (minidist/parallel/expert/), the same MoE GPT expert-parallel:
each rank holds E/N experts, tokens travel to them and back by all-to-all. It
prints the bytes each rank's all-to-alls moved beside the formula
2 k S C B (N-1)/N per layer and direction pair (uniform routing), and checks the
loss and every gradient against one process on the same global batch.

    python demos/15_moe.py                   # 2 processes, a few seconds
    python demos/15_moe.py -n 4 --experts 8 --top-k 1

The check: max |expert parallel - single process| over loss and gradients <= 1e-10
(float64). With --figure PATH it draws the load per expert of the three runs and the
dropped fraction vs capacity factor (needs matplotlib).
"""
import argparse
import sys

import numpy as np

import minidist
from minidist.backend import from_host, to_host
from minidist.calc import moe_all_to_all_bytes
from minidist.distributed import get_rank, get_world_size
from minidist.nn import GPT, GPTConfig
from minidist.optim import AdamW
from _args import or_usage_error, positive, positive_int
from _launched import one_process_only


def config(args, **changes):
    base = dict(block_size=args.seq, vocab_size=32, n_layer=2, n_head=2, n_embd=args.n_embd,
                moe_every=1, n_expert=args.experts, moe_top_k=args.top_k, dtype="float64",
                moe_aux_coef=0.0)
    base.update(changes)
    return GPTConfig(**base)


def batch(args, rows, seed=0):
    """Skewed tokens (a few are frequent), so an untrained router is unbalanced."""
    rng = np.random.default_rng(seed)
    idx = np.minimum(rng.geometric(0.25, (rows, args.seq + 1)) - 1, 31)
    return idx[:, :-1], idx[:, 1:]


def loads_over_training(args, **changes):
    model = GPT(config(args, **changes))
    opt = AdamW(model.parameters(), lr=3e-3)
    idx, tgt = batch(args, args.batch)
    for step in range(args.steps):
        opt.zero_grad()
        _, loss = model(from_host(idx), from_host(tgt))
        loss.backward()
        opt.step()
        model.update_moe_bias()
    return to_host(model.moe_layers()[0].last.counts)


def on_rank(args):
    """Each rank: its share of the global batch through the expert-parallel GPT."""
    from minidist.parallel import (ExpertMesh, expert_parallel,
                                   sync_expert_parallel_gradients)
    n, r = get_world_size(), get_rank()
    mesh = ExpertMesh(ep=n)
    model = expert_parallel(GPT(config(args, capacity_factor=args.capacity,
                                       moe_groups=n, moe_aux_coef=0.01)), mesh)
    idx, tgt = batch(args, args.batch)
    b = args.batch // n
    _, loss = model(from_host(idx[r * b:(r + 1) * b]), from_host(tgt[r * b:(r + 1) * b]))
    loss.backward()
    moved = mesh.ep_group.stats.per_collective["all_to_all_single"]["bytes_sent"]
    sync_expert_parallel_gradients(model, mesh)
    grads = {name: to_host(p.grad) for name, p in model.named_parameters()}
    return loss.item(), grads, moved


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-n", "--world-size", type=positive_int, default=2)
    p.add_argument("--experts", type=positive_int, default=4)
    p.add_argument("--top-k", type=positive_int, default=2)
    p.add_argument("--n-embd", type=positive_int, default=16)
    p.add_argument("--seq", type=positive_int, default=16)
    p.add_argument("--batch", type=positive_int, default=8, help="global batch (sequences)")
    p.add_argument("--steps", type=positive_int, default=30)
    p.add_argument("--capacity", type=positive, default=1.25, help="capacity factor of part 3")
    p.add_argument("--figure", metavar="PATH")
    args = p.parse_args()
    one_process_only("it starts its own world of expert-parallel ranks beside one process")
    n, E, k = args.world_size, args.experts, args.top_k
    if args.batch % n or E % n:
        p.error(f"--batch ({args.batch}) and --experts ({E}) must be divisible by -n ({n})")
    if k > E:
        p.error(f"--top-k ({k}) can be at most --experts ({E})")
    or_usage_error(p, config, args)               # the ranks build the same config

    print(f"1. dropped assignments vs capacity factor ({E} experts, top-{k}, "
          f"{args.batch * args.seq} tokens)")
    model = GPT(config(args))
    idx, tgt = batch(args, args.batch)
    factors, dropped = [0.5, 0.75, 1.0, 1.25, 1.5, 2.0], []
    for cf in factors:
        for m in model.moe_layers():
            m.capacity_factor = cf
        model(from_host(idx))
        kept = to_host(model.moe_layers()[0].last.kept)
        dropped.append(1 - kept.mean())
        print(f"   cf {cf:4.2f}: capacity {int(np.ceil(cf * idx.size * k / E)):4d}, "
              f"dropped {dropped[-1]:6.1%}")

    print(f"\n2. tokens per expert (layer 0) after {args.steps} steps")
    runs = {"no balancing": loads_over_training(args),
            "Switch aux loss (alpha 0.05)": loads_over_training(args, moe_aux_coef=0.05),
            "DeepSeek-V3 bias (gamma 0.01)": loads_over_training(args, moe_bias_rate=0.01)}
    for name, counts in runs.items():
        bars = " ".join(f"{int(c):4d}" for c in counts)
        print(f"   {name:<30} {bars}   max/mean {counts.max() / counts.mean():.2f}")

    print(f"\n3. expert parallel on {n} processes ({E // n} experts each), capacity factor "
          f"{args.capacity}")
    results = minidist.launch(on_rank, n, args)
    single = GPT(config(args, capacity_factor=args.capacity, moe_groups=n, moe_aux_coef=0.01))
    _, loss = single(from_host(idx), from_host(tgt))
    loss.backward()
    worst = abs(np.mean([r[0] for r in results]) - loss.item())
    for name, prm in single.named_parameters():
        for r in results:
            if name in r[1]:
                worst = max(worst, float(np.abs(r[1][name] - to_host(prm.grad)).max()))
    tokens = args.batch // n * args.seq
    formula = moe_all_to_all_bytes(tokens, args.n_embd, k, n, 8, 1.0)
    layers = len(single.moe_layers())
    print(f"   all-to-all bytes sent per rank (forward + backward, {layers} layers, "
          f"counts included):")
    for rank, r in enumerate(results):
        print(f"   rank {rank}: {r[2]:>8,} B   formula, uniform routing: "
              f"{int(layers * formula.forward_backward):>8,} B")
    ok = worst <= 1e-10
    print(f"\ncheck: max |expert parallel - single process| = {worst:.1e}  (tolerance 1e-10): "
          f"{'ok' if ok else 'FAILED'}")
    if args.figure:
        from _figures import moe_balance
        moe_balance(args.figure, runs, factors, dropped, E, k)
    return 0 if ok else 1


if __name__ == "__main__":   # the ranks are spawned: they import this file, not run it
    sys.exit(main())
