"""A GPT training step in minidist vs PyTorch CPU eager, in one run.

Both build the same model (minidist.nn.GPT and its PyTorch twin from
tests/oracles/torch_gpt.py, with identical weights), and time
forward + backward + AdamW step on the same batch, float32, with the same
number of threads for NumPy's BLAS and for PyTorch. Steps alternate between
the two so that machine noise hits both alike; the median is reported.

    python bench/bench_autograd.py                 # defaults: 4 layers, width 256
    python bench/bench_autograd.py --threads 1 --steps 20

Prints each framework's median step time and the ratio minidist / PyTorch.
"""
import argparse
import os
import pathlib
import sys

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
parser.add_argument("--steps", type=int, default=15, help="timed steps per framework")
parser.add_argument("--batch", type=int, default=16)
parser.add_argument("--block", type=int, default=128)
parser.add_argument("--n-layer", type=int, default=4)
parser.add_argument("--n-head", type=int, default=4)
parser.add_argument("--n-embd", type=int, default=256)
parser.add_argument("--vocab", type=int, default=65)
args = parser.parse_args()

# thread counts must be fixed before NumPy / PyTorch load their thread pools
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(args.threads)


import numpy as np  # noqa: E402

from minidist import backend  # noqa: E402
from minidist.nn import GPT, GPTConfig  # noqa: E402
from minidist.optim import AdamW  # noqa: E402

try:
    import torch
except ImportError:
    sys.exit("bench_autograd needs PyTorch (pip install torch) as the reference")
torch.set_num_threads(args.threads)
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
from oracles.torch_gpt import torch_copy_of  # noqa: E402

cfg = GPTConfig(block_size=args.block, vocab_size=args.vocab, n_layer=args.n_layer,
                n_head=args.n_head, n_embd=args.n_embd)
model = GPT(cfg)
tmodel = torch_copy_of(model)
opt = AdamW(model.parameters(), lr=1e-4)
topt = torch.optim.AdamW(tmodel.parameters(), lr=1e-4, foreach=False)

rng = np.random.default_rng(0)
idx = rng.integers(0, args.vocab, (args.batch, args.block))
tgt = rng.integers(0, args.vocab, (args.batch, args.block))
idx_md, tgt_md = backend.from_host(idx), backend.from_host(tgt)
idx_t, tgt_t = torch.from_numpy(idx), torch.from_numpy(tgt)


def minidist_step() -> float:
    _, loss = model(idx_md, tgt_md)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()


def torch_step() -> float:
    _, loss = tmodel(idx_t, tgt_t)
    topt.zero_grad()
    loss.backward()
    topt.step()
    return loss.item()


def timed(step) -> float:
    with backend.Timer() as t:
        step()
    return t.seconds


first = minidist_step(), torch_step()
for _ in range(2):  # warm up allocators and thread pools
    minidist_step(), torch_step()
times = {"minidist": [], "torch": []}
for _ in range(args.steps):
    times["minidist"].append(timed(minidist_step))
    times["torch"].append(timed(torch_step))

tokens = args.batch * args.block
print(f"GPT training step: {cfg.n_layer} layers, width {cfg.n_embd}, {cfg.n_head} heads, "
      f"batch {args.batch} x {args.block} tokens, vocab {args.vocab}, "
      f"{model.num_parameters():,} params, float32, {args.threads} threads")
print(f"first-step loss: minidist {first[0]:.6f}  torch {first[1]:.6f}")
print(f"{'framework':<10} {'median ms':>10} {'min ms':>8} {'tokens/s':>10}")
med = {}
for name, ts in times.items():
    med[name] = float(np.median(ts))
    print(f"{name:<10} {1e3 * med[name]:10.1f} {1e3 * min(ts):8.1f} {tokens / med[name]:10.0f}")
print(f"ratio minidist / torch (median step time): {med['minidist'] / med['torch']:.2f}x "
      f"(target <= 1.25x)")
