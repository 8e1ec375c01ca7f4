"""Placements' bookkeeping: a GPT step with fully_shard beside ZeRO-3, and with a TP plan
(parallelize_module) beside minidist's Megatron layers.

    python bench/bench_placements.py                 # world 2, a 4-block GPT of width 128
    python bench/bench_placements.py --world 4 --n-embd 256

Same model, same world, same data, float32 on shared memory:

- FSDP: every block and the root under ``fully_shard`` (reshard_after_forward; it
  prefetches the next unit's all-gather) against ``Zero3(prefetch=True)`` with its default
  units (every module that owns parameters): both all-gather in forward, again for the
  backward's recompute, and reduce-scatter the gradients;
- TP: every block by the plan {"blocks.*.attn.c_attn": FusedColwiseParallel(),
  "blocks.*.attn.c_proj": RowwiseParallel(), "blocks.*.mlp.c_fc": ColwiseParallel(),
  "blocks.*.mlp.c_proj": RowwiseParallel()} against the same GPT with each block replaced
  by Megatron's ``ParallelBlock`` holding the same pieces: two all-reduces per block each
  way in both (attention and MLP).

The variants alternate within each round; the median over rounds is reported with the
ratio placements / reference (the bar: at most 1.1x), and the median of the rounds' own
ratios (each of two runs a few seconds apart, so a burst of load on a shared machine
moves both). Times are wall-clock and vary with the machine's load.
"""
from __future__ import annotations

import argparse
import os
import statistics
from _args import positive_int

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")   # before NumPy loads, here and in the spawned ranks


def build(variant: str, n_layer: int, n_embd: int):
    """(step function) for one variant on this rank."""
    import minidist.distributed as dist
    from minidist.nn import GPT, GPTConfig
    from minidist.optim import SGD
    cfg = GPTConfig(block_size=64, vocab_size=256, n_layer=n_layer, n_head=4, n_embd=n_embd)
    model = GPT(cfg)
    if variant == "zero3":
        from minidist.parallel import Zero3
        zero = Zero3(model, SGD, lr=1e-3, prefetch=True)
        return zero, zero.step, zero.zero_grad
    if variant == "fully_shard":
        from minidist.distributed.fsdp import fully_shard
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    elif variant == "megatron":
        from minidist.parallel import shard_state_dict
        from minidist.parallel.tensor.gpt import ParallelBlock
        for i, block in enumerate(list(model.blocks)):
            megatron = ParallelBlock(cfg)
            megatron.load_state_dict(shard_state_dict(megatron, block.state_dict()))
            setattr(model.blocks, str(i), megatron)
    elif variant == "parallelize_module":
        from minidist import backend
        from minidist.distributed.device_mesh import init_device_mesh
        from minidist.distributed.tensor.parallel import (ColwiseParallel, FusedColwiseParallel,
                                                          RowwiseParallel, parallelize_module)
        mesh = init_device_mesh(backend.device_type(), (dist.get_world_size(),),
                                mesh_dim_names=("tp",))
        parallelize_module(model, mesh["tp"], {"blocks.*.attn.c_attn": FusedColwiseParallel(),
                                               "blocks.*.attn.c_proj": RowwiseParallel(),
                                               "blocks.*.mlp.c_fc": ColwiseParallel(),
                                               "blocks.*.mlp.c_proj": RowwiseParallel()})
    opt = SGD(model.parameters(), lr=1e-3)
    return model, opt.step, opt.zero_grad


def time_steps(variant: str, n_layer: int, n_embd: int, batch: int, steps: int) -> float:
    """On every rank: median seconds per step (forward, backward, update)."""
    import time

    import numpy as np

    import minidist.distributed as dist
    from minidist.backend import from_host, synchronize
    model, step, zero_grad = build(variant, n_layer, n_embd)
    rng = np.random.default_rng(dist.get_rank() if variant in ("zero3", "fully_shard") else 0)
    idx, tgt = (from_host(rng.integers(0, 256, (batch, 64))) for _ in range(2))
    times = []
    for _ in range(steps + 2):                       # 2 warm-up steps
        dist.barrier()
        t = time.perf_counter()
        _, loss = model(idx, tgt)
        loss.backward()
        step()
        zero_grad()
        synchronize()
        times.append(time.perf_counter() - t)
    return statistics.median(times[2:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", type=positive_int, default=2)
    ap.add_argument("--n-layer", type=positive_int, default=4)
    ap.add_argument("--n-embd", type=positive_int, default=128)
    ap.add_argument("--batch", type=positive_int, default=8, help="sequences of 64 per rank")
    ap.add_argument("--steps", type=positive_int, default=5, help="timed steps per measurement")
    ap.add_argument("--rounds", type=positive_int, default=5)
    args = ap.parse_args()
    if args.n_embd % 4 or 4 % args.world:
        ap.error(f"--n-embd ({args.n_embd}) must be divisible by the 4 heads, and --world "
                 f"({args.world}) must divide them (tensor parallelism splits whole heads)")
    from minidist.comm import World
    print(f"GPT of {args.n_layer} blocks, width {args.n_embd}, float32, world {args.world} on "
          f"shared memory, batch {args.batch} x 64 per rank; median of {args.rounds} rounds x "
          f"{args.steps} steps")
    pairs = [("fully_shard", "zero3"), ("parallelize_module", "megatron")]
    seconds: dict[str, list[float]] = {v: [] for pair in pairs for v in pair}
    with World(args.world, timeout=120.0) as world:
        for _ in range(args.rounds):
            for pair in pairs:
                for variant in pair:
                    ranks = world.run(time_steps, variant, args.n_layer, args.n_embd,
                                      args.batch, args.steps)
                    seconds[variant].append(max(ranks))
    for ours, theirs in pairs:
        a, b = statistics.median(seconds[ours]), statistics.median(seconds[theirs])
        per_round = statistics.median(x / y for x, y in zip(seconds[ours], seconds[theirs]))
        print(f"  {ours:<19} {1e3 * a:8.1f} ms per step   {theirs:<9} {1e3 * b:8.1f} ms   "
              f"{ours} / {theirs} = {a / b:.3f} (median of the rounds' ratios {per_round:.3f})")


if __name__ == "__main__":
    main()
