"""DiLoCo runs shared by the tests: one rank's side, and the one-process simulation.

A case is a plain dict (world, seed, steps, H, F, tau, alpha, fmt, inner, outer).
``train_on_rank(case)`` runs DiLoCo on every rank of a world and returns each
step's parameters; ``simulate(case)`` is the oracle: N replicas in one process,
each with its own model and inner optimizer, the schedule, the outer gradient, its
rounding, the mean and the outer SGD step written out here in NumPy (Algorithm 1 of
arXiv 2311.08105, and Streaming DiLoCo's fragments, delay and mixing).

Rank r starts from different weights than rank 0 (seed + r), so the tests also check
that DiLoCo starts every replica from the group's first rank's parameters.
"""
from __future__ import annotations

import math
import os
import signal

import numpy as np

from minidist import backend
from minidist.autograd import Tensor
from minidist.nn import Linear, Module
from minidist.optim import SGD, AdamW, Muon
from minidist.precision import get_format, quantize

LAYERS = ("fc1", "fc2", "fc3")


class Net(Module):
    def __init__(self, d_in, hidden, d_out, seed, bias=True):
        super().__init__()
        gen = backend.Generator(seed)
        self.fc1 = Linear(d_in, hidden, bias=bias, dtype="float64", generator=gen)
        self.fc2 = Linear(hidden, hidden, bias=bias, dtype="float64", generator=gen)
        self.fc3 = Linear(hidden, d_out, bias=bias, dtype="float64", generator=gen)

    def forward(self, x):
        return self.fc3(self.fc2(self.fc1(x).tanh()).tanh())


def case_of(**kw):
    case = dict(world=2, seed=0, steps=6, H=3, F=1, tau=0, alpha=0.0, fmt=None,
                inner="adamw", outer=dict(lr=0.7, momentum=0.9, nesterov=True),
                d_in=3, hidden=4, d_out=2, batch=2, inner_lr=0.05)
    case.update(kw)
    return case


def batch(case, step, replica, parts=1, part=0):
    """Replica ``replica``'s inputs and targets at ``step`` (host arrays); a replica made
    of ``parts`` ranks gives each rank its ``part`` of the rows."""
    rng = np.random.default_rng([case["seed"], step, replica])
    x = rng.standard_normal((case["batch"], case["d_in"]))
    y = rng.standard_normal((case["batch"], case["d_out"]))
    rows = case["batch"] // parts
    return x[part * rows:(part + 1) * rows], y[part * rows:(part + 1) * rows]


def make_model(case, seed_offset=0):
    """The case's Net; without biases under an inner Muon (it takes matrices only); the
    parameters named in ``case["frozen"]`` get requires_grad=False."""
    model = Net(case["d_in"], case["hidden"], case["d_out"], case["seed"] + seed_offset,
                bias=case["inner"] != "muon")
    for name, p in model.named_parameters():
        p.requires_grad = name not in case.get("frozen", ())
    return model


def make_inner(case, params):
    if case["inner"] == "sgd":
        return SGD(params, lr=case["inner_lr"])
    if case["inner"] == "muon":
        return Muon(params, lr=case["inner_lr"])
    return AdamW(params, lr=case["inner_lr"], weight_decay=0.01)


def fragments_of(model, F):
    """The three layers cut into F contiguous fragments."""
    layers = [getattr(model, n) for n in LAYERS]
    cuts = np.array_split(np.arange(len(layers)), F)
    return [[layers[i] for i in cut] for cut in cuts]


def loss_backward(model, x, y, parts=1):
    out = model(Tensor(backend.from_host(x)))
    diff = out - Tensor(backend.from_host(y))
    ((diff * diff).mean() / parts).backward()


def snapshot(model):
    return {n: backend.to_host(p.data).copy() for n, p in model.named_parameters()}


# -- one rank of a world ---------------------------------------------------------

