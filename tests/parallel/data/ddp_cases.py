"""Training runs shared by the data-parallel tests: one rank's side and the oracle.

A case is a plain dict; ``train_on_rank(case)`` runs it on every rank of a world
(strategy: naive, ddp, zero1, zero2, zero3) and ``train_single(case)`` runs the
same steps in one process on the concatenated batch. Each rank draws the whole
data set from the seed and takes its slice, so only the case dict travels.

The model is a 3-layer tanh MLP; ranks other than 0 start from *different*
weights, so the tests also check that the wrappers broadcast rank 0's. The loss
of a rank is the mean squared error over its B samples divided by the number of
micro-batches, so that the averaged gradient is the gradient of the mean over
the N * B * micro-batches samples of the step.
"""
from __future__ import annotations

import contextlib

import numpy as np

import minidist.distributed as dist
from minidist import backend
from minidist.autograd import Tensor
from minidist.nn import Linear, Module
from minidist.optim import SGD, AdamW, clip_grad_norm_
from minidist.parallel import DataParallelNaive, DistributedDataParallel, Zero1, Zero2, Zero3


class TinyNet(Module):
    def __init__(self, d_in, hidden, d_out, dtype, seed):
        super().__init__()
        gen = backend.Generator(seed)
        self.fc1 = Linear(d_in, hidden, dtype=dtype, generator=gen)
        self.fc2 = Linear(hidden, hidden, dtype=dtype, generator=gen)
        self.fc3 = Linear(hidden, d_out, dtype=dtype, generator=gen)

    def forward(self, x):
        return self.fc3(self.fc2(self.fc1(x).tanh()).tanh())


def data(case):
    """(steps, micro, N*B, d) inputs and targets, from the seed (host arrays)."""
    rng = np.random.default_rng(case["seed"])
    shape = (case["steps"], case["micro"], case["world"] * case["batch"])
    x = rng.standard_normal(shape + (case["d_in"],)).astype(case["dtype"])
    y = rng.standard_normal(shape + (case["d_out"],)).astype(case["dtype"])
    return x, y


def make_model(case, rank):
    return TinyNet(case["d_in"], case["hidden"], case["d_out"], case["dtype"],
                   case["seed"] + 1000 * rank)


def optimizer_spec(case):
    if case["optimizer"] == "sgd":
        return SGD, dict(lr=0.1, momentum=0.9, weight_decay=0.01)
    # amsgrad keeps a running max of v: elementwise, so a ZeRO shard holds its own part
    return AdamW, dict(lr=0.01, weight_decay=0.1, amsgrad=case["optimizer"] == "amsgrad")


def mse(out, y, micro):
    diff = out - Tensor(backend.from_host(y))
    return (diff * diff).mean() / micro


def train_single(case):
    """The oracle: one process, the whole global batch of each step at once."""
    model = make_model(case, 0)
    cls, kw = optimizer_spec(case)
    opt = cls(model.parameters(), **kw)
    x, y = data(case)
    for s in range(case["steps"]):
        xs = x[s].reshape(-1, case["d_in"])
        ys = y[s].reshape(-1, case["d_out"])
        mse(model(Tensor(backend.from_host(xs))), ys, 1).backward()
        if case.get("clip"):
            clip_grad_norm_(model.parameters(), case["clip"])
        opt.step()
        opt.zero_grad()
    return {n: backend.to_host(p.data).copy() for n, p in model.named_parameters()}


def train_on_rank(case):
    """One rank of a data-parallel run; returns final parameters and collective counts."""
    rank, n = dist.get_rank(), dist.get_world_size()
    model = make_model(case, rank)
    strategy = case["strategy"]
    cls, kw = optimizer_spec(case)
    cap = case.get("bucket_cap_mb", 25.0)
    if strategy == "naive":
        wrapped = DataParallelNaive(model)
    elif strategy == "ddp":
        wrapped = DistributedDataParallel(model, bucket_cap_mb=cap,
                                          overlap=case.get("overlap", True),
                                          gradient_as_bucket_view=case.get("grad_view", True))
        if case.get("topk_density") is not None:       # the Top-K hook (topk.py)
            from minidist.parallel.data.topk import TopKState, topk_hook
            wrapped.register_comm_hook(TopKState(None, density=case["topk_density"]),
                                       topk_hook)
    elif strategy in ("zero1", "zero2"):
        zcls = Zero1 if strategy == "zero1" else Zero2
        wrapped = zcls(model, cls, bucket_cap_mb=cap, max_grad_norm=case.get("clip"), **kw)
    else:
        wrapped = Zero3(model, cls, prefetch=case.get("prefetch", False),
                        max_grad_norm=case.get("clip"), **kw)
    opt = cls(model.parameters(), **kw) if strategy in ("naive", "ddp") else None
    x, y = data(case)
    b = case["batch"]
    calls_before = _calls()
    for s in range(case["steps"]):
        for j in range(case["micro"]):
            last = j == case["micro"] - 1
            quiet = wrapped.no_sync() if strategy == "ddp" and not last else contextlib.nullcontext()
            with quiet:
                xs = x[s, j, rank * b:(rank + 1) * b]
                out = wrapped(Tensor(backend.from_host(xs)))
                mse(out, y[s, j, rank * b:(rank + 1) * b], case["micro"]).backward()
        if opt is None:
            wrapped.step()
            wrapped.zero_grad()
            continue
        if strategy == "naive":
            wrapped.sync_gradients()
        if case.get("clip"):
            clip_grad_norm_(model.parameters(), case["clip"])
        opt.step()
        opt.zero_grad()
    calls = {k: v - calls_before.get(k, 0) for k, v in _calls().items()}
    if strategy == "zero3":
        params = {k: backend.to_host(v).copy() for k, v in wrapped.full_state_dict().items()}
    else:
        params = {k: backend.to_host(p.data).copy() for k, p in model.named_parameters()}
    return dict(params=params, calls=calls, world=n,
                buckets=len(getattr(wrapped, "buckets", [])))


