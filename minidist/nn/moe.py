"""Mixture of experts, in one process: a router and E expert MLPs instead of one MLP.

    routing = route(x W_r^T)                         (router.py: top-k, capacity, losses)
    y_t     = sum over kept choices (t, i) of gate_t,i * MLP_i(x_t)

Each token runs through only k of the E experts, so an MoE block holds E MLPs'
parameters but spends k MLPs' compute per token ("total vs active" parameters,
minidist calc moe). The assignments are sorted by expert (stable: token, then slot),
each expert runs once on its rows, and ``index_add`` puts the weighted rows back at
their tokens (its backward gathers them again).

This layer is the oracle of the expert-parallel one (parallel/expert/), which moves
the same rows to the ranks of their experts with two all-to-alls and must give the
same numbers. ``aux_loss`` (alpha * balance + beta * z) of the last forward is
added to the model's loss by the GPT (the Llama adds Mixtral's loss pooled over its
layers instead, router.py ``pooled_balance``); ``last`` keeps what the router
decided, for the demo and the tests. ``run_block`` runs a block that holds an MoE,
under activation checkpointing too, and returns the router's term the loss needs
with its graph. Docs: docs/moe.md. Demo: demos/15_moe.py.

Which tokens the statistics count. One process routes the whole batch; a strategy
that splits the tokens over ranks (data, context and expert parallelism) sets
``token_share`` (distributed/_shared_tokens.py), which sums this rank's counts with
the other ranks' in training:

    balance "global_batch" (default)   f_i over every rank's tokens: equal to one process
            "micro_batch"              f_i over this rank's micro-batch (each sequence
                                       whole, context parallelism summed): Megatron's
                                       ``aux_loss``, transformers' Mixtral

P_i stays this rank's mean, with its graph: averaging the gradients over the ranks
(equal shares of tokens) averages the P_i into the global batch's. The bias counts
of ``update_bias`` add every training forward since the last update (all the
micro-batches of a step: gradient accumulation, a pipeline) and every rank's, in
either mode, so the replicas' ``expert_bias`` stay equal.
"""
from __future__ import annotations

from typing import Any, Callable

from minidist.autograd.activation_checkpoint import checkpoint
from minidist.autograd.selective_checkpoint import policy_of
from minidist.autograd.function import Function
from minidist.autograd.functional import concat
from minidist.autograd.recompute import is_recomputing
from minidist.autograd.tensor import Tensor
from minidist.backend import scatter_add, to_host, xp
from minidist.nn.layers import MLP, Linear
from minidist.nn.module import Module
from minidist.nn.router import BALANCE, Routing, expert_counts, nudge_bias, route


class IndexAdd(Function):
    """out = zeros(n, C); out[index[a]] += rows[a]. Backward: d rows[a] = d out[index[a]]."""

    @staticmethod
    def forward(ctx, rows, index, n):
        ctx.save_for_backward(index)
        out = xp.zeros((n,) + tuple(rows.shape[1:]), dtype=rows.dtype)   # (n, C)
        scatter_add(out, index, rows)
        return out

    @staticmethod
    def backward(ctx, grad):
        (index,) = ctx.saved
        return grad[index], None, None


def index_add(rows: Tensor, index: Any, n: int) -> Tensor:
    """Sum ``rows`` (A, C) into the rows ``index`` (A,) of an (n, C) zero array."""
    return IndexAdd.apply(rows, index, n)


class Experts(Module):
    """The expert MLPs, registered under their global index ("experts.3.c_fc.weight"), so
    a rank that holds only some of them names each as the one-process model does."""

    def __init__(self, experts: dict[int, Module]):
        super().__init__()
        self.indices = sorted(experts)
        for i in self.indices:
            setattr(self, str(i), experts[i])

    def __getitem__(self, i: int) -> Module:
        return getattr(self, str(i))

    def __len__(self) -> int:
        return len(self.indices)


def dispatch_order(experts: Any, kept: Any) -> tuple[Any, Any, Any]:
    """The kept assignments sorted by expert (stable: token, then slot).

    Returns (tokens, flat positions into the (S, k) choices, experts), each (A,)."""
    k = experts.shape[1]
    flat = xp.nonzero(kept.reshape(-1))[0]                          # kept (t, slot), t-major
    order = xp.argsort(experts.reshape(-1)[flat], kind="stable")
    flat = flat[order]
    return flat // k, flat, experts.reshape(-1)[flat]