def shard_replica(model, mesh):
    """fully_shard each layer and the root over ``mesh`` (1-D: FSDP, 2-D: HSDP); the
    function that returns the whole parameters (gathered from their pieces)."""
    from minidist.distributed.fsdp import fully_shard, sharded_state_dict
    for name in LAYERS:
        fully_shard(getattr(model, name), mesh=mesh)
    fully_shard(model, mesh=mesh)
    return lambda m: {n: backend.to_host(d.full_tensor().data).copy()
                      for n, d in sharded_state_dict(m).items()}


def train_on_rank(case, replica_group=None, replica=None, parts=1, part=0, ddp_group=None,
                  fsdp_mesh=None, shard_group=None, count_link=False):
    """DiLoCo on this rank; returns the parameters after every inner step. A replica of
    several ranks is DDP over ``ddp_group`` or fully_shard over ``fsdp_mesh`` (then its
    ranks start alike, and the replicas from different weights); ``shard_group`` is
    DiLoCo's. ``count_link``: also return the bytes this rank put on the slow link
    during the steps (``dist.get_link_bytes().between``)."""
    import minidist.distributed as dist
    from minidist.parallel.data import DistributedDataParallel
    from minidist.parallel.diloco import DiLoCo
    rank = dist.get_rank()
    replica = rank if replica is None else replica
    model = make_model(case, seed_offset=rank if fsdp_mesh is None else replica)
    wrapped = DistributedDataParallel(model, group=ddp_group) if ddp_group is not None else model
    whole = snapshot if fsdp_mesh is None else shard_replica(model, fsdp_mesh)
    inner = make_inner(case, model.parameters())
    outer = SGD(model.parameters(), **case["outer"])
    frags = None if case["F"] == 1 and not case.get("as_fragments") else \
        fragments_of(model, case["F"])
    out = []
    with DiLoCo(model, inner, outer, sync_every=case["H"], group=replica_group,
                fragments=frags, fragment_sync_delay=case["tau"],
                fragment_update_alpha=case["alpha"], outer_grad_format=case["fmt"],
                shard_group=shard_group):
        before = dist.get_link_bytes().between if count_link else 0
        for step in range(case["steps"]):
            x, y = batch(case, step, replica, parts, part)
            loss_backward(wrapped, x, y)
            inner.step()
            inner.zero_grad()
            out.append(whole(model))
    if count_link:
        return out, dist.get_link_bytes().between - before
    return out


# -- the oracle -------------------------------------------------------------------

def round_outer(delta, fmt):
    """Delta rounded under one power-of-two scale: s = 2^ceil(log2(max|Delta| / max))."""
    if fmt is None:
        return delta
    fmt = get_format(fmt)
    amax = np.max(np.abs(delta))
    k = 0 if amax == 0 else int(math.ceil(math.log2(amax / fmt.max)))
    scaled = backend.from_host(delta * 2.0 ** -k)
    return backend.to_host(quantize(scaled, fmt, saturate=True)) * 2.0 ** k


def nesterov_sgd(theta, delta, buf, lr, momentum=0.0, nesterov=False, weight_decay=0.0):
    """torch.optim.SGD's step on theta with gradient delta (no dampening)."""
    delta = delta + weight_decay * theta if weight_decay else delta
    if momentum:
        buf = delta.copy() if buf is None else momentum * buf + delta
        delta = delta + momentum * buf if nesterov else buf
    return theta - lr * delta, buf


