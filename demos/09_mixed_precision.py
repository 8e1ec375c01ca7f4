"""Demo 09: train the small GPT in fp32, bf16, fp16 (with and without loss scaling) and fp8.

Every run starts from the same weights and sees the same batches; only the
precision differs (minidist/precision):

- fp32:            the reference.
- bf16:            autocast("bf16"): matmuls on bf16 inputs, float32 sums; bf16
                   model weights and gradients behind float32 master weights.
- fp16:            the same in fp16, no loss scaling: small gradients flush to 0.
- fp16 + scaling:  GradScaler multiplies the loss by S (2^16 at first), halves S
                   on overflow (and skips that step), doubles it after a clean run.
- fp8 (delayed):   E4M3 matmul inputs, E5M2 gradients, per-tensor scales from an
                   amax history; bf16 model weights.

    python demos/09_mixed_precision.py             # 75 steps per run, ~15 s on 2 cores
    python demos/09_mixed_precision.py --full      # 150 steps per run, ~30 s
    python demos/09_mixed_precision.py --steps 400 --growth-interval 2000

Prints each run's final loss, the fraction of gradient values that underflow to
zero in fp16 backward (counted as they are rounded) without and with loss
scaling, and the loss-scale trace. The checks: every run trains, the
low-precision runs end near fp32, and loss scaling rescues underflowing gradients.
With --figure PATH (no figure without it) it saves the loss curves and the
loss-scale trace as a PNG (needs matplotlib):

    python demos/09_mixed_precision.py --figure /tmp/precision.png
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
from minidist.precision import (AmpPolicy, DelayedScaling, GradScaler, MasterWeights,
                                fp8_autocast, quantize, use_policy)
from _progress import Progress
from _args import non_negative_int, or_usage_error, positive, positive_int, quick_or_full

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--steps", type=positive_int,
                    help="optimizer steps per run (default 75; --full 150)")
parser.add_argument("--batch", type=positive_int, default=16, help="sequences per step")
parser.add_argument("--block", type=positive_int, default=64, help="context length (characters)")
parser.add_argument("--n-layer", type=positive_int, default=2)
parser.add_argument("--n-head", type=positive_int, default=4)
parser.add_argument("--n-embd", type=positive_int, default=64)
parser.add_argument("--lr", type=positive, default=3e-3, help="peak learning rate")
parser.add_argument("--growth-interval", type=positive_int, default=50,
                    help="GradScaler's clean steps before S doubles (PyTorch: 2000; "
                         "shorter here so a short run shows S growing back)")
parser.add_argument("--figure", metavar="PATH",
                    help="save the loss curves and the loss-scale trace as a PNG (default: none)")
parser.add_argument("--seed", type=non_negative_int, default=0)
parser.add_argument("--full", action="store_true", help="the longer run: 150 steps per run")
args = parser.parse_args()
quick_or_full(args, quick=dict(steps=75), full=dict(steps=150))

# -- data: characters -> integers (as demo 01) --------------------------------
text = (pathlib.Path(__file__).parent / "data" / "corpus.txt").read_text()
chars = sorted(set(text))
data = np.array([{c: i for i, c in enumerate(chars)}[c] for c in text], dtype=np.int64)
cfg = or_usage_error(parser, GPTConfig, block_size=args.block, vocab_size=len(chars),
                     n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd,
                     seed=args.seed)


def batches(seed):
    """The same random windows of the text for every run."""
    rng = np.random.default_rng(seed)
    while True:
        starts = rng.integers(0, len(data) - args.block - 1, args.batch)
        x = np.stack([data[s:s + args.block] for s in starts])           # (B, T)
        y = np.stack([data[s + 1:s + args.block + 1] for s in starts])   # (B, T)
        yield backend.from_host(x), backend.from_host(y)


class CountingAmp(AmpPolicy):
    """autocast that also counts gradient values rounded to 0 (nonzero before rounding)."""

    def __init__(self, fmt):
        super().__init__(fmt)
        self.lost = self.nonzero = 0

    def round_backward(self, grad):
        low = quantize(grad, self.fmt)
        self.nonzero += int((grad != 0).sum())
        self.lost += int(((low == 0) & (grad != 0)).sum())
        return low


def train(mode):
    """One run; returns the per-step losses and, for fp16 + scaling, the scale trace."""
    minidist.manual_seed(args.seed)
    model = GPT(cfg)
    low = {"fp32": None, "bf16": "bf16", "fp16": "fp16", "fp16+scaling": "fp16",
           "fp8": "bf16"}[mode]
    master = MasterWeights(model.parameters(), low) if low else None
    params = master.params if master else list(model.parameters())
    optimizer = AdamW(params, lr=args.lr, weight_decay=0.01)
    schedule = WarmupCosine(optimizer, warmup_steps=args.steps // 10, total_steps=args.steps,
                            min_lr=args.lr / 10)
    scaler = GradScaler(growth_interval=args.growth_interval, enabled=mode == "fp16+scaling")
    recipe = DelayedScaling(margin=0, amax_history_len=16)
    amp = CountingAmp(low or "fp16")
    data_stream = batches(args.seed)
    losses, scales, skipped = [], [], 0
    bar = Progress(range(args.steps), f"{mode:>13}")
    for _ in bar:
        x, y = next(data_stream)
        if mode == "fp8":
            context = fp8_autocast(recipe)
        else:
            context = use_policy(amp if low else None)     # = autocast(low), counting
        with context:
            _, loss = model(x, y)                # matmuls in the low format
        model.zero_grad()
        optimizer.zero_grad()
        scaler.scale(loss).backward()            # gradients of S * loss (S = 1 if disabled)
        if master:
            master.grads_to_master()             # round to the low format, hand to float32
        scaler.unscale_(optimizer)               # g / S, before clipping sees it
        with np.errstate(invalid="ignore"):      # an overflowed step clips inf * 0 = NaN;
            clip_grad_norm_(params, 1.0)         # harmless: that step is skipped
        before = scaler.get_scale()
        scaler.step(optimizer)                   # skipped if any gradient is inf / NaN
        scaler.update()
        skipped += scaler.get_scale() < before
        if master:
            master.master_to_model()
        schedule.step()
        losses.append(loss.item())
        scales.append(scaler.get_scale())
        bar.note(f"loss {np.mean(losses[-10:]):.3f}")
    underflow = amp.lost / max(amp.nonzero, 1)
    return losses, scales, skipped, underflow


print(f"GPT: {cfg.n_layer} layers, width {cfg.n_embd}, {args.steps} steps per run, "
      f"backend {backend.get_backend()}")
runs = {}
for mode in ("fp32", "bf16", "fp16", "fp16+scaling", "fp8"):
    runs[mode] = train(mode)

final = {m: float(np.mean(r[0][-10:])) for m, r in runs.items()}
print("\nfinal loss (mean of the last 10 steps)")
for mode, value in final.items():
    print(f"  {mode:>13}: {value:.4f}   (fp32 {value - final['fp32']:+.4f})")

scales, skipped = runs["fp16+scaling"][1], runs["fp16+scaling"][2]
changes = [0] + [i for i in range(1, len(scales)) if scales[i] != scales[i - 1]]
print(f"\nloss-scale trace (fp16 + scaling; {skipped} steps skipped on overflow):")
print("  " + ", ".join(f"step {i}: 2^{int(math.log2(scales[i]))}" for i in changes[:12])
      + (" ..." if len(changes) > 12 else "") + f"; final 2^{int(math.log2(scales[-1]))}")

no_scale, with_scale = runs["fp16"][3], runs["fp16+scaling"][3]
print("\ngradient values that underflow to 0 when rounded to fp16 in backward "
      "(nonzero before, 0 after; all steps):")
print(f"  without loss scaling: {no_scale:.3%}    with loss scaling: {with_scale:.3%}")

if args.figure:
    from _figures import precision_runs
    precision_runs(args.figure, runs, scales)

uniform = math.log(len(chars))
checks = [
    (f"every run trains: final losses < log({len(chars)}) - 0.5 = {uniform - 0.5:.3f}",
     all(v < uniform - 0.5 for v in final.values())),
    ("bf16, fp16 + scaling and fp8 end within 0.15 of fp32",
     all(abs(final[m] - final["fp32"]) < 0.15 for m in ("bf16", "fp16+scaling", "fp8"))),
    (f"loss scaling keeps more gradients: {with_scale:.3%} < {no_scale:.3%} underflow",
     with_scale < no_scale),
]
ok = True
for what, passed in checks:
    print(f"check: {what}: {'ok' if passed else 'FAILED'}")
    ok &= passed
sys.exit(0 if ok else 1)
