"""35.12 ZeRO stage 1: the optimizer state cut into N shards, graded on real processes.

Each of N ranks trains the same small model (initialised differently on each
rank, so the broadcast matters) on its slice of the global batch for a few
steps; the learner's ``Zero1`` reduce-scatters the gradients, updates this
rank's shard with an optimizer built on that shard alone, and all-gathers the
weights. After k steps every rank's weights must equal one process trained on
the whole batch, and each rank's AdamW state must cover only ceil(P/N) of the
P parameters. zero_clip.py (35.23) reuses the driver with clipping on.
"""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from minidist.exercises.core import Exercise, Property
from minidist.exercises.ddp import D, H, _batch, _loss, _model

P = D * H + H + H + 1                   # parameters of _model: 21
# the optimizers the properties draw: SGD shows a wrong scale at once, AdamW is the document's
OPTIMIZERS = {"sgd": ("SGD", dict(lr=0.1, momentum=0.9)),
              "adamw": ("AdamW", dict(lr=0.01, weight_decay=0.1))}


def _optimizer(name: str):
    import minidist.optim as optim
    cls, kwargs = OPTIMIZERS[name]
    return getattr(optim, cls), kwargs


def reference(seed: int, world: int, per_rank: int, steps: int, opt: str,
              max_grad_norm: float | None = None) -> tuple[list, list]:
    """One process, the whole batch of every step, rank 0's initial weights:
    the weights after ``steps`` steps and the gradient norm of each step."""
    from minidist.backend import to_host
    from minidist.optim import clip_grad_norm_
    model = _model(seed)
    cls, kwargs = _optimizer(opt)
    optimizer = cls(model.parameters(), **kwargs)
    norms = []
    for t in range(steps):
        x, y = _batch(seed + 100 * t, world * per_rank)
        _loss(model, x, y).backward()
        if max_grad_norm is not None:
            norms.append(clip_grad_norm_(model.parameters(), max_grad_norm))
        optimizer.step()
        optimizer.zero_grad()
    return [to_host(p.data).copy() for p in model.parameters()], norms


def drive_zero(module, seed, world, per_rank, steps, opt, max_grad_norm=None):
    """In rank r: the learner's Zero1 over a model initialised with seed + r; ``steps``
    steps on this rank's slice. Returns (weights, the norms step() returned, the
    number of elements in the optimizer's state arrays)."""
    from minidist.backend import to_host
    from minidist.comm import get_rank
    r = get_rank()
    model = _model(seed + r)
    cls, kwargs = _optimizer(opt)
    extra = {} if max_grad_norm is None else {"max_grad_norm": max_grad_norm}
    zero = module.Zero1(model, cls, **extra, **kwargs)
    norms = []
    for t in range(steps):
        x, y = _batch(seed + 100 * t, world * per_rank)
        mine = slice(r * per_rank, (r + 1) * per_rank)
        _loss(model, x[mine], y[mine]).backward()
        norms.append(zero.step())
        for p in model.parameters():
            p.grad = None
    state = getattr(zero, "optimizer", None)
    assert state is not None, "Zero1 has no attribute 'optimizer': build it on this rank's shard"
    held = sum(int(v.size) for s in state.state.values() for v in s.values()
               if getattr(v, "ndim", 0) > 0)
    return [to_host(p.data).copy() for p in model.parameters()], norms, held


def compare_weights(results, want, what: str) -> None:
    for r, (weights, _, _) in enumerate(results):
        for i, (w, ref) in enumerate(zip(weights, want)):
            assert np.allclose(w, ref, rtol=1e-9, atol=1e-10), \
                f"rank {r}, parameter {i} after {what}: {np.round(w, 5).ravel().tolist()}; one " \
                f"process on the whole batch gives {np.round(ref, 5).ravel().tolist()} (off by " \
                f"up to {np.max(np.abs(w - ref)):.2g})"


train_cases = dict(seed=st.integers(0, 1000), world=st.integers(1, 4), per_rank=st.integers(1, 2),
                   steps=st.integers(1, 3), opt=st.sampled_from(list(OPTIMIZERS)))


def _trains_like_one_process(s, seed, world, per_rank, steps, opt):
    results = s.run(world, drive_zero, seed, world, per_rank, steps, opt)
    compare_weights(results, reference(seed, world, per_rank, steps, opt)[0],
                    f"{steps} {opt} step(s) on {world} ranks")


