"""Mixture of experts and sequence parallelism: parameters and all-to-all bytes.

Notation: L layers, hidden size h, vocabulary V, E experts per MoE layer, k experts
per token, ep ranks in the expert-parallel group, S tokens per rank, s the sequence
length, N ranks in the sequence-parallel group, b batch, B bytes per element.

Total vs active parameters (Fedus et al., 2021; Mixtral): an MoE layer holds E
feed-forward blocks but each token runs through k of them, so

    total  = dense part + n_moe * (E * P_ffn + h * E)        (router: h * E)
    active = dense part + n_moe * (k * P_ffn + h * E)
    P_ffn  = 8 h^2 + 5 h (two linears with biases, 4h wide)

All-to-all bytes per MoE layer, per rank (GShard, Lepikhin et al., 2020, sec. 3.2):
each of the S * k assignments is a row of h elements; with uniform routing a share
(ep-1)/ep of them leaves the rank, in the dispatch and again in the combine:

    dispatch = combine = S * k * h * B * (ep-1)/ep;  forward 2x, forward + backward 4x
    (times the capacity factor where the buffers are padded to capacity)

Sequence parallelism of attention, bytes each rank sends per layer (q, k, v, o each
b * s * h * B in all, M_r = b * (s/N) * h * B per rank):

    Ulysses  (Jacobs et al., 2023):  forward 4 * (N-1)/N * M_r  (q, k, v in; o out)
    ring attention (Liu et al., 2023):  forward 2 * (N-1) * M_r  (K and V go round)

so ring / Ulysses = N/2: equal at N = 2, and Ulysses' volume per rank falls as 1/N
while the ring's stays near 2 * b * s * h * B. Ring attention wins when N does not
divide the heads (Ulysses cannot run), or when its transfers hide behind the block
computations (a block of attention costs ~ 4 b (s/N)^2 h FLOPs against 2 M_r bytes).
"""
from __future__ import annotations

from dataclasses import dataclass


def ffn_params(hidden: int, bias: bool = True) -> int:
    """One 4h-wide feed-forward block: 8 h^2 (+ 5 h biases)."""
    return 8 * hidden * hidden + (5 * hidden if bias else 0)


@dataclass(frozen=True)
class MoEParams:
    total: int       # every parameter of the model
    active: int      # parameters one token runs through
    moe_layers: int  # layers whose MLP is an MoE


def moe_gpt_params(layers: int, hidden: int, vocab: int, n_expert: int, top_k: int,
                   moe_every: int = 1, seq: int = 0, bias: bool = True,
                   tied: bool = True) -> MoEParams:
    """Total and active parameters of a GPT whose every ``moe_every``-th MLP is an MoE
    (minidist's GPT: attention 4 h^2 + 4 h, two layer norms 4 h, positions seq * h).
    GPT-2 small's shapes (12 layers, h = 768, V = 50257, 1024 positions) with 8
    experts, top-2, in every layer: 521,197,824 in total, 181,182,720 active."""
    if not 1 <= top_k <= n_expert:
        raise ValueError(f"top_k must be between 1 and n_expert={n_expert}, got {top_k}")
    if moe_every < 1:
        raise ValueError(f"moe_every must be at least 1, got {moe_every}")
    b = 1 if bias else 0
    attention = 4 * hidden * hidden + 4 * hidden * b
    norms = 2 * (hidden + hidden * b)
    n_moe = layers // moe_every
    dense = layers * (attention + norms) + (layers - n_moe) * ffn_params(hidden, bias)
    dense += vocab * hidden * (1 if tied else 2) + seq * hidden + hidden + hidden * b  # + ln_f
    router = hidden * n_expert
    total = dense + n_moe * (n_expert * ffn_params(hidden, bias) + router)
    active = dense + n_moe * (top_k * ffn_params(hidden, bias) + router)
    return MoEParams(total, active, n_moe)


@dataclass(frozen=True)
class AllToAllBytes:
    dispatch: float          # one all-to-all of the rows to the experts, bytes per rank
    forward: float           # dispatch + combine
    forward_backward: float  # and their mirror in backward


def moe_all_to_all_bytes(tokens: int, hidden: int, top_k: int, ep: int,
                         bytes_per_element: float = 2.0,
                         capacity_factor: float = 1.0) -> AllToAllBytes:
    """Bytes one rank sends per MoE layer (module docstring): S k h B (ep-1)/ep per
    all-to-all, 4 all-to-alls per training step. 4096 tokens, h = 4096, k = 2, ep = 8,
    bf16: 56 MiB per all-to-all."""
    if ep < 1:
        raise ValueError(f"ep must be at least 1, got {ep}")
    one = tokens * top_k * hidden * bytes_per_element * capacity_factor * (ep - 1) / ep
    return AllToAllBytes(one, 2 * one, 4 * one)


@dataclass(frozen=True)
class SequenceParallelBytes:
    ulysses_forward: float   # bytes each rank sends, one attention layer, forward
    ring_forward: float
    ulysses_step: float      # forward + backward
    ring_step: float
    ulysses_possible: bool   # N divides the heads


def sequence_parallel_bytes(seq: int, hidden: int, ranks: int, batch: int = 1,
                            bytes_per_element: float = 2.0,
                            heads: int = 0) -> SequenceParallelBytes:
    """Ulysses vs ring attention, bytes per rank and layer (module docstring).

    Backward: Ulysses mirrors its 4 all-to-alls (dO, and dQ dK dV back); ring attention
    sends K, V round again (N-1 hops) and their gradient accumulators dK, dV, which take
    N hops to come back to their owner: (2(N-1) + 2N) M_r.
    s = 32768, h = 4096, N = 8, b = 1, bf16: Ulysses 112 MiB, ring 448 MiB forward."""
    if seq % ranks:
        raise ValueError(f"sequence {seq} does not split over {ranks} ranks")
    n = ranks
    m_rank = batch * (seq // n) * hidden * bytes_per_element
    ulysses = 4 * (n - 1) / n * m_rank
    ring = 2 * (n - 1) * m_rank
    possible = heads == 0 or heads % n == 0
    return SequenceParallelBytes(ulysses, ring, 2 * ulysses,
                                 ring + (2 * (n - 1) + 2 * n) * m_rank, possible)