def rows_per_expert(experts: Any, indices: list[int]) -> list[int]:
    """How many of the sorted rows go to each expert of ``indices`` (host ints)."""
    return [int(c) for c in to_host(expert_counts(experts, indices)).tolist()]


def run_experts(experts: Experts, rows: Tensor, sizes: list[int]) -> Tensor:
    """Each expert of ``experts`` on its block of ``rows`` (blocks in index order,
    ``sizes`` rows each); an expert with no row still runs, on zero rows, so its
    gradient is zero rather than missing, on every rank alike."""
    outs, start = [], 0
    for i, n_i in zip(experts.indices, sizes):
        outs.append(experts[i](rows[start:start + n_i]))            # (n_i, C)
        start += n_i
    return concat(outs, axis=0)                                      # (A, C)


class MoE(Module):
    """Top-k mixture of ``n_expert`` MLPs of width ``hidden`` (router.py for the options).

    ``expert``: a function that makes one expert (default: the GPT's GELU MLP; a Llama
    passes a SwiGLU, as Mixtral's experts are). ``shared``: an MLP every token also runs
    through, added to the routed output (DeepSeek's shared experts: y = shared(x) +
    sum of the gated routed experts)."""

    def __init__(self, n_embd: int, n_expert: int, top_k: int = 2, hidden: int | None = None,
                 capacity_factor: float = 0.0, groups: int = 1, normalize: bool = True,
                 aux_coef: float = 0.01, z_coef: float = 0.0, bias_rate: float = 0.0,
                 bias: bool = True, dtype: str = "float32", std: float | None = None,
                 proj_std: float | None = None, generator: Any = None,
                 expert: Callable[[], Module] | None = None, shared: Module | None = None,
                 balance: str = "global_batch"):
        super().__init__()
        if balance not in BALANCE:
            raise ValueError(f"balance must be one of {BALANCE}, got {balance!r}")
        self.router = Linear(n_embd, n_expert, bias=False, dtype=dtype, std=std,
                             generator=generator)
        if expert is None:
            def expert() -> Module:
                return MLP(n_embd, hidden or 4 * n_embd, 0.0, bias, dtype, std, proj_std,
                           generator)
        self.experts = Experts({i: expert() for i in range(n_expert)})
        self.shared = shared
        self.n_expert, self.top_k = n_expert, top_k
        self.capacity_factor, self.groups, self.normalize = capacity_factor, groups, normalize
        self.aux_coef, self.z_coef, self.bias_rate = aux_coef, z_coef, bias_rate
        self.balance = balance
        # DeepSeek-V3's selection bias: not a parameter (no gradient), moved by update_bias;
        # a persistent buffer (torchtitan's), so checkpoints keep it
        self.register_buffer("expert_bias", xp.zeros((n_expert,), dtype=dtype))
        self.step_counts: Any = None   # (E,) assignments of the forwards since update_bias
        self.token_share: Any = None   # the ranks holding the batch's other tokens, or None
        self.aux_loss: Tensor | None = None
        self.last: Routing | None = None

    def route(self, x_flat: Tensor, groups: int | None = None) -> Routing:
        """Route (S, C) tokens; remembers the result in ``last`` and ``aux_loss``.

        In training, the counts are summed over ``token_share`` (module docstring); an
        eval forward (``generate``) counts this rank's tokens alone, so one rank may
        run it without the others."""
        share = self.token_share if self.training else None
        routing = route(self.router(x_flat), self.top_k, normalize=self.normalize,
                        bias=self.expert_bias if self.bias_rate > 0 else None,
                        capacity_factor=self.capacity_factor,
                        groups=self.groups if groups is None else groups,
                        aux_coef=self.aux_coef, z_coef=self.z_coef,
                        total_counts=None if share is None else share.loss_counts)
        self.last, self.aux_loss = routing, routing.aux_loss
        if self.bias_rate > 0 and self.training and not is_recomputing():
            counts = routing.counts
            self.step_counts = counts if self.step_counts is None else self.step_counts + counts
        return routing

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        x_flat = x.reshape(-1, shape[-1])                            # (S, C)
        routing = self.route(x_flat)
        tokens, flat, experts = dispatch_order(routing.experts, routing.kept)
        rows = x_flat[tokens]                                        # (A, C) sorted by expert
        y = run_experts(self.experts, rows, rows_per_expert(experts, self.experts.indices))
        gates = routing.gates.reshape(-1)[flat]                      # (A,)
        out = index_add(y * gates.reshape(-1, 1), tokens, x_flat.shape[0])
        return self.add_shared(out.reshape(shape), x)

    def add_shared(self, routed: Tensor, x: Tensor) -> Tensor:
        """routed + shared(x) with shared experts, else routed."""
        return routed if self.shared is None else routed + self.shared(x)

    def update_bias(self) -> None:
        """After an optimizer step: nudge the selection bias by the step's loads, the
        assignments of every training forward since the last update on every rank
        that shares the batch (a collective when ``token_share`` is set)."""
        if self.bias_rate <= 0 or self.step_counts is None:
            return
        counts, self.step_counts = self.step_counts, None
        if self.token_share is not None:
            counts = self.token_share.step_counts(counts)
        self.expert_bias = nudge_bias(self.expert_bias, counts, self.bias_rate)


