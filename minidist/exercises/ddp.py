"""35.4 DDP with bucket hooks, and 35.6 gradient accumulation with no_sync.

Both are graded on real processes against one process training on the whole
batch: each of N ranks takes a slice of the global batch, and after backward
every rank's gradients must equal the single-process gradient of the mean
loss. The comm statistics count the all-reduces.
"""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from minidist.exercises.core import Exercise, Property

D, H = 3, 4        # a 2-layer model: Linear(D, H) -> Linear(H, 1), 4 parameters


def _model(seed: int):
    from minidist import backend
    from minidist.nn import Linear, Sequential
    backend.manual_seed(seed)
    return Sequential(Linear(D, H, dtype="float64"), Linear(H, 1, dtype="float64"))


def _batch(seed: int, n: int):
    rng = np.random.default_rng(seed + 7)
    return rng.normal(size=(n, D)), rng.normal(size=(n, 1))


def _loss(model, x, y):
    from minidist.autograd import Tensor
    from minidist.backend import from_host
    diff = model(Tensor(from_host(x))) - Tensor(from_host(y))
    return (diff * diff).sum() * (1.0 / x.shape[0])      # mean squared error


def reference_grads(seed: int, world: int, per_rank: int) -> list[np.ndarray]:
    """One process, the whole batch, rank 0's initial weights."""
    from minidist.backend import to_host
    model = _model(seed)
    x, y = _batch(seed, world * per_rank)
    _loss(model, x, y).backward()
    return [to_host(p.grad) for p in model.parameters()]


def _all_reduce_calls() -> int:
    from minidist.comm.group import get_stats
    return get_stats().per_collective.get("all_reduce", {}).get("calls", 0)


def drive_ddp(module, seed, world, per_rank, cap_bytes):
    """In rank r: wrap a model (initialised differently on every rank), one backward
    on this rank's slice; the gradients and the number of all-reduces it made."""
    from minidist.backend import to_host
    from minidist.comm import get_rank
    r = get_rank()
    model = module.BucketedDDP(_model(seed + r), cap_bytes)
    x, y = _batch(seed, world * per_rank)
    before = _all_reduce_calls()
    _loss(model, x[r * per_rank:(r + 1) * per_rank], y[r * per_rank:(r + 1) * per_rank]).backward()
    grads = [None if p.grad is None else to_host(p.grad) for p in model.module.parameters()]
    return grads, _all_reduce_calls() - before


def _compare(results, want, what):
    for r, (grads, _) in enumerate(results):
        for i, (g, w) in enumerate(zip(grads, want)):
            assert g is not None, f"rank {r}: parameter {i} has no gradient after backward"
            assert np.allclose(g, w, rtol=1e-10, atol=1e-12), \
                f"rank {r}, parameter {i}: gradient {np.round(g, 5).ravel().tolist()}, one " \
                f"process on the whole batch gives {np.round(w, 5).ravel().tolist()} ({what})"


ddp_cases = dict(seed=st.integers(0, 1000), world=st.integers(1, 4), per_rank=st.integers(1, 3),
                 cap_bytes=st.sampled_from([1, 40, 100, 10**9]))


def _ddp_matches_single(s, seed, world, per_rank, cap_bytes):
    results = s.run(world, drive_ddp, seed, world, per_rank, cap_bytes)
    _compare(results, reference_grads(seed, world, per_rank), f"bucket cap {cap_bytes} bytes")


def _ddp_one_all_reduce_per_bucket(s, world, big):
    results = s.run(world, drive_ddp, 0, world, 2, 10**9 if big else 1)
    want = 1 if big else 4
    for r, (_, calls) in enumerate(results):
        assert calls == want, f"rank {r}: {calls} all-reduces in one backward with a bucket cap " \
            f"{'larger than the model' if big else 'smaller than any parameter'}; expected {want}"


