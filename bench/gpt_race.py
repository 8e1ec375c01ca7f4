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
    parser.add_argument("--model", choices=("gpt", "llama"), default="gpt",
                        help="gpt: minidist's GPT vs its PyTorch twin; llama: minidist's "
                             "Llama vs transformers' LlamaForCausalLM with the same weights")
    parser.add_argument("--n-kv-head", type=positive_int, default=None,
                        help="llama: key/value heads (default n-head / 2, or n-head if odd)")
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
    if args.n_kv_head is not None and args.n_head % args.n_kv_head:
        parser.error(f"--n-kv-head ({args.n_kv_head}) must divide --n-head ({args.n_head})")
    if args.model == "llama" and (args.n_embd // args.n_head) % 2:
        parser.error("--model llama needs an even head size (--n-embd / --n-head): rotary "
                     "embeddings pair its features")


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

    if getattr(args, "model", "gpt") == "llama":
        model, tmodel = _llama_pair(args)
        tmodel = tmodel.to(device)
    else:
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
        if getattr(args, "model", "gpt") == "llama":
            logits = tmodel(input_ids=idx_t).logits
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt_t.flatten())
        else:
            _, loss = tmodel(idx_t, tgt_t)
        topt.zero_grad()
        loss.backward()
        topt.step()
        return loss.item()

    return model, minidist_step, torch_step


def _llama_pair(args: argparse.Namespace):
    """minidist's Llama and transformers' LlamaForCausalLM (SDPA attention) with its weights;
    the SwiGLU width is 8/3 of the model's, rounded to a multiple of 8."""
    import torch
    import transformers

    from minidist import backend
    from minidist.nn import Llama, LlamaConfig
    kv = args.n_kv_head or (args.n_head // 2 if args.n_head % 2 == 0 else args.n_head)
    hidden = 8 * round(8 * args.n_embd / 3 / 8)
    cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=args.n_embd, intermediate_size=hidden,
                      num_hidden_layers=args.n_layer, num_attention_heads=args.n_head,
                      num_key_value_heads=kv, max_position_embeddings=args.block)
    model = Llama(cfg)
    tcfg = transformers.LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.n_embd, intermediate_size=hidden,
        num_hidden_layers=args.n_layer, num_attention_heads=args.n_head,
        num_key_value_heads=kv, max_position_embeddings=args.block,
        rms_norm_eps=cfg.rms_norm_eps, attn_implementation="sdpa", use_cache=False)
    tmodel = transformers.LlamaForCausalLM(tcfg)
    state = {k: torch.from_numpy(backend.to_host(v).copy()) for k, v in model.state_dict().items()}
    tmodel.load_state_dict(state, strict=True)
    return model, tmodel