def _state_is_sharded(s, world):
    results = s.run(world, drive_zero, 3, world, 1, 1, "adamw")
    shard = -(-P // world)
    held = [h for _, _, h in results]
    for r, h in enumerate(held):
        assert h <= 2 * shard, f"rank {r} keeps AdamW state for {h // 2} parameters (exp_avg " \
            f"and exp_avg_sq: {h} numbers); its shard is ceil(P/N) = ceil({P}/{world}) = {shard}"
    assert sum(held) >= 2 * P, f"the ranks together keep state for {sum(held) // 2} of the " \
        f"{P} parameters ({held} numbers per rank): some parameters are never updated"


ZERO1 = Exercise(
    id="35.12", processes=True, title="ZeRO stage 1: the optimizer state in shards", kind="implement",
    filename="ex_35_12_zero1.py",
    docs="docs/zero.md (flat shards, stage 1)",
    starter='''"""Exercise 35.12: ZeRO stage 1 (optimizer state partitioning).

Plain data parallelism keeps the whole optimizer state on every rank: for
AdamW two numbers per parameter (exp_avg, exp_avg_sq). ZeRO-1 lays the P
parameters end to end in one flat vector, pads it to a multiple of N and cuts
it into N shards of S = ceil(P/N); rank r owns flat[r*S:(r+1)*S] and keeps
optimizer state for those S numbers only. One step (after loss.backward(),
each rank's p.grad is the gradient of ITS slice of the batch):

    reduce_scatter(flat gradients) -> my shard of the summed gradient; / N (a mean)
    optimizer.step() on my shard (a Tensor of S numbers; its .grad is that mean)
    all_gather(every rank's updated shard) -> the flat weights; copy into each p.data

First, at construction, broadcast every parameter from rank 0 (the ranks may
have initialised their models differently). SGD, Adam and AdamW update each
number from its own gradient and state, so updating a flat shard is the same
arithmetic as updating the parameters one by one.

Interface: minidist.comm.broadcast(array, src), reduce_scatter_tensor(out, inp)
(sum), all_gather_into_tensor(out, inp), get_rank(), get_world_size();
Tensor(array, requires_grad=True) from minidist.autograd; arrays from
minidist.backend.xp. Keep the optimizer as self.optimizer: the check counts
the numbers in its state. Check: `minidist exercise check 35.12`.
"""
import minidist.comm as comm
from minidist.autograd import Tensor
from minidist.backend import xp


class Zero1:
    def __init__(self, module, optimizer_class, **optimizer_kwargs):
        """optimizer_class(params, **optimizer_kwargs): e.g. AdamW, lr=0.01."""
        self.module = module
        raise NotImplementedError

    def step(self):
        raise NotImplementedError
''',
    properties=[
        Property("k steps give the weights of one process on the whole batch",
                 _trains_like_one_process, train_cases, examples=8,
                 hint="docs/zero.md: broadcast first; the reduce-scatter sums, the mean divides "
                      "by N; and is every parameter in some rank's shard?"),
        Property("each rank keeps optimizer state for ceil(P/N) parameters", _state_is_sharded,
                 dict(world=st.integers(2, 4)), examples=3,
                 hint="docs/zero.md, flat shards: build the optimizer on this rank's shard, "
                      "not on the model's parameters"),
    ],
    solution='''from minidist.parallel.zero import Zero1
''',
    wrong={
        "every rank keeps the whole optimizer state": '''import minidist.comm as comm


class Zero1:
    def __init__(self, module, optimizer_class, **optimizer_kwargs):
        self.params = list(module.parameters())
        for p in self.params:
            comm.broadcast(p.data, src=0)
        self.optimizer = optimizer_class(self.params, **optimizer_kwargs)

    def step(self):
        for p in self.params:
            comm.all_reduce(p.grad)
            p.grad /= comm.get_world_size()
        self.optimizer.step()
''',
        "sum, not mean": '''from minidist.parallel.zero import Zero1 as _Zero1


class Zero1(_Zero1):
    def _reduce_gradients(self):
        super()._reduce_gradients()
        for shard in self.shards:
            shard.grad *= self.world_size
''',
        "no broadcast at construction": '''import minidist.parallel.zero.zero12 as zero12


class Zero1(zero12.Zero1):
    def __init__(self, module, *args, **kwargs):
        saved = zero12.broadcast_parameters
        zero12.broadcast_parameters = lambda module, group=None: None
        try:
            super().__init__(module, *args, **kwargs)
        finally:
            zero12.broadcast_parameters = saved
''',
    })

EXERCISES = [ZERO1]