def _calls():
    return {k: v["calls"] for k, v in dist.get_stats().per_collective.items()}


def max_diff(a, b):
    return max(float(np.max(np.abs(a[k] - b[k]))) for k in b)


def hook_of(case):
    """(state, hook) of the case's communication hook: "topk" or "powersgd"."""
    if case["hook"] == "topk":
        from minidist.parallel.data.topk import TopKState, topk_hook
        return TopKState(None, density=case["density"]), topk_hook
    from minidist.parallel.data.powersgd import PowerSGDState, powerSGD_hook
    return PowerSGDState(None, **case["powersgd"]), powerSGD_hook


def _ddp_with_hook(case, rank, state=None):
    """A fresh model under DDP with the case's hook (a fresh state, or ``state``), and
    its AdamW."""
    model = make_model(case, rank)
    ddp = DistributedDataParallel(model, bucket_cap_mb=case["bucket_cap_mb"])
    fresh, hook = hook_of(case)
    state = fresh if state is None else state
    ddp.register_comm_hook(state, hook)
    cls, kw = optimizer_spec(case)
    return model, ddp, state, cls(model.parameters(), **kw)


def _saved_and_loaded(saved, via, path):
    """``saved`` after the trip a resumed run's state makes: a file of this rank
    (minidist's checkpoint), the healing buffer (packed, unpacked as heal.py does), or
    pickle (torch's PowerSGDState surface: the process group left out)."""
    if via == "checkpoint":
        from minidist.checkpoint import load_file, save_file
        save_file(path, saved)
        return load_file(path)
    if via == "healing":
        from minidist.parallel.fault_tolerance.pack import pack_state, unpack_state
        return unpack_state(*pack_state(saved), copy=False)
    import pickle
    return pickle.loads(pickle.dumps(saved))


def train_with_hook_on_rank(case, resume_at=None, via="checkpoint", path=None,
                            load_hook=True):
    """``case["steps"]`` steps of DDP with the case's hook. With ``resume_at`` = k: k
    steps, then the model's, optimizer's and hook state's state dicts (the hook state
    itself, under pickle) make their trip (``_saved_and_loaded``, to ``path`` + this
    rank), everything is built afresh and loads them (the hook's only if
    ``load_hook``), and the other steps follow. Returns the final parameters."""
    rank = dist.get_rank()
    model, ddp, state, opt = _ddp_with_hook(case, rank)
    x, y = data(case)
    b = case["batch"]
    for s in range(case["steps"]):
        if s == resume_at:
            hook_saved = state if via == "pickle" else state.state_dict()
            saved = _saved_and_loaded(dict(model=dict(model.state_dict()),
                                           optimizer=opt.state_dict(), hook=hook_saved),
                                      via, f"{path}-rank{rank}.npz")
            unpickled = saved["hook"] if load_hook and via == "pickle" else None
            assert unpickled is None or unpickled.process_group is None
            model, ddp, state, opt = _ddp_with_hook(case, rank, unpickled)
            model.load_state_dict(saved["model"])
            opt.load_state_dict(saved["optimizer"])
            if load_hook and via != "pickle":
                state.load_state_dict(saved["hook"])
        out = ddp(Tensor(backend.from_host(x[s, 0, rank * b:(rank + 1) * b])))
        mse(out, y[s, 0, rank * b:(rank + 1) * b], 1).backward()
        opt.step()
        opt.zero_grad()
    return {n: backend.to_host(p.data).copy() for n, p in model.named_parameters()}


def assert_resumed_run_takes_the_uninterrupted_runs_steps(world, case, resume_at, via, path):
    """On every rank: resumed at ``resume_at`` with the hook's state, the parameters equal
    the uninterrupted run's bit for bit; resumed without it, they do not (so the state
    carried something)."""
    whole = world.run(train_with_hook_on_rank, case)
    resumed = world.run(train_with_hook_on_rank, case, resume_at, via, path)
    forgot = world.run(train_with_hook_on_rank, case, resume_at, via, path, False)
    for w, r, f in zip(whole, resumed, forgot):
        for name in w:
            np.testing.assert_array_equal(r[name], w[name], err_msg=name)
        assert any(not np.array_equal(f[name], w[name]) for name in w)
