"""The GPT that the training-step benchmarks race, bench_autograd.py on the CPU and
bench_gpu.py on a GPU, defined once so that both time the same thing: minidist's GPT
and its PyTorch twin (tests/oracles/torch_gpt.py) with identical weights, one batch,
AdamW on each side.

``add_gpt_size_arguments`` imports nothing, so a script can add the size arguments
before NumPy loads its thread pool; ``build`` imports what it needs when called.
"""
import argparse
import pathlib
import sys
from _args import positive_int


def add_gpt_size_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch", type=positive_int, default=16)
    parser.add_argument("--block", type=positive_int, default=128)
    parser.add_argument("--n-layer", type=positive_int, default=4)
    parser.add_argument("--n-head", type=positive_int, default=4)
    parser.add_argument("--n-embd", type=positive_int, default=256)
    parser.add_argument("--vocab", type=positive_int, default=65)


def check_gpt_size(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse, as a usage error, sizes no GPT can have (before NumPy is loaded)."""
    if args.n_embd % args.n_head:
        parser.error(f"--n-embd ({args.n_embd}) must be divisible by --n-head ({args.n_head})")


def build(args: argparse.Namespace, device=None):
    """(model, minidist_step, torch_step) for the sizes in ``args``. A step is
    forward + backward + AdamW on the batch and returns the loss as a float;
    ``device``: where the PyTorch twin and its batch live (default: the CPU)."""
    import numpy as np
    import torch

    from minidist import backend
    from minidist.nn import GPT, GPTConfig
    from minidist.optim import AdamW
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
    from oracles.torch_gpt import torch_copy_of

    cfg = GPTConfig(block_size=args.block, vocab_size=args.vocab, n_layer=args.n_layer,
                    n_head=args.n_head, n_embd=args.n_embd)
    model = GPT(cfg)
    tmodel = torch_copy_of(model).to(device)
    opt = AdamW(model.parameters(), lr=1e-4)
    topt = torch.optim.AdamW(tmodel.parameters(), lr=1e-4, foreach=False)

    rng = np.random.default_rng(0)
    idx = rng.integers(0, args.vocab, (args.batch, args.block))
    tgt = rng.integers(0, args.vocab, (args.batch, args.block))
    idx_md, tgt_md = backend.from_host(idx), backend.from_host(tgt)
    idx_t, tgt_t = torch.from_numpy(idx).to(device), torch.from_numpy(tgt).to(device)

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

    return model, minidist_step, torch_step
