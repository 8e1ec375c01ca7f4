"""Training runs that stop, save, and resume (one rank's side), for the checkpoint tests.

A data set of 48 samples is read through ``DistributedSampler`` with a global
batch of 12 (so 12 / N per rank at N = 2, 3, 4, 6); a run of 6 steps crosses into
a second epoch (``set_epoch``). ``run(case, directory, start, stop)`` builds a
fresh model -- from a *different* seed than the first run, so that loading must
do the work -- loads the checkpoint if ``start > 0``, trains steps
[start, stop), saves if asked, and returns the full parameters and the step count
the model keeps in a buffer.
"""
from __future__ import annotations

import numpy as np

import minidist.distributed as dist
from minidist import backend
from minidist.autograd import Tensor
from minidist.nn import Linear, Module
from minidist.checkpoint import load_checkpoint, load_sharded, save_checkpoint, save_sharded
from minidist.optim import AdamW, clip_grad_norm_
from minidist.parallel import DistributedDataParallel, DistributedSampler, Zero1, Zero2, Zero3

LENGTH, GLOBAL_BATCH, D_IN, D_OUT = 48, 12, 5, 3


class TinyNet(Module):
    def __init__(self, d_in, hidden, d_out, dtype, seed):
        super().__init__()
        gen = backend.Generator(seed)
        self.fc1 = Linear(d_in, hidden, dtype=dtype, generator=gen)
        self.fc2 = Linear(hidden, d_out, dtype=dtype, generator=gen)
        self.register_buffer("steps", backend.xp.zeros((1,), dtype=dtype))   # not trained

    def forward(self, x):
        return self.fc2(self.fc1(x).tanh())


def dataset(seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((LENGTH, D_IN)), rng.standard_normal((LENGTH, D_OUT))


def next_indices(sampler, it, count):
    """The next ``count`` sample indices of this rank, into the next epoch if need be
    (a new epoch, a new order); returns them and the iterator to go on with."""
    idx = []
    while len(idx) < count:
        try:
            idx.append(next(it))
        except StopIteration:
            sampler.set_epoch(sampler.epoch + 1)
            it = iter(sampler)
    return idx, it


def run(case, directory, start, stop, save=True):
    rank, n = dist.get_rank(), dist.get_world_size()
    model = TinyNet(D_IN, 6, D_OUT, "float64", seed=100 + start)
    strategy = case["strategy"]
    sampler = DistributedSampler(LENGTH, seed=case["seed"])
    kw = dict(lr=0.02, weight_decay=0.1)
    if strategy == "ddp":
        wrapped = DistributedDataParallel(model)
        opt = AdamW(model.parameters(), **kw)
    else:
        zcls = {"zero1": Zero1, "zero2": Zero2, "zero3": Zero3}[strategy]
        wrapped = zcls(model, AdamW, max_grad_norm=0.5, bucket_cap_mb=1e-4, **kw) \
            if strategy != "zero3" else zcls(model, AdamW, max_grad_norm=0.5, **kw)
    if start > 0:
        if strategy == "ddp":
            load_checkpoint(f"{directory}/ckpt.npz", model, opt, sampler)
        else:
            load_sharded(directory, wrapped, sampler)
    x, y = dataset(case["seed"])
    per_rank = GLOBAL_BATCH // n
    it = iter(sampler)
    for _ in range(start, stop):
        idx, it = next_indices(sampler, it, per_rank)
        xb = Tensor(backend.from_host(x[idx]))
        diff = wrapped(xb) - Tensor(backend.from_host(y[idx]))
        (diff * diff).mean().backward()
        if strategy == "ddp":
            clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
            opt.zero_grad()
        else:
            wrapped.step()
            wrapped.zero_grad()
        model.steps = model.steps + 1      # a buffer: saved once, loaded on every rank
    if save:
        if strategy == "ddp":
            save_checkpoint(f"{directory}/ckpt.npz", model, opt, sampler)
        else:
            save_sharded(directory, wrapped, sampler)
    if strategy == "zero3":
        out = {k: backend.to_host(v).copy() for k, v in wrapped.full_state_dict().items()}
    else:
        out = {k: backend.to_host(p.data).copy() for k, p in model.named_parameters()}
    return {**out, "steps": backend.to_host(model.steps).copy()}