def routers(module: Module) -> list[MoE]:
    """Every MoE layer inside ``module`` (itself included), in module order."""
    return [m for m in module.modules() if isinstance(m, MoE)]


def routes_tokens(module: Any) -> bool:
    """Whether ``module`` routes tokens to experts (an MoE, expert-parallel or not): its
    balancing loss then leaves beside the block's output, and its routing in ``last``."""
    return isinstance(module, MoE)


def adds_balancing_loss(model: Module) -> bool:
    """Whether ``model``'s loss adds a router's balancing term: an MoE layer's own
    (alpha * balance + beta * z, ``aux_coef`` and ``z_coef``: the GPT's), or one the model
    pools over its MoE layers when ``model.pooled_balance_coef`` is not 0 (the Llama's
    Mixtral loss, router.py ``pooled_balance``). DeepSeek-V3's bias adds no loss."""
    moes = routers(model)
    if any(moe.aux_coef or moe.z_coef for moe in moes):
        return True
    return bool(moes) and bool(model.pooled_balance_coef)


def pooled_balance_only(model: Module) -> bool:
    """Whether ``model``'s one balancing term is pooled over its MoE layers (the Llama's),
    with no layer's own term (the GPT's): what a pipeline carries across its stages
    (parallel/pipeline/balance.py)."""
    moes = routers(model)
    return (bool(moes) and bool(model.pooled_balance_coef)
            and not any(moe.aux_coef or moe.z_coef for moe in moes))


def routing_mlp(block: Module) -> MoE | None:
    """The block's MLP if it routes tokens (an MoE, expert-parallel or not), else None."""
    mlp = getattr(block, "mlp", None)
    return mlp if routes_tokens(mlp) else None


def layer_loss(routing: Routing) -> Tensor:
    """The GPT's router term of one layer: alpha * balance + beta * z (a scalar)."""
    return routing.aux_loss


def layer_mean_probs(routing: Routing) -> Tensor:
    """The Llama's router term of one layer: P_i, the mean router probability of each
    expert (E,), which the model pools over its layers (router.py ``pooled_balance``)."""
    return routing.mean_probs


def run_block(fn: Callable[[Tensor], Tensor], moe: MoE | None, x: Tensor,
              term: Callable[[Routing], Tensor],
              recompute: bool | str = False) -> tuple[Tensor, Tensor | None]:
    """``fn(x)`` (a block whose MLP is ``moe``, or None), and for an MoE ``term`` of its
    routing (``moe.last``): the tensor the loss adds (the GPT's ``layer_loss``, the
    Llama's ``layer_mean_probs``), with its graph.

    ``recompute``: run the block under an activation checkpoint (in no_grad, and
    again in backward; "selective": keeping the matmuls' and attention's results,
    autograd/selective_checkpoint.py). The term then leaves the checkpoint as its second output,
    so that its gradient runs through the recompute as the block's output's does;
    read off ``moe.last`` after the checkpoint it would be a constant of the no-grad
    forward, and the router would silently get no gradient from the loss it adds.
    """
    if not recompute:
        return (fn(x), None) if moe is None else (fn(x), term(moe.last))
    policy = policy_of(recompute)
    if moe is None:
        return checkpoint(fn, x, policy=policy), None

    def with_term(x: Tensor) -> tuple[Tensor, Tensor]:
        return fn(x), term(moe.last)
    return checkpoint(with_term, x, policy=policy)
