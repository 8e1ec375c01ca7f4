"""A block-scaled MLP step on one rank and in one process (for test_block_linear)."""
from __future__ import annotations

import numpy as np

import minidist.distributed as dist
from minidist import backend
from minidist.autograd import Tensor
from minidist.nn import Linear, Module
from minidist.optim import SGD
from minidist.parallel import DistributedDataParallel, Zero2, Zero3
from minidist.precision import BlockScaling, block_autocast


class Mlp(Module):
    def __init__(self, seed):
        super().__init__()
        gen = backend.Generator(seed)
        self.fc1 = Linear(64, 96, generator=gen)
        self.fc2 = Linear(96, 32, generator=gen)

    def forward(self, x):
        return self.fc2(self.fc1(x).tanh())


def batch(case):
    rng = np.random.default_rng(case["seed"])
    x = rng.standard_normal((case["world"] * case["tokens"], 64)).astype(np.float32)
    y = rng.standard_normal((case["world"] * case["tokens"], 32)).astype(np.float32)
    return x, y


def grads(model, x, y, recipe):
    with block_autocast(BlockScaling(recipe)):
        out = model(Tensor(backend.from_host(x)))
    diff = out - Tensor(backend.from_host(y))
    (diff * diff).mean().backward()


def single(case):
    model = Mlp(case["seed"])
    grads(model, *batch(case), case["recipe"])
    return {n: backend.to_host(p.grad) for n, p in model.named_parameters()}


def on_rank(case):
    rank, t = dist.get_rank(), case["tokens"]
    model = Mlp(case["seed"])
    ddp = DistributedDataParallel(model)
    x, y = batch(case)
    with block_autocast(BlockScaling(case["recipe"])):
        out = ddp(Tensor(backend.from_host(x[rank * t:(rank + 1) * t])))
    diff = out - Tensor(backend.from_host(y[rank * t:(rank + 1) * t]))
    (diff * diff).mean().backward()
    return {n: backend.to_host(p.grad) for n, p in model.named_parameters()}


def single_step(case):
    """One SGD step in one process: the parameters after it."""
    model = Mlp(case["seed"])
    opt = SGD(model.parameters(), lr=0.1)
    grads(model, *batch(case), case["recipe"])
    opt.step()
    return {n: backend.to_host(p.data).copy() for n, p in model.named_parameters()}


def zero_step_on_rank(case):
    """One SGD step under ZeRO-2 or ZeRO-3 with the block-scaled Linears."""
    rank, t = dist.get_rank(), case["tokens"]
    model = Mlp(case["seed"])
    cls = Zero2 if case["strategy"] == "zero2" else Zero3
    wrapped = cls(model, SGD, lr=0.1)
    x, y = batch(case)
    with block_autocast(BlockScaling(case["recipe"])):
        out = wrapped(Tensor(backend.from_host(x[rank * t:(rank + 1) * t])))
    diff = out - Tensor(backend.from_host(y[rank * t:(rank + 1) * t]))
    (diff * diff).mean().backward()
    wrapped.step()
    if case["strategy"] == "zero3":
        return {k: backend.to_host(v).copy() for k, v in wrapped.full_state_dict().items()}
    return {n: backend.to_host(p.data).copy() for n, p in model.named_parameters()}
