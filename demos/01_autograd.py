"""Demo 01: train the small GPT on a character corpus with minidist's own autograd.

Everything here is minidist: the tensors and their backward pass
(minidist/autograd), the layers and the GPT (minidist/nn), AdamW and the
warmup + cosine schedule (minidist/optim). The corpus ships with the repo
(demos/data/corpus.txt, written for the project).

    python demos/01_autograd.py            # 300 steps at width 64, ~20 s on 2 cores
    python demos/01_autograd.py --full     # 600 steps at width 128, ~45 s: a better sample
    python demos/01_autograd.py --steps 1000 --n-embd 128
    python demos/01_autograd.py --figure /tmp/autograd.png   # also draw the curves

Prints the loss falling and a sample; the check is that the final loss is
well below the loss of a uniform guess, log(vocab). With --figure PATH (no
figure without it) it also saves the train and held-out loss, the learning
rate and the gradient norm per step as a PNG (needs matplotlib).
"""
import argparse
import math
import pathlib
import sys

import numpy as np

import minidist
from minidist import backend
from minidist.nn import GPT, GPTConfig
from minidist.optim import AdamW, WarmupCosine, clip_grad_norm_
from _progress import Progress
from _args import (non_negative_int, or_usage_error, positive, positive_int, probability,
                   quick_or_full)

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--steps", type=positive_int, help="optimizer steps (default 300; --full 600)")
parser.add_argument("--batch", type=positive_int, default=16, help="sequences per step")
parser.add_argument("--block", type=positive_int, default=64, help="context length (characters)")
parser.add_argument("--n-layer", type=positive_int, default=2)
parser.add_argument("--n-head", type=positive_int, default=4)
parser.add_argument("--n-embd", type=positive_int, help="width (default 64; --full 128)")
parser.add_argument("--dropout", type=probability, default=0.2, help="fights memorising the corpus")
parser.add_argument("--lr", type=positive, default=3e-3, help="peak learning rate")
parser.add_argument("--seed", type=non_negative_int, default=0)
parser.add_argument("--figure", metavar="PATH", help="save the curves as a PNG (default: none)")
parser.add_argument("--full", action="store_true",
                    help="the longer run: 600 steps at width 128 (about 3x the time)")
args = parser.parse_args()
quick_or_full(args, quick=dict(steps=300, n_embd=64), full=dict(steps=600, n_embd=128))

# -- data: characters -> integers ------------------------------------------
text = (pathlib.Path(__file__).parent / "data" / "corpus.txt").read_text()
chars = sorted(set(text))
stoi = {c: i for i, c in enumerate(chars)}
encoded = np.array([stoi[c] for c in text], dtype=np.int64)
split = int(0.9 * len(encoded))      # the last 10% is held out: is it learning or memorising?
train_data, val_data = encoded[:split], encoded[split:]
print(f"corpus: {len(text)} characters, vocabulary of {len(chars)}, "
      f"{len(val_data)} held out")

rng = np.random.default_rng(args.seed)


def batch(data, rng=rng):
    """Random windows of the text; the targets are the inputs shifted by one."""
    starts = rng.integers(0, len(data) - args.block - 1, args.batch)
    x = np.stack([data[s:s + args.block] for s in starts])          # (B, T)
    y = np.stack([data[s + 1:s + args.block + 1] for s in starts])  # (B, T)
    return backend.from_host(x), backend.from_host(y)


# -- model and optimizer ------------------------------------------------------
cfg = or_usage_error(parser, GPTConfig, block_size=args.block, vocab_size=len(chars),
                     n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd,
                     dropout=args.dropout, seed=args.seed)
model = GPT(cfg)
print(f"GPT: {cfg.n_layer} layers, {cfg.n_head} heads, width {cfg.n_embd}, "
      f"{model.num_parameters():,} parameters, backend {backend.get_backend()}")
optimizer = AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
schedule = WarmupCosine(optimizer, warmup_steps=args.steps // 10, total_steps=args.steps,
                        min_lr=args.lr / 10)
minidist.manual_seed(args.seed)


def held_out_loss(batches, rng=rng):
    with minidist.no_grad():
        model.eval()
        value = float(np.mean([model(*batch(val_data, rng))[1].item() for _ in range(batches)]))
        model.train()
    return value


# -- training -------------------------------------------------------------------
losses, lrs, norms, held_out = [], [], [], []
figure_rng = np.random.default_rng(args.seed + 1)   # the figure's evaluations leave `rng` alone
bar = Progress(range(args.steps), "train")
for step in bar:
    x, y = batch(train_data)
    _, loss = model(x, y)            # forward: builds the graph
    optimizer.zero_grad()
    loss.backward()                  # backward: fills p.grad for every parameter
    lrs.append(optimizer.param_groups[0]["lr"])
    norms.append(clip_grad_norm_(model.parameters(), 1.0))
    optimizer.step()
    schedule.step()
    losses.append(loss.item())
    bar.note(f"loss {np.mean(losses[-10:]):.3f}")
    if args.figure and (step % max(1, args.steps // 10) == 0 or step == args.steps - 1):
        held_out.append((step, held_out_loss(2, figure_rng)))

print()
for step in sorted({0, args.steps // 4, args.steps // 2, 3 * args.steps // 4, args.steps - 1}):
    window = losses[max(0, step - 9):step + 1]
    print(f"step {step:4d}  loss {np.mean(window):.3f}")

val_loss = held_out_loss(8)
print(f"held-out loss {val_loss:.3f} (train {np.mean(losses[-10:]):.3f}: "
      "the gap is memorisation of a small corpus)")

# -- sample -------------------------------------------------------------------------
start = backend.from_host(np.array([[stoi["T"]]], dtype=np.int64))
out = backend.to_host(model.generate(start, 200, temperature=0.8, seed=args.seed))[0]
print("\nsample:\n" + "".join(chars[i] for i in out))

uniform = math.log(len(chars))
if args.figure:
    from _figures import training_curves
    training_curves(args.figure, losses, held_out, lrs, norms, 1.0, uniform,
                    f"GPT on the corpus, backend {backend.get_backend()}")
final = float(np.mean(losses[-10:]))
ok = final < uniform - 1.0 and val_loss < uniform - 1.0
print(f"\ncheck: train loss {final:.3f} and held-out loss {val_loss:.3f} < uniform guess "
      f"log({len(chars)}) = {uniform:.3f} - 1.0: {'ok' if ok else 'FAILED'}")
sys.exit(0 if ok else 1)
