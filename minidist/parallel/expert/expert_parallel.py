"""Expert parallelism: the E experts of each MoE layer spread over the ep ranks of a group.

Rank e of an expert-parallel group of size ep holds experts e*E/ep .. (e+1)*E/ep - 1
and a copy of everything else (attention, router, embeddings). Each rank routes its
own tokens, then (Lepikhin et al., 2020, "GShard", section 3.2; Fedus et al., 2021):

    1. counts    all-to-all of how many rows go to each expert (E/ep numbers per rank)
    2. dispatch  all-to-all of the rows, sorted by expert, to the ranks of their experts
    3. compute   each local expert on the rows it received (from every rank, in rank order)
    4. combine   all-to-all back (splits transposed), weight by the gates, add at the tokens

and backward runs the two all-to-alls of rows in reverse (dispatch.py). Bytes per rank
and layer, forward: 2 * k * tokens * C * itemsize * (ep-1)/ep if the load is even
(dispatch and combine; the same again in backward; minidist calc moe).

dp x ep (``ExpertMesh``): ep-sized groups of consecutive ranks, dp of them. A dense
parameter is on every rank, so its gradient is averaged over all N = dp * ep ranks,
as in data parallelism. Expert i's gradient on rank (d, e) already sums what the
tokens of the ep ranks of its group contributed (the all-to-all brought them
there); the dp copies of expert i sum theirs and divide by N:

    dense:   g = (1/N) sum over all ranks of g_r
    expert:  g = (1/N) sum over the dp ranks holding it of g_r

``overlap=True``: the dispatch all-to-all runs in the background while the shared
experts compute on the rank's tokens (``all_to_all_single(..., async_op=True)``); the
same bytes land in the same places and the same sums are taken, so the output is the
plain one bit for bit. Without shared experts there is nothing to hide it behind.
In a trace (docs/tracing.md) a span ``MoE dispatch unit k`` (cat "moe", k the block's
index) covers each dispatch, from its start to the rows in hand (the shared experts
inside it when overlapped): the exposed communication in it is what the layer still
waited for its rows (``minidist trace summary``'s cut by unit wait).

Equal to one process training the same model on the same global batch with capacity
groups of one rank's tokens (``GPTConfig.moe_groups = N``): under the default
``global_batch`` balancing the loss uses expert counts summed over all N ranks (one
all-reduce of E + 1 numbers per layer, distributed/_shared_tokens.py).
Docs: docs/moe.md. Demo: demos/15_moe.py. Tests: tests/parallel/expert/.
"""
from __future__ import annotations

from typing import Any

import time

import minidist.distributed as dist
from minidist.autograd.tensor import Tensor
from minidist.backend import xp
from minidist.distributed._shared_tokens import share_tokens
from minidist.distributed.tensor._piece_norm import note_piece_over
from minidist.nn.module import Module
from minidist.nn.moe import Experts, MoE, dispatch_order, index_add, run_experts
from minidist.nn.router import expert_counts
from minidist.parallel.expert.dispatch import (all_to_all, all_to_all_start, all_to_all_wait,
                                               exchange_counts, host_ints)
from minidist.trace import recorder as trace

_SETTINGS = ("n_expert", "top_k", "capacity_factor", "normalize", "aux_coef", "z_coef",
             "bias_rate", "balance", "step_counts", "token_share")


