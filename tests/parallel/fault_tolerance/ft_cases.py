"""Fault-tolerant runs shared by the tests: one rank's side, and the one-process oracle.

A case is a plain dict: replicas, parts (ranks per replica: 1, or a pair over
"dp_shard"), pair ("ddp": each rank a whole model, the pair's gradients all-reduced;
"fsdp": fully_shard over the pair, each rank a dim-0 piece of every parameter, the
Manager all-reducing the pieces over "dp_replicate" as HSDP's dim 0), num_replicas (the
rest are spares), seed, steps, and the kills: a list of
(replica, part, step, phase) with phase "forward", "backward" (in a gradient hook,
mid-backward), "allreduce" (between two parameters' all-reduces of the quorum) or
"heal" (a spare, once it has received the state it joins with at that step).

``train_on_rank`` runs the loop of docs/fault_tolerance.md and returns, per loop
iteration, the parameters after it ("lost": the ReplicaLostError's message once its
replica is gone), and the
state it healed to. ``simulate`` is the oracle: one process, one model, taking at each
iteration the mean gradient over the replicas in the quorum at that iteration, and
skipping the iterations in which a member died. Under "fsdp" a rank's parameters are
its pieces: ``piece_of`` cuts the oracle's whole ones the same way (torch.chunk's).
"""
from __future__ import annotations

import math
import os
import signal

import numpy as np

from minidist import backend
from minidist.comm import all_reduce
from minidist.comm.errors import CommTimeoutError, PeerDiedError
from minidist.optim import AdamW

from parallel.diloco.diloco_cases import Net, batch, loss_backward


def case_of(**kw):
    case = dict(replicas=3, parts=1, pair="ddp", num_replicas=None, seed=0, steps=5, kills=[],
                d_in=3, hidden=4, d_out=2, batch=2, lr=0.05, min_replica_size=1)
    case.update(kw)
    return case


def snapshot(model, optimizer=None):
    out = {name: backend.to_host(p.data).copy() for name, p in model.named_parameters()}
    out.update({name: backend.to_host(b).copy() for name, b in model.named_buffers()})
    if optimizer is not None:
        for i, buffers in optimizer.state_dict()["state"].items():
            for key, value in buffers.items():
                out[f"optim.{i}.{key}"] = np.array(backend.to_host(value) if
                                                   backend.is_array(value) else value)
    return out


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _kill_phase(case, replica, part, step):
    for r, p, s, phase in case["kills"]:
        if (r, p, s) == (replica, part, step):
            return phase
    return None


def _mesh_and_place(case):
    """(mesh, replicate dim, this rank's replica, its part, the pair's group)."""
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.comm.group import world_group
    rank = world_group().rank
    if case["parts"] == 1:
        return None, None, rank, 0, None
    mesh = init_device_mesh(backend.device_type(), (case["replicas"], case["parts"]),
                            mesh_dim_names=("dp_replicate", "dp_shard"))
    return mesh, "dp_replicate", rank // case["parts"], rank % case["parts"], \
        mesh.get_group("dp_shard")


def _fully_shard_over_the_pair(model, mesh) -> None:
    """Each layer a fully_shard unit over the replica's ranks (mesh["dp_shard"], 1-D):
    its parameters become this rank's dim-0 pieces, its gradients their pieces of the
    pair's mean (a reduce-scatter), which the Manager then averages over the quorum."""
    from minidist.distributed.fsdp import fully_shard
    pair_mesh = mesh["dp_shard"]
    for layer in (model.fc1, model.fc2, model.fc3):
        fully_shard(layer, mesh=pair_mesh)
    fully_shard(model, mesh=pair_mesh)


def piece_of(array, part: int, parts: int):
    """Rank ``part``'s dim-0 piece of ``array`` among ``parts`` (torch.chunk's)."""
    rows = math.ceil(array.shape[0] / parts)
    return array[part * rows:(part + 1) * rows]


