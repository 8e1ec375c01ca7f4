"""The alpha-beta cost model: time = steps * alpha + bytes on the busiest link / beta.

alpha is the fixed cost of one message (latency, seconds), beta the bandwidth
(bytes per second), M the array size in bytes, N the number of ranks. Each
function returns the predicted time and the bytes the busiest rank sends, for
the algorithms in all_reduce.py, ring.py and tree.py:

    ring all-reduce    T = 2(N-1) * alpha + 2(N-1)/N * M / beta
    naive all-reduce   T = 2(N-1) * (alpha + M / beta)         (root sends (N-1) M)
    tree all-reduce    T = 2 ceil(log2 N) * (alpha + M / beta)
    rec. doubling      T = ceil(log2 N) * (alpha + M / beta)   (+2 steps if N not 2^k)
    allgather all-red. T = ceil(log2 N) * alpha + (N-1) * M / beta
    one-shot all-red.  T = alpha + (N-1) * M / beta            (the board, oneshot.py)
    direct all-reduce  T = 3 ceil(log2 N) * alpha + 2(N-1)/N * M / beta  (reads, direct.py)
    ring all-gather    T = (N-1) * alpha + (N-1)/N * M / beta  (M = the gathered total)
    tree broadcast     T = ceil(log2 N) * (alpha + M / beta)
    pairwise all-to-all T = (N-1) * alpha + (N-1)/N * M / beta (M = one rank's input)

Small M: the alpha term dominates (latency-bound) and fewer steps win (tree,
recursive doubling). Large M: the beta term dominates (bandwidth-bound) and the
ring wins, because no link carries more than 2(N-1)/N * M. The crossover is
near M ~ alpha * beta * (number of steps saved).
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Cost:
    seconds: float      # predicted time
    bytes_sent: float   # bytes sent by the busiest rank
    steps: int          # messages in sequence (each pays alpha)


def _log2(n: int) -> int:
    return math.ceil(math.log2(n)) if n > 1 else 0


def ring_all_reduce(m: float, n: int, alpha: float, beta: float) -> Cost:
    steps = 2 * (n - 1)
    sent = 2 * (n - 1) / n * m
    return Cost(steps * alpha + sent / beta, sent, steps)


def naive_all_reduce(m: float, n: int, alpha: float, beta: float) -> Cost:
    steps = 2 * (n - 1)
    return Cost(steps * (alpha + m / beta), (n - 1) * m, steps)


def tree_all_reduce(m: float, n: int, alpha: float, beta: float) -> Cost:
    steps = 2 * _log2(n)
    return Cost(steps * (alpha + m / beta), _log2(n) * m, steps)


def recursive_doubling_all_reduce(m: float, n: int, alpha: float, beta: float) -> Cost:
    steps = _log2(n) if n & (n - 1) == 0 else int(math.log2(n)) + 2
    return Cost(steps * (alpha + m / beta), steps * m, steps)


def allgather_all_reduce(m: float, n: int, alpha: float, beta: float) -> Cost:
    """Gather all N arrays (Bruck, ceil(log2 N) rounds), reduce locally (small.py)."""
    sent = (n - 1) * m
    return Cost(_log2(n) * alpha + sent / beta, sent, _log2(n))


def oneshot_all_reduce(m: float, n: int, alpha: float, beta: float) -> Cost:
    """Post once on the board, read the N-1 peers' slots in place, fold (oneshot.py):
    the allgather's bytes in one step."""
    sent = (n - 1) * m
    steps = 1 if n > 1 else 0
    return Cost(steps * alpha + sent / beta, sent, steps)


def direct_all_reduce(m: float, n: int, alpha: float, beta: float) -> Cost:
    """Read and fold one's chunk of every peer, read every other chunk (direct.py):
    the ring's bytes, but only the check's and two rounds' messages in sequence."""
    sent = 2 * (n - 1) / n * m
    return Cost(3 * _log2(n) * alpha + sent / beta, sent, 3 * _log2(n))


def ring_all_gather(m: float, n: int, alpha: float, beta: float) -> Cost:
    sent = (n - 1) / n * m
    return Cost((n - 1) * alpha + sent / beta, sent, n - 1)


def tree_broadcast(m: float, n: int, alpha: float, beta: float) -> Cost:
    return Cost(_log2(n) * (alpha + m / beta), _log2(n) * m, _log2(n))


def pairwise_all_to_all(m: float, n: int, alpha: float, beta: float) -> Cost:
    """Equal splits (alltoall.py): each rank keeps M/N and sends M/N to each of the others."""
    sent = (n - 1) / n * m
    return Cost((n - 1) * alpha + sent / beta, sent, n - 1)


ALL_REDUCE = {"ring": ring_all_reduce, "naive": naive_all_reduce, "tree": tree_all_reduce,
              "recursive_doubling": recursive_doubling_all_reduce,
              "allgather": allgather_all_reduce, "direct": direct_all_reduce}


def bus_bandwidth(m: float, n: int, seconds: float) -> tuple[float, float]:
    """(algbw, busbw) of an all-reduce in bytes/s, as nccl-tests defines them:
    algbw = M / t, busbw = algbw * 2(N-1)/N (what each link must carry)."""
    algbw = m / seconds
    return algbw, algbw * 2 * (n - 1) / n


def all_to_all_bus_bandwidth(m: float, n: int, seconds: float) -> tuple[float, float]:
    """(algbw, busbw) of an all-to-all of M bytes per rank, as nccl-tests defines
    them: algbw = M / t, busbw = algbw * (N-1)/N (the part that leaves the rank)."""
    algbw = m / seconds
    return algbw, algbw * (n - 1) / n


def fit_alpha_beta(sizes: list[float], seconds: list[float], n: int) -> tuple[float, float]:
    """Least-squares alpha, beta of the ring model from measured (M, T) pairs."""
    xs = [2 * (n - 1) / n * m for m in sizes]   # T = steps*alpha + x / beta
    steps = 2 * (n - 1)
    k = len(xs)
    mx, my = sum(xs) / k, sum(seconds) / k
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, seconds)) / var if var else 0.0
    intercept = my - slope * mx
    return max(intercept, 0.0) / steps, (1.0 / slope if slope > 0 else float("inf"))
