"""Measure what the cost models predict, on minidist's own GPT.

    layer_saved_bytes   bytes one ``Block`` keeps for backward (autograd.saved_bytes),
                        against calc.minidist_layer_activation_bytes and Korthikanti et
                        al. 2022's sbh (34 + 5as/h)
    step_matmul_flops   FLOPs of every matrix product one training step runs
                        (backend.MatmulFlopCounter), against Narayanan et al. 2021's
                        eq. 3, with and without activation checkpointing

Both are counts, not timings: the same on every run and every machine.
demos/14_cost_models_observed.py prints them side by side.
"""
from __future__ import annotations

from minidist import backend
from minidist.autograd.activation_checkpoint import checkpoint as checkpointed
from minidist.autograd.saved_bytes import saved_bytes
from minidist.autograd.selective_checkpoint import policy_of
from minidist.autograd.tensor import Tensor
from minidist.nn.gpt import GPT, Block, GPTConfig


def layer_saved_bytes(seq: int, batch: int, hidden: int, heads: int, *,
                      attention: str = "naive", checkpoint: bool | str = False,
                      dtype: str = "float32") -> int:
    """Bytes one GPT block keeps for backward after its forward on a (batch, seq, hidden) input.

    checkpoint=True runs the block under activation checkpointing, which keeps
    its input only; "selective" keeps the matmuls' and attention's results too
    (autograd/selective_checkpoint.py). Parameters are not counted.
    """
    cfg = GPTConfig(block_size=seq, n_embd=hidden, n_head=heads, attention=attention,
                    dtype=dtype)
    block = Block(cfg, backend.Generator(0))
    x = backend.Generator(1).normal((batch, seq, hidden), dtype=dtype)
    x = Tensor(x, requires_grad=True)                                    # (b, s, h)
    y = checkpointed(block, x, policy=policy_of(checkpoint)) if checkpoint else block(x)
    return saved_bytes(y, exclude=block.parameters())


def step_matmul_flops(batch: int, seq: int, layers: int, hidden: int, heads: int,
                      vocab: int, *, attention: str = "naive",
                      checkpoint: bool | str = False) -> int:
    """Matmul FLOPs of one forward and backward of a GPT on (batch, seq) tokens."""
    cfg = GPTConfig(block_size=seq, vocab_size=vocab, n_layer=layers, n_head=heads,
                    n_embd=hidden, attention=attention, checkpoint=checkpoint)
    model = GPT(cfg)
    gen = backend.Generator(2)
    idx = gen.integers(0, vocab, (batch, seq))
    targets = gen.integers(0, vocab, (batch, seq))
    with backend.MatmulFlopCounter() as counter:
        _, loss = model(idx, targets)
        loss.backward()
    return counter.flops
