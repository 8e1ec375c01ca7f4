"""Demo 21: a tiny Llama on the shipped corpus, in one process and on dp x tp x pp ranks.

The Llama block (minidist/nn/llama.py): RMSNorm, rotary positions, grouped-query
attention (4 query heads sharing 2 key/value heads), a SwiGLU MLP, no biases. The same
steps run twice on the same character batches: in this process, and on a
dp x tp x pp mesh (default 2 x 2 x 1: the key/value heads split over the
tensor-parallel pair, the batch over the replicas; --pp 2 --tp 1 cuts the layers into
two pipeline stages instead). The demo prints both losses, the largest difference of
any parameter, and text sampled from the trained model.

    python demos/21_llama.py                       # 4 processes, ~30 s
    python demos/21_llama.py --dp 2 --tp 1 --pp 2 --steps 40
    python demos/21_llama.py --figure /tmp/llama.png   # also plot the two loss curves

With --figure PATH (no figure without it) it saves the losses of both runs and the
difference per step as a PNG (needs matplotlib).

Code: minidist/nn/llama.py, nn/attention.py (GroupedQueryAttention), nn/rotary.py,
parallel/tensor/llama.py, parallel/three_d.py. Docs: docs/llama.md.
"""
import argparse
import pathlib
import sys

import numpy as np

from minidist.backend import from_host, to_host
from minidist.comm import DeviceMesh, World
from minidist.nn import Llama, LlamaConfig
from minidist.optim import AdamW
from minidist.parallel import ThreeDParallelGPT
from _args import or_usage_error, positive, positive_int
from _launched import one_process_only

TOLERANCE = 1e-12


def on_rank(cfg, shape, microbatches, batches, lr, dense_final):
    """One rank of the mesh: the same steps on its share -> (its losses, max |diff|)."""
    model = ThreeDParallelGPT(cfg, DeviceMesh(**shape), microbatches, "1f1b")
    opt = AdamW(model.parameters(), lr=lr)
    losses = [model.train_step(from_host(x), from_host(y), opt) for x, y in batches]
    want = model.shard_of({n: from_host(a) for n, a in dense_final.items()})
    got = model.named_parameters()
    err = max(float(abs(to_host(got[n].data) - to_host(want[n])).max()) for n in got)
    return losses, err


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dp", type=positive_int, default=2)
    parser.add_argument("--tp", type=positive_int, default=2)
    parser.add_argument("--pp", type=positive_int, default=1)
    parser.add_argument("--steps", type=positive_int, default=30)
    parser.add_argument("--block", type=positive_int, default=32, help="context length T")
    parser.add_argument("--lr", type=positive, default=1e-2)
    parser.add_argument("--seed", type=positive_int, default=1)
    parser.add_argument("--figure", metavar="PATH", help="save a PNG (default: none)")
    args = parser.parse_args()
    one_process_only("it trains in one process, then starts its own world of dp x tp x pp ranks")
    if 2 % args.tp:
        parser.error(f"--tp ({args.tp}) must divide the 2 key/value heads (1 or 2)")

    text = (pathlib.Path(__file__).parent / "data" / "corpus.txt").read_text()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = np.array([stoi[c] for c in text], dtype=np.int64)
    vocab = -(-len(chars) // 4) * 4           # padded: each tensor-parallel rank a slice
    cfg = or_usage_error(parser, LlamaConfig, vocab_size=vocab, hidden_size=32,
                         intermediate_size=88, num_hidden_layers=2 * args.pp,
                         num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=args.block, dtype="float64", seed=args.seed)
    microbatches, rows = 2, args.dp * 2 * 4
    rng = np.random.default_rng(args.seed)
    batches = []
    for _ in range(args.steps):
        starts = rng.integers(0, len(data) - args.block - 1, rows)
        x = np.stack([data[s:s + args.block] for s in starts])         # (B, T)
        y = np.stack([data[s + 1:s + args.block + 1] for s in starts])
        batches.append((x, y))

    model = Llama(cfg)                                   # the single-process run
    opt = AdamW(model.parameters(), lr=args.lr)
    single = []
    for x, y in batches:
        _, loss = model(from_host(x), from_host(y))
        loss.backward()
        opt.step()
        opt.zero_grad()
        single.append(loss.item())
    final = {n: to_host(q.data) for n, q in model.named_parameters()}
    print(f"Llama: {cfg.num_hidden_layers} layers, width {cfg.hidden_size}, "
          f"{cfg.num_attention_heads} heads sharing {cfg.num_key_value_heads} key/value heads, "
          f"SwiGLU {cfg.intermediate_size}, {model.num_parameters():,} parameters, float64")
    print(f"batch {rows} x {args.block} characters, {args.steps} AdamW steps; mesh "
          f"dp={args.dp} x tp={args.tp} x pp={args.pp}")

    shape = dict(dp=args.dp, pp=args.pp, tp=args.tp)
    with World(args.dp * args.tp * args.pp) as world:
        results = world.run(on_rank, cfg, shape, microbatches, batches, args.lr, final)
    replicas = [losses for losses, _ in results if losses[0] is not None]
    mesh_losses = np.mean(np.array(replicas, dtype=float), axis=0)   # mean over replicas
    worst = max(err for _, err in results)
    loss_diff = float(np.abs(mesh_losses - single).max())
    for step in sorted({0, args.steps // 2, args.steps - 1}):
        print(f"step {step:3d}  loss one process {single[step]:.6f}  "
              f"mesh {mesh_losses[step]:.6f}")

    start = from_host(np.array([[stoi["T"]]], dtype=np.int64))
    out = to_host(model.generate(start, 120, temperature=0.8, seed=args.seed))[0]
    print("\nsample: " + "".join(chars[i] if i < len(chars) else "?" for i in out))
    if args.figure:
        from _figures import llama_runs
        llama_runs(args.figure, single, mesh_losses, shape)
    ok = worst <= TOLERANCE and loss_diff <= TOLERANCE and single[-1] < single[0]
    print(f"\ncheck: max |mesh - one process| over every parameter = {worst:.1e}, over the "
          f"losses {loss_diff:.1e} (tolerance {TOLERANCE:.0e}, float64); loss "
          f"{single[0]:.3f} -> {single[-1]:.3f}  {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
