"""Demo 05: ZeRO stages 1, 2, 3 -- memory per rank beside the formula, same training.

Part 1 builds an MLP on N ranks under DDP and each ZeRO stage, with AdamW, in
float32 and in mixed precision (fp16 weights and gradients, float32 master),
takes a step and a backward, and prints the bytes rank 0 holds for weights,
gradients and optimizer state, per parameter, beside the source documents'
formula (minidist.calc.memory):

    DDP 16   ZeRO-1 4 + 12/N (fp32: 8 + 8/N)   ZeRO-2 2 + 14/N (4 + 12/N)   ZeRO-3 16/N

Part 2 trains the same model in float64 for a few steps with DDP and with each
stage (gradient clipping on) and prints max |zero - ddp| over the parameters.

    python demos/05_zero.py                   # 4 processes, ~10 s
    python demos/05_zero.py -n 2 --width 32
    python demos/05_zero.py --figure /tmp/zero.png   # also draw part 1

With --figure PATH (no figure without it) it saves part 1's bytes per
parameter, measured beside the formula, as a PNG (needs matplotlib).

Code: minidist/parallel/zero/zero12.py (stages 1, 2), zero3.py, shard.py, memory.py.
"""
import argparse
import sys

import numpy as np

from minidist.calc.memory import model_state_bytes_per_param
from minidist.comm import World
from _args import positive_int
from _launched import one_process_only

TOLERANCE = 1e-12
NAMES = {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}


def memory_on_rank(width, stage, precision):
    """This rank's report after one step and one more backward, and P."""
    from minidist.autograd import Tensor
    from minidist.backend import Generator
    from minidist.nn import MLP
    from minidist.parallel.zero.memory_probe import model_state_bytes
    model = MLP(width)
    p_count = model.num_parameters()            # before ZeRO-3 empties the parameters
    x = Tensor(Generator(0).normal((8, width)))
    return model_state_bytes(model, x, stage, precision), p_count


def train_on_rank(width, stage, steps):
    """Float64 training, 4 samples per rank per step, AdamW, clipping at 0.1."""
    from minidist.autograd import Tensor
    from minidist.backend import Generator, to_host
    from minidist.distributed import get_rank
    from minidist.nn import MLP
    from minidist.optim import AdamW, clip_grad_norm_
    from minidist.parallel import DistributedDataParallel, Zero1, Zero2, Zero3
    model = MLP(width, dtype="float64", generator=Generator(get_rank()))
    if stage == 0:
        wrapped = DistributedDataParallel(model)
        opt = AdamW(model.parameters(), lr=1e-3)
    else:
        wrapped = {1: Zero1, 2: Zero2, 3: Zero3}[stage](model, AdamW, max_grad_norm=0.1,
                                                        lr=1e-3)
    gen = Generator(100 + get_rank())
    for _ in range(steps):
        out = wrapped(Tensor(gen.normal((4, width), dtype="float64")))
        (out * out).mean().backward()
        if stage == 0:
            clip_grad_norm_(model.parameters(), 0.1)
            opt.step()
            opt.zero_grad()
        else:
            wrapped.step()
            wrapped.zero_grad()
    if stage == 3:
        return {k: to_host(v).copy() for k, v in wrapped.full_state_dict().items()}
    return {k: to_host(p.data).copy() for k, p in model.named_parameters()}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", "--world-size", type=positive_int, default=4)
    parser.add_argument("--width", type=positive_int, default=128, help="MLP(width, 4 * width)")
    parser.add_argument("--steps", type=positive_int, default=5)
    parser.add_argument("--figure", metavar="PATH", help="save part 1 as a PNG (default: none)")
    args = parser.parse_args()
    one_process_only("it starts its own world to train under ZeRO 1, 2 and 3 beside one process")
    n = args.world_size

    with World(n) as world:
        print(f"Part 1: bytes per parameter on rank 0 of {n} (Adam), measured vs formula")
        print(f"{'':8} {'precision':9} {'weights':>8} {'grads':>8} {'optim':>8} "
              f"{'total':>8} {'formula':>8}   total bytes")
        worst_rel, rows = 0.0, []
        for precision in ("fp32", "mixed"):
            for stage in range(4):
                rep, p = world.run(memory_on_rank, args.width, stage, precision)[0]
                want = model_state_bytes_per_param(n, stage, precision)
                got = rep["total"] / p
                worst_rel = max(worst_rel, abs(got - want) / want)
                print(f"{NAMES[stage]:<8} {precision:<9} {rep['params'] / p:8.3f} "
                      f"{rep['grads'] / p:8.3f} {rep['optimizer'] / p:8.3f} {got:8.3f} "
                      f"{want:8.3f}   {rep['total']:,}")
                rows.append((precision, NAMES[stage], rep["params"] / p, rep["grads"] / p,
                             rep["optimizer"] / p, want))
        print(f"(P = {p:,}; a shard is padded to ceil(P/N) elements, hence the last digits)")
        if args.figure:
            from _figures import zero_memory
            zero_memory(args.figure, rows, n)

        print(f"\nPart 2: {args.steps} AdamW steps in float64 with clipping, N = {n}")
        ddp = world.run(train_on_rank, args.width, 0, args.steps)[0]
        worst = 0.0
        for stage in (1, 2, 3):
            got = world.run(train_on_rank, args.width, stage, args.steps)
            diff = max(float(np.max(np.abs(r[k] - ddp[k]))) for r in got for k in ddp)
            worst = max(worst, diff)
            print(f"  {NAMES[stage]}: max |zero - ddp| = {diff:.1e}")
    ok = worst <= TOLERANCE and worst_rel < 0.01
    print(f"\ncheck: memory within {100 * worst_rel:.2f}% of the formula (padding), "
          f"max |zero - ddp| = {worst:.1e} (tolerance {TOLERANCE:.0e})  "
          f"{'ok' if ok else 'FAILED'}")
    sys.exit(0 if ok else 1)