class ExpertMesh:
    """The world as dp x ep: rank = d * ep + e. ``ep_group``: the ep consecutive ranks
    that share tokens; ``dp_group``: the dp ranks that hold the same experts."""

    def __init__(self, ep: int, dp: int = 1):
        world = dist.get_world_size()
        if dp * ep != world:
            raise ValueError(f"dp x ep = {dp} x {ep} = {dp * ep} ranks, but the world has "
                             f"{world}")
        self.dp, self.ep, self.world = dp, ep, world
        rank = dist.get_rank()
        self.dp_rank, self.ep_rank = divmod(rank, ep)
        for d in range(dp):  # every rank creates every group, in the same order
            g = dist.new_group([d * ep + e for e in range(ep)])
            if d == self.dp_rank:
                self.ep_group = g
        for e in range(ep):
            g = dist.new_group([d * ep + e for d in range(dp)])
            if e == self.ep_rank:
                self.dp_group = g
        self.world_group = dist.new_group(list(range(world)))

    @classmethod
    def of_groups(cls, ep_group: Any, dp_group: Any, world_group: Any) -> "ExpertMesh":
        """The same roles from groups a larger mesh already made (parallel/compose/parallelize.py:
        ``ep`` borrowed from dp_shard x cp, the expert replicas, the ranks of the batch)."""
        mesh = cls.__new__(cls)
        mesh.ep, mesh.dp = dist.get_world_size(ep_group), dist.get_world_size(dp_group)
        mesh.world = dist.get_world_size(world_group)
        mesh.ep_rank, mesh.dp_rank = dist.get_rank(ep_group), dist.get_rank(dp_group)
        mesh.ep_group, mesh.dp_group, mesh.world_group = ep_group, dp_group, world_group
        return mesh


class ExpertParallelMoE(MoE):
    """An ``MoE`` whose experts live on the ranks of ``mesh.ep_group`` (module docstring).

    Built from the one-process layer: shares its router, keeps only this rank's experts
    (named by their global index, so state dicts line up with the one-process model).
    """

    def __init__(self, moe: MoE, mesh: ExpertMesh, overlap: bool = False, layer: int = -1):
        Module.__init__(self)
        self.overlap = overlap       # dispatch in the background, the shared experts meanwhile
        self.layer = layer           # the block's index: the trace's "MoE dispatch unit k"
        E, ep = moe.n_expert, mesh.ep
        if E % ep:
            raise ValueError(f"{E} experts do not split over an expert-parallel group of "
                             f"{ep} ranks: choose n_expert divisible by ep")
        self.router, self.shared = moe.router, moe.shared   # shared experts: on every rank
        for name in _SETTINGS:
            setattr(self, name, getattr(moe, name))
        self.register_buffer("expert_bias", moe.expert_bias)   # on every rank of the group
        per = E // ep
        mine = range(mesh.ep_rank * per, (mesh.ep_rank + 1) * per)
        self.experts = Experts({i: moe.experts[i] for i in mine})
        for p in self.experts.parameters():   # whole tensors spread over the group: the
            note_piece_over(p, [mesh.ep_group], ("experts", id(mesh)),   # model's norm adds
                            whole_tensors=True)  # the others', a trust ratio or amax not
        self.mesh, self.groups = mesh, 1   # capacity: this rank's tokens are one group
        self.aux_loss, self.last = None, None
        share_tokens(self, mesh.world_group, "batch")   # every rank routes its own tokens

    def forward(self, x: Tensor) -> Tensor:
        shape, group, ep = x.shape, self.mesh.ep_group, self.mesh.ep
        x_flat = x.reshape(-1, shape[-1])                            # (S, C)
        routing = self.route(x_flat, groups=1)
        tokens, flat, experts = dispatch_order(routing.experts, routing.kept)
        rows = x_flat[tokens]                                        # (A, C) sorted by expert
        per_expert = expert_counts(experts, self.n_expert)
        incoming = host_ints(exchange_counts(per_expert.astype("int64"), group))
        per = self.n_expert // ep
        got = [incoming[i * per:(i + 1) * per] for i in range(ep)]   # got[src][local expert]
        sent = host_ints(per_expert)
        send_splits = [sum(sent[j * per:(j + 1) * per]) for j in range(ep)]
        recv_splits = [sum(row) for row in got]
        shared, start = None, time.perf_counter()
        if self.overlap and self.shared is not None:      # the shared experts, while in flight
            pending, flight = all_to_all_start(rows, send_splits, recv_splits, group)
            shared = self.shared(x)                                  # (B, T, C)
            received = all_to_all_wait(pending, flight)              # (R, C) by source
        else:
            received = all_to_all(rows, send_splits, recv_splits, group)  # (R, C) by source
        if trace.active is not None:   # how long this layer waited for its rows (docstring)
            trace.active.span(f"MoE dispatch unit {self.layer}", "moe", start,
                              time.perf_counter(), dict(overlapped=shared is not None))
        order = expert_major(got)                                    # by expert, then source
        y = run_experts(self.experts, received[order],
                        [sum(got[i][e] for i in range(ep)) for e in range(per)])
        back = y[xp.argsort(order)]                                  # by source again
        returned = all_to_all(back, recv_splits, send_splits, group)  # (A, C) as sent
        gates = routing.gates.reshape(-1)[flat]                      # (A,)
        out = index_add(returned * gates.reshape(-1, 1), tokens, x_flat.shape[0])
        if shared is not None:
            return out.reshape(shape) + shared
        return self.add_shared(out.reshape(shape), x)