DDP = Exercise(
    id="35.4", processes=True, title="DDP from scratch, with gradient buckets", kind="implement",
    filename="ex_35_4_ddp.py",
    docs="docs/ddp.md (buckets, hooks)",
    starter='''"""Exercise 35.4: data parallelism from scratch, with buckets.

Wrap a model so that after loss.backward() every rank's p.grad is the mean of
the N ranks' gradients, g = (1/N) sum_r g_r, with the same bits on every rank:

  1. at construction, broadcast every parameter from rank 0 (the ranks may
     have initialised their models differently);
  2. group the parameters into buckets of about bucket_cap_bytes, in reverse
     order (backward produces the last layer's gradients first);
  3. register p.register_post_accumulate_grad_hook(hook) on every parameter:
     the hook gets p once p.grad is final; copy it into its bucket, and when a
     bucket is full all-reduce it (one all-reduce per bucket: a parameter
     larger than the cap gets a bucket of its own);
  4. when every bucket is reduced, divide by N and set each p.grad.

Interface: minidist.comm.broadcast(array, src), all_reduce(array) (in place,
sum), get_world_size(); a Module's parameters(); arrays from
minidist.backend.xp. Check: `minidist exercise check 35.4`.
"""
import minidist.comm as comm
from minidist.backend import xp
from minidist.nn import Module


class BucketedDDP(Module):
    def __init__(self, module, bucket_cap_bytes):
        super().__init__()
        self.module = module
        raise NotImplementedError

    def forward(self, *args):
        return self.module(*args)
''',
    properties=[
        Property("every rank's gradients equal one process's on the whole batch",
                 _ddp_matches_single, ddp_cases, examples=8,
                 hint="docs/ddp.md: broadcast first; a mean over ranks, not a sum; and is the "
                      "last, not-full bucket ever reduced?"),
        Property("one all-reduce per bucket", _ddp_one_all_reduce_per_bucket,
                 dict(world=st.integers(2, 3), big=st.booleans()), examples=4,
                 hint="docs/ddp.md: a bucket is reduced once, when its last gradient arrives"),
    ],
    solution='''from minidist.parallel.data import DistributedDataParallel


def BucketedDDP(module, bucket_cap_bytes):
    return DistributedDataParallel(module, bucket_cap_mb=bucket_cap_bytes / 1e6)
''',
    wrong={
        "sum, not mean": '''import minidist.comm as comm
from minidist.nn import Module


class BucketedDDP(Module):
    def __init__(self, module, bucket_cap_bytes):
        super().__init__()
        self.module = module
        for p in module.parameters():
            comm.broadcast(p.data, src=0)
        self.params = list(module.parameters())
        self.seen = 0
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._ready)

    def _ready(self, p):
        self.seen += 1
        if self.seen == len(self.params):
            self.seen = 0
            for q in self.params:
                comm.all_reduce(q.grad)

    def forward(self, *args):
        return self.module(*args)
''',
        "no broadcast at construction": '''import minidist.parallel.data.ddp as ddp


def BucketedDDP(module, bucket_cap_bytes):
    saved = ddp.broadcast_parameters
    ddp.broadcast_parameters = lambda module, group=None: None
    try:
        return ddp.DistributedDataParallel(module, bucket_cap_mb=bucket_cap_bytes / 1e6)
    finally:
        ddp.broadcast_parameters = saved
''',
        "one all-reduce per parameter": '''import minidist.comm as comm
from minidist.nn import Module


class BucketedDDP(Module):
    def __init__(self, module, bucket_cap_bytes):
        super().__init__()
        self.module = module
        for p in module.parameters():
            comm.broadcast(p.data, src=0)
        for p in module.parameters():
            p.register_post_accumulate_grad_hook(self._ready)

    def _ready(self, p):
        comm.all_reduce(p.grad)
        p.grad /= comm.get_world_size()

    def forward(self, *args):
        return self.module(*args)
''',
    })


# -- 35.6 gradient accumulation ----------------------------------------------------

