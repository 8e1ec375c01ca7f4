"""What demos 07 and 17 share: the stand-in stage of their timing runs (op costs are
padded) and the single-process GPT whose gradients every schedule must reproduce."""
import numpy as np

from minidist.backend import from_host, to_host
from minidist.nn import GPT, GPTConfig, Linear, Module


class Piece(Module):
    """A small linear layer; the last piece returns a scalar loss, mean(y^2)."""

    def __init__(self, last):
        super().__init__()
        self.lin, self.last = Linear(8, 8, dtype="float64"), last

    def forward(self, x, target=None):
        y = self.lin(x)
        return (y * y).mean() if self.last else y


def reference_gpt(n_layer, m):
    """A float64 GPT of ``n_layer`` blocks, a batch of 2m sequences, and the gradients one
    process computes on it: (config, idx, targets, {name: gradient})."""
    cfg = GPTConfig(block_size=8, vocab_size=16, n_layer=n_layer, n_head=2, n_embd=16,
                    dtype="float64")
    rng = np.random.default_rng(0)
    idx, tgt = (rng.integers(0, cfg.vocab_size, (2 * m, cfg.block_size)) for _ in range(2))
    dense = GPT(cfg)
    _, loss = dense(from_host(idx), from_host(tgt))
    loss.backward()
    return cfg, idx, tgt, {n: to_host(q.grad) for n, q in dense.named_parameters()}
