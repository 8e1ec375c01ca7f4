"""A GPT (or Llama) training step in minidist vs PyTorch CPU eager, in one run.

Both build the same model (minidist.nn.GPT and its PyTorch twin from
tests/oracles/torch_gpt.py, or with ``--model llama`` minidist.nn.Llama and
transformers' LlamaForCausalLM, both with identical weights), and time
forward + backward + AdamW step on the same batch, float32, with the same
number of threads for NumPy's BLAS and for PyTorch. Steps alternate between
the two so that machine noise hits both alike; the median is reported.

    python bench/bench_autograd.py                 # defaults: 4 layers, width 256
    python bench/bench_autograd.py --threads 1 --steps 20
    python bench/bench_autograd.py --model llama   # GQA: n-head / 2 key/value heads

Prints each framework's median step time and the ratio minidist / PyTorch.
"""
import argparse
import os
import sys

import gpt_race
from _args import positive_int

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--threads", type=positive_int, default=os.cpu_count() or 1)
parser.add_argument("--steps", type=positive_int, default=15, help="timed steps per framework")
gpt_race.add_gpt_size_arguments(parser)  # the same GPT as bench_gpu.py
args = parser.parse_args()
gpt_race.check_gpt_size(parser, args)

# thread counts must be fixed before NumPy / PyTorch load their thread pools
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(args.threads)


import numpy as np  # noqa: E402

from minidist import backend  # noqa: E402

try:
    import torch
except ImportError:
    sys.exit("bench_autograd needs PyTorch (pip install torch) as the reference")
torch.set_num_threads(args.threads)

model, minidist_step, torch_step = gpt_race.build(args)
cfg = model.config


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
kind = "Llama" if args.model == "llama" else "GPT"
extra = f" ({cfg.num_key_value_heads} kv)" if args.model == "llama" else ""
dims = cfg.dims()
print(f"{kind} training step: {dims.layers} layers, width {dims.width}, {dims.heads} heads{extra}, "
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