def expert_major(got: list[list[int]]) -> Any:
    """Received rows come in blocks by source rank, each sorted by local expert:
    the permutation that sorts them by expert, then source (a device index array)."""
    ep, per = len(got), len(got[0]) if got else 0
    start, starts = 0, []
    for i in range(ep):
        row = []
        for e in range(per):
            row.append(start)
            start += got[i][e]
        starts.append(row)
    order = []
    for e in range(per):
        for i in range(ep):
            order.extend(range(starts[i][e], starts[i][e] + got[i][e]))
    return xp.asarray(order, dtype="int64")


def expert_parallel(model: Module, mesh: ExpertMesh, overlap: bool = False) -> Module:
    """Make every ``MoE`` block of ``model`` (a GPT) expert-parallel over ``mesh``, in place
    (``overlap``: each dispatch hidden behind the shared experts, ``ExpertParallelMoE``)."""
    for layer, block in enumerate(model.blocks):
        if isinstance(block.mlp, MoE) and not isinstance(block.mlp, ExpertParallelMoE):
            block.mlp = ExpertParallelMoE(block.mlp, mesh, overlap, layer)
    return model


def _is_expert(model: Module) -> set[int]:
    return {id(p) for m in model.modules() if isinstance(m, ExpertParallelMoE)
            for p in m.experts.parameters()}


def sync_expert_parallel_gradients(model: Module, mesh: ExpertMesh) -> None:
    """Average the gradients as the module docstring says: dense over all ranks, each
    expert's over the dp ranks that hold it (both divided by N). One all-reduce each
    (``mean_gradients``)."""
    experts = _is_expert(model)
    params = [p for p in model.parameters() if p.requires_grad]
    mean_gradients([p for p in params if id(p) not in experts], mesh.world_group, mesh.world)
    mean_gradients([p for p in params if id(p) in experts], mesh.dp_group, mesh.world)


def mean_gradients(params: list, group: Any, n: int) -> None:
    """p.grad = (sum over ``group`` of p.grad) / n, in one all-reduce, as one process
    treats a parameter no token reached on some rank:

        grad on some ranks    the others add zeros (exact: they had no term for it)
        grad on no rank       no grad (None), so the optimizer skips it as one process
                              does (a zero would let AdamW's momentum and decay move it)

    Each rank appends a 1 per parameter it holds a gradient of, 0 otherwise; the sum
    says on how many ranks each had one. An expert with no row still runs, so it has a
    zero gradient (nn/moe.py ``run_experts``); this is for a parameter the forward left
    out of the graph (torch leaves its grad None too)."""
    if not params:
        return
    grads = [p.grad if p.grad is not None else xp.zeros(p.shape, p.dtype) for p in params]
    flat = xp.concatenate([g.reshape(-1) for g in grads]
                          + [xp.asarray([float(p.grad is not None) for p in params],
                                        dtype=grads[0].dtype)])
    dist.all_reduce(flat, group=group)
    held = host_ints(flat[-len(params):])             # on how many ranks each had a grad
    flat /= n
    start = 0
    for p, ranks in zip(params, held):
        p.grad = flat[start:start + p.data.size].reshape(p.shape) if ranks else None
        start += p.data.size
