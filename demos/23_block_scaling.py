"""Demo 23: train the small GPT with block-scaled matmuls (MX, NVFP4, DeepSeek-V3 FP8).

Every run starts from the same weights and sees the same batches; only the
format the Linears' matmuls run in differs (minidist/precision, docs/block_scaling.md):

- bf16:            autocast("bf16"), the reference.
- fp8 per-tensor:  E4M3 inputs, E5M2 gradients, one scale per tensor (current scaling).
- mxfp8:           E4M3, a power-of-two scale per 32 along each contraction axis.
- fp8 blockwise:   E4M3, FP32 scales per 1x128 tile (x, gradients) / 128x128 block (W).
- mxfp4:           E2M1, a power-of-two scale per 32.
- nvfp4:           E2M1, an E4M3 scale per 16 under an FP32 tensor scale.
- nvfp4 +RHT +SR:  and a 16x16 random Hadamard on the wgrad operands, stochastic
                   rounding of gradients, the last block and the head in BF16.

The weights stay float32 (the optimizer's copy); the block recipes quantize
them, the activations and the gradients afresh at every matmul. After training,
one batch's real Linear inputs, weights and output gradients (from the bf16 run's
model) are quantized in each format and the SQNR (signal to quantization noise,
10 log10(sum x^2 / sum (x - Q(x))^2), in dB) is printed per kind of tensor.

    python demos/23_block_scaling.py                   # about a minute on 2 cores
    python demos/23_block_scaling.py --full            # 300 steps, a wider model
    python demos/23_block_scaling.py --figure /tmp/block_scaling.png

The checks: every run trains, MXFP8 and blockwise FP8 end near BF16, and the
8-bit block formats keep more SQNR than the 4-bit ones.
"""
import argparse
import math
import pathlib
import sys

import numpy as np

import minidist
from minidist import backend
from minidist.autograd.tensor import Tensor
from minidist.nn import GPT, GPTConfig
from minidist.optim import AdamW, WarmupCosine, clip_grad_norm_
from minidist.precision import (BlockScaledTensor, BlockScaling, CurrentScaling, Round,
                                autocast, block_autocast, fp8_autocast, quantize, use_policy)
from minidist.precision.block_linear import hadamard_rows
from _progress import Progress
from _args import non_negative_int, or_usage_error, positive, positive_int

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--steps", type=positive_int, default=40, help="optimizer steps per run")
parser.add_argument("--batch", type=positive_int, default=8, help="sequences per step")
parser.add_argument("--block", type=positive_int, default=32, help="context length (characters)")
parser.add_argument("--n-layer", type=positive_int, default=2)
parser.add_argument("--n-head", type=positive_int, default=4)
parser.add_argument("--n-embd", type=positive_int, default=64)
parser.add_argument("--lr", type=positive, default=3e-3, help="peak learning rate")
parser.add_argument("--full", action="store_true",
                    help="the long run: 300 steps, batch 16 x 64, width 128 (tens of minutes)")
parser.add_argument("--figure", metavar="PATH", help="save the loss curves as a PNG")
parser.add_argument("--seed", type=non_negative_int, default=0)
args = parser.parse_args()
if args.full:
    args.steps, args.batch, args.block, args.n_embd = 300, 16, 64, 128

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


def policy(mode, model):
    """The context each run's forward pass runs in."""
    if mode == "bf16":
        return autocast("bf16")
    if mode == "fp8 per-tensor":
        return fp8_autocast(CurrentScaling())
    if mode == "nvfp4 +RHT +SR":
        last = list(model.blocks[-1].parameters()) + [model.lm_head.weight]
        return block_autocast(BlockScaling("nvfp4", stochastic_grad=True, hadamard=True,
                                           keep_bf16=last, seed=args.seed))
    recipe = {"mxfp8": "mxfp8", "fp8 blockwise": "fp8_blockwise", "mxfp4": "mxfp4",
              "nvfp4": "nvfp4"}[mode]
    return block_autocast(BlockScaling(recipe))


