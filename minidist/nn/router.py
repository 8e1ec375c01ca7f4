"""The router of a mixture-of-experts layer: which experts each token goes to, with what
weight, which assignments are dropped for capacity, and the balancing losses.

For S tokens x_t of width D and E experts (router weight W_r of shape (E, D)):

    logits = x W_r^T                       (S, E)
    p      = softmax(logits)               (S, E)
    top-k  = the k experts of largest p_t,i + b_i      (b: DeepSeek-V3's bias, else 0)
    gate   = p_t,i over the chosen i       (S, k), renormalised to sum 1 if asked

k = 1 is the Switch Transformer (Fedus et al., 2021), k = 2 GShard (Lepikhin et al.,
2020) and Mixtral. The gate keeps its gradient; the choice itself has none.

Capacity (Switch eq. 3; GShard's groups): the tokens are cut into G equal groups
(one per data-parallel rank when the layer runs expert-parallel) and every expert
takes at most

    C = ceil(capacity_factor * (S / G) * k / E)

assignments from each group, first slot-0 choices in token order, then slot-1
choices, and so on. A dropped assignment adds nothing; a token dropped by all of its
experts passes through the block unchanged, by the residual connection.

Balancing, three ways:

- Switch load-balancing loss (Fedus et al., eq. 4-6):  alpha * E * sum_i f_i * P_i,
  f_i = share of the S*k assignments that chose expert i (before dropping, no
  gradient), P_i = mean over tokens of p_t,i. Minimal (alpha) when both are 1/E.
- router z-loss (Zoph et al., 2022, ST-MoE eq. 5):  beta * mean_t (logsumexp_i logits_t,i)^2,
  keeps the logits small so the softmax stays well conditioned.
- Mixtral's balancing loss (transformers): the same product, pooled over the
  tokens of every layer and counting slots, ``pooled_balance``; what the Llama adds.
- auxiliary-loss-free balancing (DeepSeek-V3, Liu et al., 2024, section 2.1.2): a
  bias b_i added to the scores only for the top-k choice, and after each step
  b_i += gamma * sign(mean load - load_i): overloaded experts become less attractive.

Computed by ``route`` (used by nn/moe.py and, with counts summed over ranks, by
parallel/expert/). Docs: docs/moe.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from minidist.autograd.tensor import Tensor
from minidist.backend import xp
from minidist.nn import functional as F

# which tokens the balancing loss counts when several ranks share a batch (nn/moe.py)
BALANCE = ("global_batch", "micro_batch")


@dataclass
class Routing:
    """What the router decided for S tokens (arrays; ``gates`` and ``aux_loss`` keep grads)."""
    experts: Any          # (S, k) int: the chosen experts, best first
    gates: Tensor         # (S, k): weight of each choice
    kept: Any             # (S, k) bool: False where capacity dropped the assignment
    counts: Any           # (E,) int: assignments per expert before dropping, over all ranks
    aux_loss: Tensor      # alpha * balance + beta * z (a scalar)
    balance: Tensor       # E * sum_i f_i P_i (without alpha)
    z: Tensor             # mean_t logsumexp(logits_t)^2 (without beta)
    tokens: int = 0       # the tokens ``counts`` counts, over all ranks
    mean_probs: Tensor | None = None   # (E,) P_i: mean over this call's tokens of p_t,i


def capacity(capacity_factor: float, tokens: int, k: int, n_expert: int) -> int:
    """Assignments an expert takes from one group of ``tokens`` tokens (Switch eq. 3)."""
    return math.ceil(capacity_factor * tokens * k / n_expert)


def top_k(scores: Any, k: int) -> Any:
    """(S, E) -> (S, k) indices of the k largest scores per row, largest first
    (ties: the lower index first, as a stable sort gives)."""
    order = xp.argsort(-scores, axis=-1, kind="stable")             # (S, E)
    return order[:, :k]


def keep_within_capacity(experts: Any, n_expert: int, cap: int, groups: int) -> Any:
    """(S, k) chosen experts -> (S, k) bool: does the assignment fit the capacity?

    Within each of ``groups`` contiguous groups of tokens, an assignment's position in
    its expert's queue counts the earlier assignments to that expert, slot-0 choices
    of all tokens first (GShard's priority), then slot 1, ...
    """
    S, k = experts.shape
    if S % groups:
        raise ValueError(f"{S} tokens do not split into {groups} equal capacity groups")
    per = S // groups
    kept = xp.zeros((S, k), dtype=bool)
    ids = xp.arange(n_expert)
    for g in range(groups):
        block = experts[g * per:(g + 1) * per]                       # (per, k)
        queue = block.T.reshape(-1)                                  # slot-major (k * per,)
        onehot = (queue[:, None] == ids[None, :]).astype("int64")    # (k * per, E)
        position = xp.cumsum(onehot, axis=0)[xp.arange(queue.size), queue] - 1
        kept[g * per:(g + 1) * per] = (position < cap).reshape(k, per).T
    return kept


def expert_counts(experts: Any, ids: Any) -> Any:
    """Chosen experts (any shape) -> how many assignments chose each expert: of
    0 .. E-1 for an int ``ids`` = E, (E,); else of each id listed, in its order."""
    ids = xp.arange(ids) if isinstance(ids, int) else xp.asarray(ids)
    return (experts.reshape(-1)[:, None] == ids[None, :]).sum(axis=0)  # (n, len(ids)) one-hot


def z_loss(logits: Tensor) -> Tensor:
    """mean_t (logsumexp_i logits_t,i)^2 (ST-MoE eq. 5); the max is shifted out for
    stability and added back, which leaves the value and gradient unchanged."""
    m = Tensor(logits.data.max(axis=-1, keepdims=True))              # (S, 1), a constant
    lse = (logits - m).exp().sum(axis=-1, keepdims=True).log() + m   # (S, 1)
    return (lse * lse).mean()


def route(logits: Tensor, k: int, *, normalize: bool = True, bias: Any = None,
          capacity_factor: float = 0.0, groups: int = 1, aux_coef: float = 0.0,
          z_coef: float = 0.0,
          total_counts: Callable[[Any, int], tuple[Any, int]] | None = None) -> Routing:
    """Route S tokens from their (S, E) router logits (formulas in the module docstring).

    ``capacity_factor`` 0 keeps every assignment. ``total_counts(counts, S)`` turns
    this call's counts into (counts, tokens) over every rank that shares the layer
    (expert parallelism sums them); None: this call's tokens are all there are.
    """
    S, E = logits.shape
    if not 1 <= k <= E:
        raise ValueError(f"top-k must be between 1 and the {E} experts, got k={k}")
    probs = F.softmax(logits, axis=-1)                               # (S, E)
    scores = probs.data if bias is None else probs.data + bias
    experts = top_k(scores, k)                                       # (S, k)
    gates = probs[xp.arange(S)[:, None], experts]                    # (S, k)
    if normalize and k > 1:
        gates = gates / gates.sum(axis=-1, keepdims=True)
    if capacity_factor > 0:
        cap = capacity(capacity_factor, S // groups, k, E)
        kept = keep_within_capacity(experts, E, cap, groups)
    else:
        kept = xp.ones((S, k), dtype=bool)
    counts, tokens = expert_counts(experts, E), S
    if total_counts is not None:
        counts, tokens = total_counts(counts, S)
    f = Tensor(counts.astype(logits.dtype) / (tokens * k))           # (E,) no gradient
    P = probs.mean(axis=0)                                           # (E,)
    balance = (f * P).sum() * E
    z = z_loss(logits)
    return Routing(experts, gates, kept, counts, balance * aux_coef + z * z_coef, balance, z,
                   tokens, P)


def pooled_balance(routings: list[Routing], mean_probs: list[Tensor] | None = None) -> Tensor:
    """One Switch balancing loss over the tokens of several layers, as transformers'
    ``load_balancing_loss_func`` computes Mixtral's:

        E * sum_i F_i * P_i,   F_i = assignments to expert i in every layer
                                     / tokens in every layer     (sums to k)
                               P_i = mean over the layers of their P_i

    F counts slots, not shares: for one layer this is k * ``balance``. The layers
    route the same tokens, so the mean of their P_i is the mean over all their
    tokens. ``mean_probs``: the layers' P in place of ``routing.mean_probs`` (what
    an activation checkpoint returned, with its graph; nn/moe.py)."""
    P = [r.mean_probs for r in routings] if mean_probs is None else mean_probs
    counts = sum(r.counts for r in routings)                         # (E,) no gradient
    tokens = sum(r.tokens for r in routings)
    slots = Tensor(counts.astype(P[0].dtype) / tokens)                # (E,) F_i, no gradient
    mean_P = P[0]
    for p in P[1:]:
        mean_P = mean_P + p
    mean_P = mean_P / len(P)                                         # (E,)
    return (slots * mean_P).sum() * counts.shape[0]


def nudge_bias(bias: Any, counts: Any, rate: float) -> Any:
    """DeepSeek-V3's update: b_i + rate * sign(mean load - load_i)."""
    load = counts.astype(bias.dtype)
    return bias + rate * xp.sign(load.mean() - load)
