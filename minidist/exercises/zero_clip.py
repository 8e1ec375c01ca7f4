"""35.23 the ZeRO clip on a shard (debug): each rank clips by the norm of its own shard.

Gradient-norm clipping divides every gradient by max(1, ||g|| / max_norm), with
||g|| the norm of the whole model's gradient. Under ZeRO each rank holds only
its shard of the reduced gradient, so ||g|| = sqrt(sum_r ||g_r||^2): one
all-reduce of one number (docs/zero.md, "Clipping"). The planted bug takes
||g_r|| for ||g||: each rank clips its shard by its own factor, the clipped
gradient points elsewhere, and the weights drift from single-process training
(exercise 35.23 (a): gradient-norm monitoring per rank). Graded with the
driver of 35.12 (zero.py), clipping on.
"""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from minidist.exercises.core import Exercise, Property
from minidist.exercises.zero import OPTIMIZERS, compare_weights, drive_zero, reference

clip_cases = dict(seed=st.integers(0, 1000), world=st.integers(1, 4), steps=st.integers(1, 3),
                  opt=st.sampled_from(list(OPTIMIZERS)),
                  max_norm=st.sampled_from([0.05, 0.3, 1.0, 100.0]))


def _norm_is_the_models(s, seed, world, steps, opt, max_norm):
    results = s.run(world, drive_zero, seed, world, 1, steps, opt, max_norm)
    want = reference(seed, world, 1, steps, opt, max_norm)[1]
    for r, (_, norms, _) in enumerate(results):
        assert None not in norms, f"rank {r}: step() returned None; return the gradient norm"
        assert np.allclose(norms, want, rtol=1e-9), \
            f"rank {r}: step() returned the norms {np.round(norms, 6).tolist()}; the whole " \
            f"model's gradient norm, per step, is {np.round(want, 6).tolist()}"


def _clipped_training_matches(s, seed, world, steps, opt, max_norm):
    results = s.run(world, drive_zero, seed, world, 1, steps, opt, max_norm)
    compare_weights(results, reference(seed, world, 1, steps, opt, max_norm)[0],
                    f"{steps} {opt} step(s) clipped to {max_norm}")


# A ZeRO-1 written from send/recv-level collectives, its clip as the learner finds it.
STARTER = '''"""Exercise 35.23 (the ZeRO clip on a shard): find the bug.

A ZeRO stage 1 with gradient-norm clipping. Each rank keeps the optimizer
state of its shard of the flat parameters (S = ceil(P/N) numbers); a step
reduce-scatters the gradients (a mean), clips, updates the shard and
all-gathers the weights. Clipping must act as on one process:

    ||g|| = the norm of the WHOLE model's mean gradient
    if ||g|| > max_norm: every gradient *= max_norm / (||g|| + 1e-6)
    step() returns ||g|| (as torch.nn.utils.clip_grad_norm_ does)

Without clipping, this version trains exactly like one process on the whole
batch. With clipping its weights drift, and the norm it returns is a
different number on every rank. Find out why, fix it, and run
`minidist exercise check 35.23`.
"""
import math

import minidist.comm as comm
from minidist.autograd import Tensor
from minidist.backend import from_host, to_host, xp


class Zero1:
    def __init__(self, module, optimizer_class, max_grad_norm=None, **optimizer_kwargs):
        self.max_grad_norm = max_grad_norm
        self.n, rank = comm.get_world_size(), comm.get_rank()
        self.params = list(module.parameters())
        for p in self.params:
            comm.broadcast(p.data, src=0)
        numel = sum(p.data.size for p in self.params)                 # P
        self.size = -(-numel // self.n)                               # S = ceil(P / N)
        lo = rank * self.size
        flat = self._flat([p.data for p in self.params])
        self.shard = Tensor(flat[lo:lo + self.size].copy(), requires_grad=True)   # (S,)
        self.optimizer = optimizer_class([self.shard], **optimizer_kwargs)

    def _flat(self, arrays):
        flat = xp.zeros(self.size * self.n)                           # (N*S,), zero padding
        offset = 0
        for a in arrays:
            flat[offset:offset + a.size] = a.reshape(-1)
            offset += a.size
        return flat

    def step(self):
        mine = xp.empty(self.size)                                    # (S,)
        comm.reduce_scatter_tensor(mine, self._flat([p.grad for p in self.params]))
        self.shard.grad = mine / self.n                               # the mean
        norm = None
        if self.max_grad_norm is not None:
            norm = self.clip(self.max_grad_norm)
        self.optimizer.step()
        flat = xp.empty(self.size * self.n)                           # (N*S,)
        comm.all_gather_into_tensor(flat, self.shard.data)
        offset = 0
        for p in self.params:
            p.data[...] = flat[offset:offset + p.data.size].reshape(p.data.shape)
            offset += p.data.size
        return norm

    def clip(self, max_norm):
        g = self.shard.grad
        norm = math.sqrt(float(to_host((g * g).sum())))
        coef = max_norm / (norm + 1e-6)
        if coef < 1.0:
            g *= coef
        return norm
'''

PLANTED = '''        norm = math.sqrt(float(to_host((g * g).sum())))
'''

# the fix, to show that the starter is right everywhere else (tests/exercises)
FIXED = STARTER.replace(PLANTED, '''        total = from_host([float(to_host((g * g).sum()))])
        comm.all_reduce(total)
        norm = math.sqrt(float(to_host(total)[0]))
''')

CLIP = Exercise(
    id="35.23", processes=True, title="the ZeRO clip on a shard", kind="debug",
    filename="ex_35_23_zero_clip.py",
    docs="docs/zero.md (Clipping)",
    starter=STARTER, fixed=FIXED,
    properties=[
        Property("step() returns the whole model's gradient norm, on every rank",
                 _norm_is_the_models, clip_cases, examples=6,
                 hint="docs/zero.md, Clipping: whose gradient does this rank see? The squares "
                      "add up over the shards"),
        Property("clipped steps give the weights of one process on the whole batch",
                 _clipped_training_matches, clip_cases, examples=6,
                 hint="docs/zero.md, Clipping: every rank must scale by the same factor"),
    ],
    solution='''from minidist.parallel.zero import Zero1
''',
    wrong={
        "the planted bug": "",
        "sums the shards' norms": STARTER.replace(PLANTED, '''        total = from_host([math.sqrt(float(to_host((g * g).sum())))])
        comm.all_reduce(total)
        norm = float(to_host(total)[0])
'''),
    })

EXERCISES = [CLIP]