def train_on_rank(case):
    from minidist.parallel.fault_tolerance import (Manager, OptimizerWrapper,
                                                   ReplicaLostError)
    mesh, dim, replica, part, pair = _mesh_and_place(case)
    model = Net(case["d_in"], case["hidden"], case["d_out"], case["seed"] + replica)
    # a persistent buffer no step moves, its replica's own until healed: state_dict()
    # carries it, so a healed spare holds its source's
    model.register_buffer("tag", backend.xp.full((2,), float(replica)))
    fsdp = case["parts"] > 1 and case["pair"] == "fsdp"
    if fsdp:
        _fully_shard_over_the_pair(model, mesh)
    inner = AdamW(model.parameters(), lr=case["lr"], weight_decay=0.01)
    cursor = {"next": 0}        # the sampler's state: the next batch to read
    rng = backend.Generator(1000 + replica)     # a replica's own stream (dropout, say)

    def state_dict():
        return {"model": model.state_dict(), "optim": inner.state_dict(), "cursor": cursor,
                "rng": rng.get_state()}

    def load_state_dict(state):
        if _kill_phase(case, replica, part, state["cursor"]["next"]) == "heal":
            _die()                                    # dies while joining, state received
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["optim"])
        cursor.update(state["cursor"])
        rng.set_state(state["rng"])

    manager = Manager(load_state_dict, state_dict, case["min_replica_size"], mesh=mesh,
                      replicate_dim=dim, num_replicas=case["num_replicas"], timeout=20.0)
    optimizer = OptimizerWrapper(manager, inner, model)
    history, healed, failed = {}, None, {}
    piece = (part, case["parts"]) if fsdp else None     # what of each parameter it holds
    while cursor["next"] < case["steps"]:
        try:
            if not optimizer.zero_grad():
                break                                 # a spare never needed
        except ReplicaLostError as e:
            return {"history": history, "healed": healed, "lost": str(e), "failed": failed,
                    "piece": piece}
        if healed is None and manager.changes[-1].healed and replica in manager.changes[-1].healed:
            healed = (cursor["next"], dict(snapshot(model, inner), rng=repr(rng.get_state())))
        step = cursor["next"]
        cursor["next"] += 1
        _one_step(case, model, manager, pair if not fsdp else None, replica, part, step)
        if not optimizer.step():
            failed[step] = type(manager.errored()).__name__
        rng.normal((1,))                              # the stream moves on every step
        history[step] = dict(snapshot(model, inner), rng=repr(rng.get_state()))
    return {"history": history, "healed": healed, "lost": False, "changes": manager.changes,
            "failed": failed, "piece": piece}


def _one_step(case, model, manager, pair, replica, part, step):
    """Forward, backward, the pair's gradient reduction (the DDP pair's all-reduce over
    ``pair``, or fully_shard's reduce-scatter inside backward), the quorum's all-reduce:
    a kill where the case says. A partner's death fails this rank's forward or
    backward (PeerDiedError from the pair's collective): the step fails."""
    phase = _kill_phase(case, replica, part, step)
    params = list(model.parameters())
    if phase == "forward":
        _die()
    if phase == "backward":
        params[-1].register_post_accumulate_grad_hook(lambda p: _die())
    x, y = batch(case, step, replica, case["parts"], part)
    try:
        if case["pair"] == "fsdp" and case["parts"] > 1:
            loss_backward(model, x, y)        # its rows' mean; the reduce-scatter averages
        else:
            loss_backward(model, x, y, case["parts"])
        if pair is not None:                          # the DDP pair inside the replica
            for p in params:
                all_reduce(p.grad, group=pair)
    except (PeerDiedError, CommTimeoutError) as e:
        manager.report_error(e)                       # its partner died: the step fails
        for p in params:                              # the same calls in the quorum
            if p.grad is None:
                p.grad = backend.xp.zeros(p.data.shape, dtype=p.data.dtype)
    for i, p in enumerate(params):
        if phase == "allreduce" and i == 2:
            _die()
        manager.allreduce(p.grad)


def members_at(case, step):
    """The quorum's replicas at loop iteration ``step`` and whether the step fails."""
    dead = {r for r, _, s, _ in case["kills"] if s < step}
    dying = {r for r, _, s, _ in case["kills"] if s == step}
    live = [r for r in range(case["replicas"]) if r not in dead]
    quorum = live[:case["num_replicas"] or case["replicas"]]
    return quorum, bool(dying & set(quorum))


def simulate(case):
    """Parameters after each loop iteration: replica 0's start (init_sync), then per
    iteration the mean gradient over the quorum's replicas, none where a member died."""
    model = Net(case["d_in"], case["hidden"], case["d_out"], case["seed"])
    optimizer = AdamW(model.parameters(), lr=case["lr"], weight_decay=0.01)
    out = []
    for step in range(case["steps"]):
        quorum, fails = members_at(case, step)
        if not fails:
            grads = [np.zeros(p.data.shape) for p in model.parameters()]
            for r in quorum:
                optimizer.zero_grad()
                x, y = batch(case, step, r)
                loss_backward(model, x, y)
                for g, p in zip(grads, model.parameters()):
                    g += backend.to_host(p.grad)
            for g, p in zip(grads, model.parameters()):
                p.grad = backend.from_host(g / len(quorum))
            optimizer.step()
        out.append(snapshot(model))
    return out
