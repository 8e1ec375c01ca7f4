"""The thresholds of all_reduce's ``auto``, fitted to a sweep (bench_collectives --tune).

``auto`` (comm/collectives/all_reduce.py, ``choose``) takes

    allgather           while (N-1) * M <= GATHER_BYTES
    twoshot             while M < TWOSHOT_BYTES
    recursive_doubling  while M < SMALL_BYTES
    ring                while M < DIRECT_BYTES
    direct              from DIRECT_BYTES

with one set of thresholds per world size (all_reduce.THRESHOLDS): where the
algorithms cross depends on N (a ring step costs more at 4 ranks on 2 cores).
Given the time of every algorithm at every size and world size of one run,
``fit`` first caps each algorithm's time at a size by its time at any larger
size (``monotone``: on a machine shared with others a burst of load can make
one measurement ten times slower), then, for each world size, tries every
combination of thresholds on the sizes' grid and keeps the one with the least
sum of log(auto / fastest) over that world's points (then the least worst ratio). ``ratios`` says, for a set of
thresholds, how far auto is from the fastest at each point.
"""
from __future__ import annotations

import itertools
import math

INF = float("inf")


def pick(n: int, size: int, gather: int, small: int, direct: int, twoshot: int = 0) -> str:
    """What ``choose('auto', size, n)`` takes under these thresholds."""
    if size * (n - 1) <= gather:
        return "allgather"
    if size < twoshot:
        return "twoshot"
    if size < small:
        return "recursive_doubling"
    return "ring" if size < direct else "direct"


def fastest(times: dict) -> dict:
    """{(n, size): the least time of any algorithm} over ``times``
    ({(n, algorithm, size): seconds})."""
    out: dict = {}
    for (n, _, size), t in times.items():
        out[(n, size)] = min(t, out.get((n, size), INF))
    return out


def ratios(times: dict, thresholds: dict, best: dict | None = None) -> dict:
    """{(n, size): time of auto's pick / time of the fastest} for every point of
    ``times``; inf where the pick was not measured. ``thresholds``: {n: (gather,
    small, direct[, twoshot])}; ``best``: ``fastest(times)``."""
    best = fastest(times) if best is None else best
    return {(n, size): times.get((n, pick(n, size, *thresholds[n]), size), INF) / t
            for (n, size), t in best.items()}


def monotone(times: dict) -> dict:
    """``times`` with each algorithm's time at a size capped by its time at any
    larger size (a call on fewer bytes does no more work): a burst of load
    elsewhere during one measurement then no longer decides a threshold."""
    out = dict(times)
    for n, alg in {(n, alg) for n, alg, _ in times}:
        least = INF
        for size in sorted((s for m, a, s in times if (m, a) == (n, alg)), reverse=True):
            least = min(least, times[(n, alg, size)])
            out[(n, alg, size)] = least
    return out


def fit(times: dict) -> tuple[dict, dict]:
    """{n: the thresholds (GATHER_BYTES, SMALL_BYTES, DIRECT_BYTES, TWOSHOT_BYTES) that keep
    auto nearest the fastest at world size n} over ``times`` (after
    ``monotone``): the least sum of log(auto / fastest) over that world's
    points, then the least worst ratio; and the ratios they give."""
    times = monotone(times)
    least = fastest(times)
    chosen = {n: _fit_world({k: t for k, t in times.items() if k[0] == n}, n)
              for n in sorted({n for n, _, _ in times})}
    return chosen, ratios(times, chosen, least)


def _fit_world(times: dict, n: int) -> tuple[int, int, int, int]:
    """``fit`` at one world size n (``times``: that world's points only)."""
    sizes = sorted({size for _, _, size in times})
    # A threshold between two measured sizes behaves like the lower one.
    gathers = [0] + [s * (n - 1) for s in sizes]
    smalls = [0] + sizes + [sizes[-1] * 2]
    directs = sizes + [1 << 62]
    # the two-shot, where it was measured (twoshot.py: the board, worlds >= 3)
    measured = any(alg == "twoshot" for _, alg, _ in times)
    twoshots = [0] + sizes + [sizes[-1] * 2] if measured and n >= 3 else [0]
    least = fastest(times)
    chosen, chosen_key = None, None
    for g, s, d, t in itertools.product(gathers, smalls, directs, twoshots):
        if s > d:
            continue
        r = ratios(times, {n: (g, s, d, t)}, least)
        key = (sum(math.log(v) for v in r.values()), max(r.values()))
        if chosen_key is None or key < chosen_key:
            chosen, chosen_key = (g, s, d, t), key
    return chosen