def train(mode):
    minidist.manual_seed(args.seed)
    model = GPT(cfg)
    params = list(model.parameters())
    optimizer = AdamW(params, lr=args.lr, weight_decay=0.01)
    schedule = WarmupCosine(optimizer, warmup_steps=max(args.steps // 10, 1),
                            total_steps=args.steps, min_lr=args.lr / 10)
    stream, losses = batches(args.seed), []
    bar = Progress(range(args.steps), f"{mode:>15}")
    for _ in bar:
        x, y = next(stream)
        with policy(mode, model):
            _, loss = model(x, y)
        optimizer.zero_grad()
        loss.backward()
        clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        bar.note(f"loss {np.mean(losses[-10:]):.3f}")
    return losses, model


class Capture:
    """A policy that runs Linears in float32 and keeps their inputs, weights and
    output gradients (the tensors a block-scaled matmul quantizes)."""

    def __init__(self):
        self.tensors = {"activations": [], "weights": [], "gradients": []}

    def run(self, fn, args_):
        if len(args_) == 3 and isinstance(args_[1], Tensor) and args_[1].ndim == 2:
            x, w = args_[0].data, args_[1].data
            self.tensors["activations"].append(x.reshape(-1, x.shape[-1]))
            self.tensors["weights"].append(w)
            keep = self.tensors["gradients"].append
            return Round.apply(fn(*args_), bwd=lambda g: (keep(g.reshape(-1, g.shape[-1])), g)[1])
        return fn(*args_)


def per_tensor_fp8(a):
    """E4M3 with one scale: amax -> 448."""
    s = np.float32(448) / xp_max(a)
    return quantize(a * s, "e4m3fn", saturate=True) / s


def per_tensor_fp4(a):
    """E2M1 with one scale: amax -> 6."""
    s = np.float32(6) / xp_max(a)
    return quantize(a * s, "e2m1fn") / s


def xp_max(a):
    return np.float32(float(backend.to_host(abs(a).max())))


FORMATS = {    # name -> x -> Q(x), x 2-D (rows, contraction axis last)
    "bf16": lambda a: quantize(a, "bf16"),
    "fp8 per-tensor": per_tensor_fp8,
    "mxfp8": lambda a: BlockScaledTensor.quantize(a, "mxfp8").dequantize(),
    "fp8 blockwise": lambda a: BlockScaledTensor.quantize(a, "fp8_blockwise_tile").dequantize(),
    "mxfp6 (e2m3)": lambda a: BlockScaledTensor.quantize(a, "mxfp6").dequantize(),
    "mxfp4": lambda a: BlockScaledTensor.quantize(a, "mxfp4").dequantize(),
    "nvfp4": lambda a: BlockScaledTensor.quantize(a, "nvfp4").dequantize(),
}


def sqnr_db(arrays, q):
    signal = noise = 0.0
    for a in arrays:
        a = a.astype("float32")
        err = a - q(a)
        signal += float(backend.to_host((a * a).sum()))
        noise += float(backend.to_host((err * err).sum()))
    return 10 * math.log10(signal / noise) if noise > 0 else math.inf


def sqnr_table(model):
    """Capture one batch's Linear tensors and quantize them in every format."""
    cap = Capture()
    x, y = next(batches(args.seed + 1))
    with use_policy(cap):
        _, loss = model(x, y)
    loss.backward()
    model.zero_grad()
    table = {name: {kind: sqnr_db(arrays, q) for kind, arrays in cap.tensors.items()}
             for name, q in FORMATS.items()}
    h = BlockScaling("nvfp4", hadamard=True).h      # the wgrad operands after the RHT
    rotated = [hadamard_rows(g, h) for g in cap.tensors["gradients"]]
    table["nvfp4 +RHT (grad^T)"] = {"gradients": sqnr_db(
        [backend.from_host(np.ascontiguousarray(backend.to_host(g).T)) for g in rotated],
        FORMATS["nvfp4"])}
    table["nvfp4 (grad^T)"] = {"gradients": sqnr_db(
        [backend.from_host(np.ascontiguousarray(backend.to_host(g).T))
         for g in cap.tensors["gradients"]], FORMATS["nvfp4"])}
    return table


def outlier_table():
    """SQNR of the ordinary channels of a (256, 1024) normal matrix whose channel 7 is
    multiplied by K: the outlier sets a per-tensor scale, but only its own blocks' scales."""
    rng = np.random.default_rng(args.seed)
    base = rng.standard_normal((256, 1024)).astype(np.float32)
    keep = np.ones(base.shape, bool)
    keep[:, 7] = False
    rows = {}
    for name, q in [("fp8 per-tensor", per_tensor_fp8), ("fp4 per-tensor", per_tensor_fp4)] + \
            [(n, FORMATS[n]) for n in ("mxfp8", "fp8 blockwise", "mxfp4", "nvfp4")]:
        rows[name] = []
        for k in OUTLIERS:
            x = base.copy()
            x[:, 7] *= k
            err = (x - backend.to_host(q(backend.from_host(x))))[keep]
            rows[name].append(10 * math.log10(float((x[keep] ** 2).sum()) / float((err ** 2).sum()))
                              if (err ** 2).sum() > 0 else math.inf)
    return rows


OUTLIERS = (1, 100, 10000)
MODES = ("bf16", "fp8 per-tensor", "mxfp8", "fp8 blockwise", "mxfp4", "nvfp4", "nvfp4 +RHT +SR")
print(f"GPT: {cfg.n_layer} layers, width {cfg.n_embd}, {args.steps} steps per run, "
      f"batch {args.batch} x {args.block}, backend {backend.get_backend()}")
runs, models = {}, {}
for mode in MODES:
    runs[mode], models[mode] = train(mode)

final = {m: float(np.mean(r[-10:])) for m, r in runs.items()}
print("\nfinal loss (mean of the last 10 steps)")
for mode, value in final.items():
    print(f"  {mode:>15}: {value:.4f}   (bf16 {value - final['bf16']:+.4f})")

table = sqnr_table(models["bf16"])
print("\nSQNR in dB of the bf16 run's Linear tensors (one batch; higher is better;"
      " blocks along the contraction axis)")
print(f"  {'format':>20} {'activations':>12} {'weights':>9} {'gradients':>10}")
for name, row in table.items():
    cells = [f"{row[k]:.1f}" if k in row else "" for k in ("activations", "weights", "gradients")]
    print(f"  {name:>20} {cells[0]:>12} {cells[1]:>9} {cells[2]:>10}")

outliers = outlier_table()
print("\nSQNR in dB of the other channels when one channel of N(0, 1) data is K times larger")
print(f"  {'format':>20} " + " ".join(f"{'K = ' + str(k):>10}" for k in OUTLIERS))
for name, row in outliers.items():
    print(f"  {name:>20} " + " ".join(f"{v:10.1f}" for v in row))

if args.figure:
    from _figures import block_scaling_runs
    block_scaling_runs(args.figure, runs)

uniform = math.log(len(chars))
eight = [table[f]["activations"] for f in ("mxfp8", "fp8 blockwise")]
four = [table[f]["activations"] for f in ("mxfp4", "nvfp4")]
checks = [
    (f"every run trains: final losses < log({len(chars)}) - 0.5 = {uniform - 0.5:.3f}",
     all(v < uniform - 0.5 for v in final.values())),
    ("mxfp8 and fp8 blockwise end within 0.1 of bf16",
     all(abs(final[m] - final["bf16"]) < 0.1 for m in ("mxfp8", "fp8 blockwise"))),
    (f"8-bit block formats keep more SQNR than 4-bit ones on activations: "
     f"{min(eight):.1f} > {max(four):.1f} dB", min(eight) > max(four)),
    ("with a 10000x outlier channel, NVFP4 keeps the other channels (> 10 dB) where "
     "per-tensor FP4 loses them (< 1 dB)",
     outliers["nvfp4"][-1] > 10 and outliers["fp4 per-tensor"][-1] < 1),
]
ok = True
for what, passed in checks:
    print(f"check: {what}: {'ok' if passed else 'FAILED'}")
    ok &= passed
sys.exit(0 if ok else 1)
