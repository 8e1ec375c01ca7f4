"""Communication cost models: the alpha-beta model of the collectives.

Notation (workbook ch. 0 and 4, chapter 26 ex. 26.1): N ranks, M bytes of data
per rank (the whole gradient, not a chunk), alpha the latency of one message
(seconds), beta or BW the bandwidth of one link (bytes/s).

    ring all-reduce    T = 2(N-1) * alpha + 2(N-1)/N * M / beta
                       each rank sends 2(N-1)/N * M bytes (and receives as much)
    naive all-reduce   T = 2(N-1) * (alpha + M / beta); the root sends (N-1) M
    tree all-reduce    T = 2 ceil(log2 N) * (alpha + M / beta)
    all-gather,        T = (N-1) * alpha + (N-1)/N * M / beta
    reduce-scatter     (M = the full tensor; each rank sends (N-1)/N * M)

A ring all-reduce is a reduce-scatter followed by an all-gather, so its bytes
are twice theirs. These agree with ``minidist.comm.collectives.cost`` (which measures the
same quantities on the real collectives); calc restates them so that it depends
on nothing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


def _check_ranks(ranks: int) -> None:
    if ranks < 1:
        raise ValueError(f"need at least one rank, got {ranks}")


def ring_all_reduce_bytes(size_bytes: float, ranks: int) -> float:
    """Bytes each rank sends in a ring all-reduce: 2(N-1)/N * M.

    Workbook 0.1: M = 1 GB, N = 8 -> 1.75 GB. Quiz Q1: tends to 2M as N grows.
    """
    _check_ranks(ranks)
    return 2 * (ranks - 1) / ranks * size_bytes


def all_gather_bytes(size_bytes: float, ranks: int) -> float:
    """Bytes each rank sends in a ring all-gather or reduce-scatter: (N-1)/N * M.

    M is the size of the full (gathered, or to-be-scattered) tensor. One phase
    of the ring all-reduce (workbook ch. 0: 0.875 GB of the 1.75 GB in 0.1;
    workbook 1.5: 14 GB of FP16 weights on 64 GPUs -> 13.78 GB).
    """
    _check_ranks(ranks)
    return (ranks - 1) / ranks * size_bytes


reduce_scatter_bytes = all_gather_bytes   # same volume, reduction instead of copy


def naive_all_reduce_bytes(size_bytes: float, ranks: int) -> float:
    """Bytes the root sends in the naive all-reduce (gather to root, broadcast back).

    The root receives (N-1) M and sends (N-1) M: 2(N-1) M through one network
    interface (quiz Q1). The workbook's chapter 0 introduction says "N x M bytes
    out"; the root does not send to itself, so it is (N-1) x M.
    """
    _check_ranks(ranks)
    return (ranks - 1) * size_bytes


def ring_all_reduce_time(size_bytes: float, ranks: int, bandwidth: float,
                         latency: float = 0.0) -> float:
    """Seconds for a ring all-reduce: T = 2(N-1) alpha + 2(N-1)/N * M / beta.

    2(N-1) steps (N-1 reduce-scatter, N-1 all-gather), each moving M/N bytes over
    every link at once. Chapter 26 ex. 26.1; workbook 0.2 (2 GB, 8 GPUs,
    50 GB/s -> 70 ms), 0.5, 4.1 (20 GB, 64 GPUs, 600 GB/s -> 65.6 ms).
    """
    steps = 2 * (ranks - 1)
    return steps * latency + ring_all_reduce_bytes(size_bytes, ranks) / bandwidth


def naive_all_reduce_time(size_bytes: float, ranks: int, bandwidth: float,
                          latency: float = 0.0) -> float:
    """Seconds for the naive all-reduce: T = 2(N-1) (alpha + M / beta).

    The root takes the N-1 messages one after another, then sends N-1 back
    (quiz Q1; workbook ch. 0, "send everything to GPU 0, sum, broadcast back").
    """
    _check_ranks(ranks)
    return 2 * (ranks - 1) * (latency + size_bytes / bandwidth)


def tree_reduce_time(size_bytes: float, ranks: int, bandwidth: float,
                     latency: float = 0.0) -> float:
    """Seconds for a binary-tree reduce: ceil(log2 N) (alpha + M / beta).

    Each of the ceil(log2 N) levels sends the full M over the link into the
    parent. Workbook 0.4: 3 x 4 GB / 50 GB/s = 240 ms.
    """
    _check_ranks(ranks)
    levels = math.ceil(math.log2(ranks)) if ranks > 1 else 0
    return levels * (latency + size_bytes / bandwidth)


def tree_all_reduce_time(size_bytes: float, ranks: int, bandwidth: float,
                         latency: float = 0.0) -> float:
    """Seconds for a tree all-reduce (reduce, then broadcast down the same tree).

    T = 2 ceil(log2 N) (alpha + M / beta). Fewer steps than the ring, but the
    full M crosses a link at every step. Workbook 0.4: 480 ms vs the ring's 140.
    """
    return 2 * tree_reduce_time(size_bytes, ranks, bandwidth, latency)


def all_gather_time(size_bytes: float, ranks: int, bandwidth: float,
                    latency: float = 0.0) -> float:
    """Seconds for a ring all-gather (or reduce-scatter) of a total of M bytes.

    T = (N-1) alpha + (N-1)/N * M / beta: half of the ring all-reduce
    (workbook ch. 0, "Phase 2: AllGather (N-1 steps)"; ZeRO-3's gathers, 1.5).
    """
    return (ranks - 1) * latency + all_gather_bytes(size_bytes, ranks) / bandwidth


@dataclass(frozen=True)
class AllReduceCost:
    algorithm: str
    seconds: float
    bytes_per_rank: float   # bytes sent by the busiest rank (the root, for naive)
    steps: int              # messages in sequence, each paying alpha


def all_reduce_cost(size_bytes: float, ranks: int, bandwidth: float,
                    latency: float = 0.0, algorithm: str = "ring") -> AllReduceCost:
    """Time, busiest-rank bytes and step count of one all-reduce algorithm.

    algorithm is "ring", "tree" or "naive"; see the module docstring. Workbook
    0.4: the tree takes 6 steps and the ring 14 on 8 GPUs.
    """
    if algorithm == "ring":
        return AllReduceCost("ring", ring_all_reduce_time(size_bytes, ranks, bandwidth, latency),
                             ring_all_reduce_bytes(size_bytes, ranks), 2 * (ranks - 1))
    if algorithm == "tree":
        levels = math.ceil(math.log2(ranks)) if ranks > 1 else 0
        return AllReduceCost("tree", tree_all_reduce_time(size_bytes, ranks, bandwidth, latency),
                             levels * size_bytes, 2 * levels)
    if algorithm == "naive":
        return AllReduceCost("naive", naive_all_reduce_time(size_bytes, ranks, bandwidth, latency),
                             naive_all_reduce_bytes(size_bytes, ranks), 2 * (ranks - 1))
    raise ValueError(f"unknown all-reduce algorithm {algorithm!r}: ring, tree or naive")


@dataclass(frozen=True)
class HierarchicalCost:
    intra_seconds: float    # reduce-scatter + all-gather inside each node
    inter_seconds: float    # all-reduce across nodes
    seconds: float          # the sum: the phases run one after another


def hierarchical_all_reduce(size_bytes: float, gpus_per_node: int, nodes: int,
                            intra_bandwidth: float, inter_bandwidth: float,
                            intra_latency: float = 0.0,
                            inter_latency: float = 0.0) -> HierarchicalCost:
    """Two-level all-reduce: inside each node, then across nodes, then inside again.

    Workbook 4.3: "first reduce within each node (fast), then AllReduce across
    nodes (slow), then broadcast within nodes (fast)". Written here as a ring
    reduce-scatter inside the node (g GPUs), a ring all-reduce of the node's M
    bytes across the n nodes over the node's inter_bandwidth (bytes/s per node,
    all its links together), and a ring all-gather inside the node:

        T_intra = 2 [(g-1) alpha_intra + (g-1)/g * M / B_intra]
        T_inter = 2(n-1) alpha_inter + 2(n-1)/n * M / B_inter

    The cross-node term is the workbook's: 20 GB over 8 nodes at 100 GB/s is
    2 x 20 x 7 / (8 x 100) = 350 ms, whatever the node does inside.
    """
    intra = 2 * all_gather_time(size_bytes, gpus_per_node, intra_bandwidth, intra_latency)
    inter = ring_all_reduce_time(size_bytes, nodes, inter_bandwidth, inter_latency)
    return HierarchicalCost(intra, inter, intra + inter)


def algorithm_bandwidth(size_bytes: float, seconds: float) -> float:
    """algbw = M / t (bytes/s), as nccl-tests reports it (workbook 0.3: 4 GB / 30 ms)."""
    return size_bytes / seconds


# nccl-tests' bus-bandwidth factors (its doc/PERFORMANCE.md): what each rank's
# links must carry per byte of the collective's size M, so that busbw can be held
# against a link's peak whatever the collective
BUS_FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,       # M = the gathered tensor
    "reduce_scatter": lambda n: (n - 1) / n,   # M = the tensor before scattering
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
}


def bus_bandwidth(size_bytes: float, ranks: int, seconds: float,
                  collective: str = "all_reduce") -> float:
    """busbw of a measured collective: algbw x factor (bytes/s, nccl-tests' convention).

    algbw = M / t; the factor is 2(N-1)/N for all-reduce, (N-1)/N for all-gather,
    reduce-scatter and all-to-all, 1 for broadcast and reduce (``BUS_FACTORS``).
    For all-reduce it is the rate at which each link moved the ring's 2(N-1)/N * M
    bytes. Workbook 0.3: 4 GB on 8 GPUs in 30 ms -> 7 GB / 0.030 s = 233 GB/s,
    77.8% of 300 GB/s.
    """
    _check_ranks(ranks)
    if collective not in BUS_FACTORS:
        raise ValueError(f"unknown collective {collective!r}: one of {sorted(BUS_FACTORS)}")
    if seconds <= 0:
        raise ValueError(f"seconds must be > 0, got {seconds}")
    return algorithm_bandwidth(size_bytes, seconds) * BUS_FACTORS[collective](ranks)


def bandwidth_utilization(size_bytes: float, ranks: int, seconds: float,
                          peak_bandwidth: float) -> float:
    """busbw / peak link bandwidth (a fraction). Workbook 0.3: 0.778."""
    return bus_bandwidth(size_bytes, ranks, seconds) / peak_bandwidth


def exposed_comm_seconds(layers: int, all_reduce_seconds: float,
                         backward_seconds_per_layer: float) -> float:
    """Communication left on the critical path when bucketed all-reduce overlaps backward.

    Layer k's gradients are all-reduced (one bucket per layer, one after another
    on the communication stream) while layer k-1's backward runs. Only the last
    bucket's all-reduce is exposed, unless each all-reduce is slower than a layer's
    backward, in which case the queue grows by the difference at every layer:

        exposed = t_ar + (L-1) * max(0, t_ar - t_bwd)

    Workbook 4.2: 40 layers, 1.5 ms per all-reduce, 5 ms per layer -> 1.5 ms.
    """
    backlog = max(0.0, all_reduce_seconds - backward_seconds_per_layer)
    return all_reduce_seconds + (layers - 1) * backlog


def overlap_fraction(layers: int, all_reduce_seconds: float,
                     backward_seconds_per_layer: float) -> float:
    """Fraction of the all-reduce time hidden behind the backward pass.

    (total - exposed) / total, total = L * t_ar. Workbook 4.2: (60 - 1.5)/60 = 97.5%.

    The workbook's chapter 4 introduction writes "overlap fraction ~ 1 -
    T_comm_last_layer / T_backward", which is 1 - 1.5/200 = 99.25% for the same
    numbers: that is one minus the overhead (0.75% of the backward), not the
    fraction of communication overlapped; see ``comm_overhead_fraction``.
    """
    total = layers * all_reduce_seconds
    return (total - exposed_comm_seconds(layers, all_reduce_seconds,
                                         backward_seconds_per_layer)) / total


def comm_overhead_fraction(layers: int, all_reduce_seconds: float,
                           backward_seconds_per_layer: float) -> float:
    """Exposed communication / backward time. Workbook 4.2: 1.5 / 200 < 1%."""
    exposed = exposed_comm_seconds(layers, all_reduce_seconds, backward_seconds_per_layer)
    return exposed / (layers * backward_seconds_per_layer)


def comm_compute_ratio(comm_seconds: float, compute_seconds: float) -> float:
    """T_comm / T_compute. Workbook 4.4: 350 ms / 242 ms = 1.45."""
    return comm_seconds / compute_seconds


def dp_comm_compute_ratio(params: float, ranks: int, bandwidth: float,
                          step_flops: float, flops_per_second: float,
                          grad_bytes_per_param: float = 2.0) -> float:
    """The workbook's comm_compute_ratio (its exercise 4.5) for data parallelism.

    S = params * grad bytes (FP16: 2); T_comm = 2S(N-1)/(N BW) (ring, no
    latency, no overlap); T_compute = step FLOPs / achieved FLOP/s.
    """
    comm = ring_all_reduce_time(params * grad_bytes_per_param, ranks, bandwidth)
    return comm / (step_flops / flops_per_second)


def mfu_with_exposed_comm(mfu: float, compute_seconds: float, comm_seconds: float) -> float:
    """MFU once unoverlapped communication is added to the step.

    MFU * T_compute / (T_compute + T_comm). Workbook 4.4: 50% x 242/(242+350) = 20%.
    """
    return mfu * compute_seconds / (compute_seconds + comm_seconds)


def hierarchical_inter_node_bytes(size_bytes: float, nodes: int, local: int) -> float:
    """Bytes each rank sends between nodes in the hierarchical all-reduce:
    2(K-1)/K * M/L (K nodes of L ranks; comm/collectives/hierarchical.py)."""
    _check_ranks(nodes)
    _check_ranks(local)
    return 2 * (nodes - 1) / nodes * size_bytes / local


def hierarchical_all_reduce_time(size_bytes: float, nodes: int, local: int,
                                 intra_bandwidth: float, inter_bandwidth: float,
                                 latency: float = 0.0) -> float:
    """Seconds for the hierarchical all-reduce on K nodes of L ranks:

        T = 2(L-1)/L * M / beta_intra + 2(K-1)/K * (M/L) / beta_inter + 2(L-1 + K-1) alpha

    (ring reduce-scatter and all-gather inside each node, a ring all-reduce of
    each rank's M/L shard between nodes). A flat ring over the same K * L ranks
    crosses a slow link in every step: ``ring_all_reduce_time(M, K*L, beta_inter)``.
    """
    intra = 2 * (local - 1) / local * size_bytes / intra_bandwidth
    inter = hierarchical_inter_node_bytes(size_bytes, nodes, local) / inter_bandwidth
    return intra + inter + 2 * (local - 1 + nodes - 1) * latency
