"""Demo 06: tensor parallelism (Megatron-LM): the GPT's every layer split across processes.

t processes each hold 1/t of every weight matrix: the MLP's c_fc by output
columns and c_proj by input rows (column then row: one all-reduce per MLP
forward, Megatron's g, and one backward, its f), attention by heads, the
vocabulary by rows (the loss is computed from vocabulary shards, never from the
full logits). The demo runs one forward and backward of the same batch on t
processes and in this one, and prints

- the parameters each rank holds (about 1/t of the blocks),
- the collectives of one step, per kind, with and without sequence parallelism
  (which turns each all-reduce into an all-gather + a reduce-scatter),
- max |tensor parallel - single process| over the loss and every gradient.

    python demos/06_tensor_parallel.py                # t = 2, ~5 s
    python demos/06_tensor_parallel.py -n 4 --n-layer 4 --n-embd 64
    python demos/06_tensor_parallel.py --figure /tmp/tp.png   # also draw it

With --figure PATH (no figure without it) it saves the parameters per rank and
the bytes rank 0 sent per collective, beside the formula, as a PNG (needs
matplotlib).

Code: minidist/parallel/tensor/mappings.py (f, g, gathers), layers.py,
vocab.py (embedding, cross-entropy), gpt.py (the model).
"""
import argparse
import sys

import numpy as np

from minidist.backend import from_host, to_host
from minidist.comm import World
from minidist.distributed import get_stats
from minidist.nn import GPT, GPTConfig
from minidist.parallel import TensorParallelGPT, shard_state_dict
from _args import or_usage_error, positive_int
from _launched import one_process_only

TOLERANCE = 1e-12


def on_rank(cfg, idx, tgt, dense_grads, sequence_parallel):
    """One forward + backward of the tensor-parallel GPT; compare with the dense gradients."""
    model = TensorParallelGPT(cfg, sequence_parallel=sequence_parallel)
    stats = get_stats()
    stats.reset()
    _, loss = model(from_host(idx), from_host(tgt))
    forward = stats.per_collective               # {kind: {"calls": ..., "bytes_sent": ...}}
    stats.reset()
    loss.backward()
    backward = stats.per_collective
    want = shard_state_dict(model, {n: from_host(g) for n, g in dense_grads.items()})
    err = max(float(abs(to_host(p.grad) - to_host(want[n])).max())
              for n, p in model.named_parameters())
    return float(loss.data), err, model.num_parameters(), forward, backward


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", "--tp", type=positive_int, default=2, help="tensor-parallel size")
    parser.add_argument("--n-layer", type=positive_int, default=2)
    parser.add_argument("--n-head", type=positive_int, default=4)
    parser.add_argument("--n-embd", type=positive_int, default=32)
    parser.add_argument("--block-size", type=positive_int, default=16)
    parser.add_argument("--batch", type=positive_int, default=4)
    parser.add_argument("--figure", metavar="PATH", help="save a PNG (default: none)")
    args = parser.parse_args()
    one_process_only("it starts its own world of --tp ranks and compares it with one process")
    if 64 % args.tp or args.n_head % args.tp or args.block_size % args.tp:
        parser.error(f"--tp ({args.tp}) must divide the vocabulary (64), --n-head "
                     f"({args.n_head}) and --block-size ({args.block_size}): each rank holds "
                     "a slice of each")
    cfg = or_usage_error(parser, GPTConfig, block_size=args.block_size, vocab_size=64,
                         n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd,
                         dtype="float64")
    rng = np.random.default_rng(0)
    idx = rng.integers(0, cfg.vocab_size, (args.batch, cfg.block_size))
    tgt = rng.integers(0, cfg.vocab_size, (args.batch, cfg.block_size))

    dense = GPT(cfg)                                     # the single-process reference
    _, loss = dense(from_host(idx), from_host(tgt))
    loss.backward()
    grads = {n: to_host(p.grad) for n, p in dense.named_parameters()}
    print(f"GPT: {cfg.n_layer} layers, {cfg.n_head} heads, C = {cfg.n_embd}, vocab "
          f"{cfg.vocab_size}; {dense.num_parameters():,} parameters in one process")

    worst, traffic = 0.0, {}
    with World(args.tp) as world:
        for sp in (False, True):
            results = world.run(on_rank, cfg, idx, tgt, grads, sp)
            loss_tp, _, held, forward, backward = results[0]
            print(f"\ntp = {args.tp}, sequence parallel = {sp}")
            print(f"  parameters per rank: {held:,} ({held / dense.num_parameters():.0%} "
                  "of the model; layer norms and positions are replicated)")
            print(f"  collectives, forward : { {k: v['calls'] for k, v in forward.items()} }")
            print(f"  collectives, backward: { {k: v['calls'] for k, v in backward.items()} }")
            for direction, kinds in (("forward", forward), ("backward", backward)):
                label = f"{direction}\n{'sequence parallel' if sp else 'plain'}"
                traffic[label] = {k: v["bytes_sent"] for k, v in kinds.items()}
            if not sp:
                print(f"    = 2 all-reduces per block ({2 * cfg.n_layer}) + 1 embedding (g) "
                      "+ 2 in the loss (max, sums) forward; 2 per block + the head's f backward")
            else:
                print("    the blocks' all-reduces became all-gather + reduce-scatter pairs; "
                      "backward also sums\n    the gradients of parameters used on position "
                      "shards (layer norms, row biases, wpe): one small all-reduce each")
            err_loss = max(abs(r[0] - float(loss.data)) for r in results)
            err = max(max(r[1] for r in results), err_loss)
            print(f"  loss {loss_tp:.6f} (single process {float(loss.data):.6f}); "
                  f"max |tp - single| over loss and gradients = {err:.1e}")
            worst = max(worst, err)
    if args.figure:
        from minidist.calc.tensor import tp_comm_bytes_per_layer
        from _figures import tensor_parallel
        blocks = cfg.n_layer * tp_comm_bytes_per_layer(args.batch, cfg.block_size, cfg.n_embd,
                                                       args.tp, bytes_per_element=8)
        tensor_parallel(args.figure, dense.num_parameters(), held, args.tp, traffic, blocks)
    ok = worst <= TOLERANCE
    print(f"\ncheck: max |tensor parallel - single| = {worst:.1e}  (tolerance "
          f"{TOLERANCE:.0e}, float64)  {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