def drive_accumulation(module, seed, world, per_rank, k):
    """In rank r: the library's DDP, the learner's accumulation over k micro-batches."""
    from minidist.backend import to_host
    from minidist.comm import get_rank
    from minidist.parallel.data import DistributedDataParallel
    r = get_rank()
    model = DistributedDataParallel(_model(seed + r), bucket_cap_mb=1000.0)
    x, y = _batch(seed, world * per_rank * k)
    mine_x, mine_y = x[r * per_rank * k:(r + 1) * per_rank * k], y[r * per_rank * k:(r + 1) * per_rank * k]
    micro = [(mine_x[i * per_rank:(i + 1) * per_rank], mine_y[i * per_rank:(i + 1) * per_rank])
             for i in range(k)]
    before = _all_reduce_calls()
    module.accumulate(model, micro, _loss)
    grads = [None if p.grad is None else to_host(p.grad) for p in model.module.parameters()]
    return grads, _all_reduce_calls() - before


acc_cases = dict(seed=st.integers(0, 1000), world=st.integers(1, 3), per_rank=st.integers(1, 2),
                 k=st.integers(1, 4))


def _accumulation_matches(s, seed, world, per_rank, k):
    results = s.run(world, drive_accumulation, seed, world, per_rank, k)
    _compare(results, reference_grads(seed, world, per_rank * k), f"{k} micro-batches")


def _accumulation_reduces_once(s, world, k):
    results = s.run(world, drive_accumulation, 1, world, 1, k)
    for r, (_, calls) in enumerate(results):
        assert calls == 1, f"rank {r}: {calls} all-reduces for {k} micro-batches; " \
            "accumulation reduces once per optimizer step"


ACCUMULATION = Exercise(
    id="35.6", processes=True, title="gradient accumulation with no_sync", kind="implement",
    filename="ex_35_6_accumulation.py",
    docs="docs/ddp.md (no_sync, accumulation); workbook chapter 2",
    starter='''"""Exercise 35.6: gradient accumulation under DDP.

Run k micro-batches through a DistributedDataParallel model and leave in
p.grad the gradient of the mean loss over all k micro-batches (and over all
ranks), as if one big batch had gone through at once:

    g = (1/k) sum_i grad(loss_i)      each loss_i a mean over its micro-batch

and communicate once, not k times: backward inside `with model.no_sync():`
only accumulates locally; the first backward outside it all-reduces the sum.

Interface: model.no_sync() (a context manager), loss_fn(model, x, y) -> a
scalar Tensor, loss.backward(), Tensor * float. Check:
`minidist exercise check 35.6`.
"""


def accumulate(model, micro_batches, loss_fn):
    """micro_batches: a list of (x, y); leaves the accumulated mean gradient in p.grad."""
    raise NotImplementedError
''',
    properties=[
        Property("k micro-batches give the gradient of the whole batch", _accumulation_matches,
                 acc_cases, examples=8,
                 hint="workbook chapter 2: each micro-batch loss is a mean; divide by k"),
        Property("one all-reduce per accumulation cycle", _accumulation_reduces_once,
                 dict(world=st.integers(2, 3), k=st.integers(2, 4)), examples=4,
                 hint="docs/ddp.md: every backward but the last inside model.no_sync()"),
    ],
    solution='''import contextlib


def accumulate(model, micro_batches, loss_fn):
    k = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        last = i == k - 1
        with contextlib.nullcontext() if last else model.no_sync():
            (loss_fn(model, x, y) * (1.0 / k)).backward()
''',
    wrong={
        "no division by k": '''import contextlib


def accumulate(model, micro_batches, loss_fn):
    k = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        with contextlib.nullcontext() if i == k - 1 else model.no_sync():
            loss_fn(model, x, y).backward()
''',
        "no_sync on every micro-batch": '''def accumulate(model, micro_batches, loss_fn):
    k = len(micro_batches)
    for x, y in micro_batches:
        with model.no_sync():
            (loss_fn(model, x, y) * (1.0 / k)).backward()
''',
        "syncs every micro-batch": '''def accumulate(model, micro_batches, loss_fn):
    k = len(micro_batches)
    for x, y in micro_batches:
        (loss_fn(model, x, y) * (1.0 / k)).backward()
''',
    })

EXERCISES = [DDP, ACCUMULATION]
