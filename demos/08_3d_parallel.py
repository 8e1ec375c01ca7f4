"""Demo 08: 3D parallelism: data x pipeline x tensor parallel GPT training on 8 processes.

The world is a device mesh dp x pp x tp (default 2 x 2 x 2). Ranks of one
tensor-parallel group are neighbours (TP talks in every layer), pipeline stages
are farthest apart (PP talks only at stage boundaries), data-parallel replicas
in between: the worked solutions' "3D layout" (TP=8 in a node, PP=8 across
nodes, DP=8 copies of that) at the size of one machine.

Every rank trains its share: its data shard of each batch, cut into
micro-batches, through its pipeline stage (1F1B), whose layers are split across
its TP group; gradients are averaged over its DP group. The same steps are
taken in this one process on the whole batches, and the demo prints the mesh,
the losses, and max |3D - single process| over every parameter shard.

    python demos/08_3d_parallel.py                      # 8 processes, ~10 s
    python demos/08_3d_parallel.py --dp 1 --pp 2 --tp 2 --steps 5 --schedule gpipe
    python demos/08_3d_parallel.py --figure /tmp/mesh.png   # also draw the mesh

With --figure PATH (no figure without it) it saves the mesh (each rank's
place, what it holds) and the step losses beside one process's as a PNG
(needs matplotlib).

Code: minidist/parallel/three_d.py (the step), comm/mesh.py (the mesh),
parallel/pipeline/executor.py, parallel/tensor/gpt.py, parallel/data/naive.py.
"""
import argparse
import sys

import numpy as np

from minidist.backend import from_host, to_host
from minidist.comm import DeviceMesh, World
from minidist.nn import GPT, GPTConfig
from minidist.optim import SGD
from minidist.parallel import ThreeDParallelGPT
from _args import positive, positive_int
from _launched import one_process_only

TOLERANCE = 1e-12


def on_rank(cfg, shape, schedule, microbatches, batches, lr, dense_final):
    mesh = DeviceMesh(**shape)
    model = ThreeDParallelGPT(cfg, mesh, microbatches, schedule)
    opt = SGD(model.parameters(), lr=lr)
    losses = [model.train_step(from_host(x), from_host(y), opt) for x, y in batches]
    want = model.shard_of({n: from_host(a) for n, a in dense_final.items()})
    got = model.named_parameters()
    err = max(float(abs(to_host(got[n].data) - to_host(want[n])).max()) for n in got)
    held = sum(q.numel() for q in got.values())
    return mesh.coord, err, held, losses


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dp", type=positive_int, default=2)
    parser.add_argument("--pp", type=positive_int, default=2)
    parser.add_argument("--tp", type=positive_int, default=2)
    parser.add_argument("--schedule", default="1f1b", choices=["gpipe", "1f1b"])
    parser.add_argument("--microbatches", type=positive_int, default=2)
    parser.add_argument("--steps", type=positive_int, default=3)
    parser.add_argument("--lr", type=positive, default=0.3)
    parser.add_argument("--figure", metavar="PATH", help="save a PNG (default: none)")
    args = parser.parse_args()
    one_process_only("it starts its own world of dp x pp x tp ranks beside one process")
    if 32 % args.tp:
        parser.error(f"--tp ({args.tp}) must divide the vocabulary (32): each rank holds a slice")
    shape = dict(dp=args.dp, pp=args.pp, tp=args.tp)
    world = args.dp * args.pp * args.tp
    cfg = GPTConfig(block_size=8, vocab_size=32, n_layer=2 * args.pp, n_head=2 * args.tp,
                    n_embd=8 * args.tp, dtype="float64")
    rows = args.dp * args.microbatches * 2
    rng = np.random.default_rng(0)
    batches = [(rng.integers(0, cfg.vocab_size, (rows, cfg.block_size)),
                rng.integers(0, cfg.vocab_size, (rows, cfg.block_size)))
               for _ in range(args.steps)]

    dense = GPT(cfg)                                     # the single-process reference
    opt = SGD(dense.parameters(), lr=args.lr)
    single_losses = []
    for x, y in batches:
        _, loss = dense(from_host(x), from_host(y))
        loss.backward()
        opt.step()
        opt.zero_grad()
        single_losses.append(float(loss.data))
    final = {n: to_host(q.data) for n, q in dense.named_parameters()}

    print(f"GPT: {cfg.n_layer} layers, {cfg.n_head} heads, C = {cfg.n_embd}: "
          f"{dense.num_parameters():,} parameters; batch {rows} x {cfg.block_size}, "
          f"{args.microbatches} micro-batches per replica, {args.schedule}")
    with World(world) as w:
        results = w.run(on_rank, cfg, shape, args.schedule, args.microbatches, batches,
                        args.lr, final)
    print(f"\n{'rank':>4}  {'pp':>2} {'dp':>2} {'tp':>2}  {'params held':>11}  "
          f"{'max |3D - single|':>17}")
    for rank, (coord, err, held, _) in enumerate(results):
        print(f"{rank:>4}  {coord['pp']:>2} {coord['dp']:>2} {coord['tp']:>2}  {held:>11,}  "
              f"{err:>17.1e}")
    # the last stage reports each replica's loss; the step's loss is their mean
    last = [r[3] for r in results if r[0]["pp"] == args.pp - 1 and r[0]["tp"] == 0]
    mean_3d = np.mean(np.array(last, dtype=float), axis=0)
    print("\nstep losses, 3D:            " + "  ".join(f"{x:.6f}" for x in mean_3d))
    print("step losses, one process:   " + "  ".join(f"{x:.6f}" for x in single_losses))
    if args.figure:
        from _figures import mesh_3d
        mesh_3d(args.figure, [r[0] for r in results], [r[2] for r in results], shape, mean_3d,
                single_losses)
    worst = max(r[1] for r in results)
    ok = worst <= TOLERANCE and np.abs(mean_3d - single_losses).max() <= TOLERANCE
    print(f"\ncheck: after {args.steps} steps max |3D - single| over every parameter = "
          f"{worst:.1e}  (tolerance {TOLERANCE:.0e}, float64)  {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