def simulate(case, alive=None):
    """Every replica's parameters after every inner step: {step: [params of replica i]}.
    ``alive(i, t)``: whether replica i's outer gradient is in the mean of the
    synchronisation after inner step t (default: every replica's)."""
    N, H, F, tau, alpha = case["world"], case["H"], case["F"], case["tau"], case["alpha"]
    models = [make_model(case) for _ in range(N)]
    inners = [make_inner(case, m.parameters()) for m in models]
    names = [n for n, _ in models[0].named_parameters()]
    # a frozen parameter is in no fragment: no outer gradient, no outer step
    frag_names = [[n for n in names if n.split(".")[0] in [LAYERS[i] for i in cut]
                   and n not in case.get("frozen", ())]
                  for cut in np.array_split(np.arange(len(LAYERS)), F)]
    theta_global = snapshot(models[0])
    buffers = {n: None for n in names}
    in_flight = {}                                   # fragment -> (merge step, mean Delta)
    history = []
    for step in range(case["steps"]):
        t = step + 1
        for i, (m, opt) in enumerate(zip(models, inners)):
            loss_backward(m, *batch(case, step, i))
            if (i, step) not in case.get("skipped", ()):    # a step GradScaler skips
                opt.step()
            opt.zero_grad()
        params = [dict(m.named_parameters()) for m in models]
        for f in range(F):
            if t % H == ((f + 1) * H // F) % H:      # fragment f starts
                members = [i for i in range(N) if alive is None or alive(i, t)]
                mean = {n: sum(round_outer(theta_global[n] - backend.to_host(params[i][n].data),
                                           case["fmt"]) for i in members) / len(members)
                        for n in frag_names[f]}
                in_flight[f] = (t + tau, mean)
        for f, (merge_at, mean) in list(in_flight.items()):
            if merge_at != t:
                continue
            for n in frag_names[f]:
                theta_global[n], buffers[n] = nesterov_sgd(theta_global[n], mean[n],
                                                           buffers[n], **case["outer"])
                for i in range(N):
                    local = backend.to_host(params[i][n].data)
                    mixed = alpha * local + (1 - alpha) * theta_global[n]
                    params[i][n].data[...] = backend.from_host(mixed)
            del in_flight[f]
        history.append([snapshot(m) for m in models])
    return history


def sync_steps(case):
    """The inner steps (from 1) after which some fragment is merged."""
    H, F, tau = case["H"], case["F"], case["tau"]
    return [t for t in range(1, case["steps"] + 1)
            if any((t - tau) % H == ((f + 1) * H // F) % H and t - tau >= 1 for f in range(F))]


# -- over a fault-tolerance Manager: a replica killed at a step -------------------

def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _die_in_the_second_ring_step() -> None:
    """From now on this process dies (SIGKILL) in the second send/receive of a ring:
    inside the next all-reduce, after its first step."""
    from minidist.comm.group import ProcessGroup
    sendrecv, calls = ProcessGroup.sendrecv, []

    def dying(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            _die()
        return sendrecv(self, *args, **kwargs)
    ProcessGroup.sendrecv = dying


def train_over_quorum(case):
    """DiLoCo over a Manager on this rank (a replica of one rank), killed where
    ``case["kill"]`` = (replica, step, phase) says: phase "inner" before the forward of
    that step, "outer" inside the outer all-reduce after it. Returns the parameters after
    every step and the quorum's changes as this rank logged them."""
    import minidist.distributed as dist
    from minidist.parallel.diloco import DiLoCo
    from minidist.parallel.fault_tolerance import Manager
    rank = dist.get_rank()
    model = make_model(case, seed_offset=rank)
    inner = make_inner(case, model.parameters())
    outer = SGD(model.parameters(), **case["outer"])

    def state_dict():
        return {"model": model.state_dict(), "inner": inner.state_dict()}

    def load_state_dict(state):
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["inner"])

    manager = Manager(load_state_dict, state_dict, timeout=20.0)
    victim, kill_step, phase = case["kill"]
    out = []
    with DiLoCo(model, inner, outer, sync_every=case["H"], manager=manager,
                fragments=fragments_of(model, case["F"]) if case["F"] > 1 else None):
        for step in range(case["steps"]):
            if (rank, step, phase) == (victim, kill_step, "inner"):
                _die()
            if (rank, step, phase) == (victim, kill_step, "outer"):
                _die_in_the_second_ring_step()
            loss_backward(model, *batch(case, step, rank))
            inner.step()
            inner.zero_grad()
            out.append(snapshot(model))
    return {"history": out, "changes": [str(c) for c in manager.changes],
            "steps": manager.current_step()}
