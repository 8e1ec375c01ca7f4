"""Demo 26: train the GPT (or the Llama) with AdamW, and with Muon + AdamW.

Both runs start from the same weights and see the same batches of the shipped corpus.
The first uses AdamW for every parameter; the second gives the hidden layers' weight
matrices to Muon (momentum, then the Newton-Schulz iteration: the nearest
semi-orthogonal matrix, minidist/optim/muon.py) and the rest, embeddings, head, norms
and biases, to AdamW, as Moonlight and torchtitan do (``optim.muon_param_groups``).
Muon uses ``adjust_lr_fn="match_rms_adamw"``, so one learning rate serves both.

    python demos/26_muon.py                       # GPT, about half a minute on 2 cores
    python demos/26_muon.py --model llama
    python demos/26_muon.py --steps 300 --figure /tmp/muon.png   # also plot both curves

The checks: both runs train, and the update Muon applied to a weight matrix is near
orthogonal: its median singular value is at least half its largest (the quintic lifts
them all towards 1), where AdamW's spread over decades. docs/optimizers.md explains the iteration and the sharded schemes.
"""
import argparse
import math
import sys

import numpy as np

import minidist
from minidist import backend
from minidist.nn import GPT, GPTConfig, Llama, LlamaConfig
from minidist.optim import AdamW, Muon, muon_param_groups
from _corpus import load_corpus, windows
from _progress import Progress
from _args import non_negative_int, or_usage_error, positive, positive_int

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--model", choices=["gpt", "llama"], default="gpt")
parser.add_argument("--steps", type=positive_int, default=60, help="optimizer steps per run")
parser.add_argument("--batch", type=positive_int, default=8, help="sequences per step")
parser.add_argument("--block", type=positive_int, default=32, help="context length (characters)")
parser.add_argument("--n-layer", type=positive_int, default=2)
parser.add_argument("--n-embd", type=positive_int, default=64)
parser.add_argument("--lr", type=positive, default=3e-3, help="learning rate of both optimizers")
parser.add_argument("--figure", metavar="PATH", help="save both loss curves as a PNG")
parser.add_argument("--seed", type=non_negative_int, default=0)
args = parser.parse_args()

chars, data = load_corpus()
if args.model == "gpt":
    cfg = or_usage_error(parser, GPTConfig, block_size=args.block, vocab_size=len(chars),
                         n_layer=args.n_layer, n_head=4, n_embd=args.n_embd, seed=args.seed)
else:
    cfg = or_usage_error(parser, LlamaConfig, vocab_size=len(chars), hidden_size=args.n_embd,
                         intermediate_size=2 * args.n_embd, num_hidden_layers=args.n_layer,
                         num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=args.block, seed=args.seed)


def make_model():
    return GPT(cfg) if args.model == "gpt" else Llama(cfg)


def optimizers(model, name):
    if name == "AdamW":
        return [AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)]
    matrices, rest = muon_param_groups(model)
    return [Muon(matrices, lr=args.lr, weight_decay=0.01, adjust_lr_fn="match_rms_adamw"),
            AdamW(rest, lr=args.lr, weight_decay=0.01)]


def train(name):
    """-> (losses, the singular values of the last step's update of one hidden matrix)."""
    minidist.manual_seed(args.seed)
    model = make_model()
    opts = optimizers(model, name)
    watched = muon_param_groups(model)[0][0]          # the first hidden weight matrix
    stream, losses = windows(data, args.batch, args.block, args.seed), []
    bar = Progress(range(args.steps), f"{name:>12}")
    for _ in bar:
        x, y = next(stream)
        _, loss = model(x, y)
        for opt in opts:
            opt.zero_grad()
        loss.backward()
        before = backend.to_host(watched.data).copy()
        for opt in opts:
            opt.step()
        losses.append(loss.item())
        bar.note(f"loss {np.mean(losses[-10:]):.3f}")
    step = before - backend.to_host(watched.data)
    return losses, np.linalg.svd(step, compute_uv=False)


def spread(s):
    """The median singular value over the largest: 1 for an orthogonal update."""
    return float(np.median(s) / s.max())


runs, spectra = {}, {}
for name in ("AdamW", "Muon + AdamW"):
    runs[name], spectra[name] = train(name)

print(f"\n{args.model}, {args.steps} steps, batch {args.batch} x {args.block}, lr {args.lr:g}")
print(f"  {'optimizer':>12}  first loss  last 10 mean   one update's singular values: "
      "median / max")
for name, losses in runs.items():
    s = spectra[name]
    print(f"  {name:>12}  {losses[0]:10.3f}  {np.mean(losses[-10:]):12.3f}   "
          f"{spread(s):10.2f}")

if args.figure:
    from _figures import optimizer_runs
    optimizer_runs(args.figure, runs, f"{args.model.upper()} training loss: AdamW vs Muon")

uniform = math.log(len(chars))
checks = [
    (f"both runs train: last-10 mean losses < log({len(chars)}) - 0.3 = {uniform - 0.3:.3f}",
     all(np.mean(v[-10:]) < uniform - 0.3 for v in runs.values())),
    (f"Muon's update of a hidden matrix is near-orthogonal: median / largest singular value "
     f"{spread(spectra['Muon + AdamW']):.2f} >= 0.5 (AdamW's "
     f"{spread(spectra['AdamW']):.2f})", spread(spectra["Muon + AdamW"]) >= 0.5),
]
ok = True
for what, passed in checks:
    print(f"check: {what}: {'ok' if passed else 'FAILED'}")
    ok &= passed
sys.exit(0 if ok else 1)
