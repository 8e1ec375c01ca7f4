"""The bars a small-message collective must clear, checked on one run's numbers.

bench_collectives.py measures, per world size, minidist's all-reduce (``auto``
and every algorithm it chooses from), MPICH's, torch's gloo, and the same for
all-to-all; ``verdicts`` says of each bar whether it holds in that run:

    1 KiB all-reduce         time <= 1.5x MPICH's
    all-reduce busbw         >= 1.0x MPICH's from 16 KiB, >= 1.5x from 1 MiB (auto)
    auto                     within 5% of the fastest algorithm at every size
    all-to-all busbw         >= 0.5x MPICH's below 256 KiB, >= 1.0x from 256 KiB
    gloo                     minidist faster at every size (all-reduce, all-to-all)

``best`` is the table's dict: "<side>:<size>" -> seconds, with sides auto, the
algorithms, mpi, gloo (all-reduce) and minidist, mpi, gloo (all-to-all). A bar
whose reference was not measured says so instead of holding.
"""
from __future__ import annotations

from _collective_bench import human

KIB, MIB = 1 << 10, 1 << 20


def _ratio_bar(title: str, ratios: dict, need) -> str:
    """One line: HOLDS, or FAILS with the sizes that miss; ``ratios``:
    {size: measured ratio}, ``need(size)``: the least ratio that passes."""
    if not ratios:
        return f"  {title}: not measured"
    misses = [f"{human(s)} {r:.2f}x" for s, r in sorted(ratios.items()) if r < need(s)]
    worst = min(ratios.values())
    if misses:
        return f"  {title}: FAILS at {', '.join(misses)}"
    return f"  {title}: holds (least {worst:.2f}x over {len(ratios)} sizes)"


def all_reduce_bars(n: int, sizes: list[int], best: dict, algorithms: list[str],
                    latency_size: int = KIB) -> list[str]:
    """The all-reduce bars (busbw over MPICH's is time over time: the same bytes)."""
    lines = []
    auto, mpi = best.get(f"auto:{latency_size}"), best.get(f"mpi:{latency_size}")
    if auto and mpi:
        ok = auto <= 1.5 * mpi
        lines.append(f"  1 KiB all-reduce <= 1.5x MPICH's time: {'holds' if ok else 'FAILS'} "
                     f"({auto * 1e6:.1f} us = {auto / mpi:.2f}x MPICH's {mpi * 1e6:.1f} us)")
    else:
        lines.append("  1 KiB all-reduce <= 1.5x MPICH's time: not measured")
    speedup = {s: best[f"mpi:{s}"] / best[f"auto:{s}"] for s in sizes
               if s >= 16 * KIB and f"mpi:{s}" in best and f"auto:{s}" in best}
    lines.append(_ratio_bar("all-reduce busbw (auto) >= 1.0x MPICH's from 16 KiB, "
                            ">= 1.5x from 1 MiB", speedup,
                            lambda s: 1.5 if s >= MIB else 1.0))
    others = [a for a in algorithms if a != "auto"]
    near = {}
    for s in sizes:
        measured = [best[f"{a}:{s}"] for a in others if f"{a}:{s}" in best]
        if measured and f"auto:{s}" in best:
            near[s] = min(measured) / best[f"auto:{s}"]      # fastest / auto: <= 1
    lines.append(_ratio_bar("auto within 5% of the fastest algorithm (fastest/auto >= 0.95)",
                            near, lambda s: 1 / 1.05))
    return lines


def all_to_all_bars(n: int, sizes: list[int], best: dict) -> list[str]:
    ratios = {s: best[f"mpi:{s}"] / best[f"minidist:{s}"] for s in sizes
              if f"mpi:{s}" in best and f"minidist:{s}" in best}
    return [_ratio_bar("all-to-all busbw >= 0.5x MPICH's below 256 KiB, >= 1.0x from 256 KiB",
                       ratios, lambda s: 1.0 if s >= 256 * KIB else 0.5)]


def gloo_bars(sizes: list[int], reduce_best: dict, a2a_best: dict) -> list[str]:
    ratios = {}
    for what, best, mine in (("all-reduce", reduce_best, "auto"),
                             ("all-to-all", a2a_best, "minidist")):
        for s in sizes:
            if f"gloo:{s}" in best and f"{mine}:{s}" in best:
                ratios[(what, s)] = best[f"gloo:{s}"] / best[f"{mine}:{s}"]
    if not ratios:
        return ["  minidist faster than gloo at every size: not measured (--peer none, or "
                "no torch)"]
    misses = [f"{what} {human(s)} {r:.2f}x" for (what, s), r in sorted(ratios.items())
              if r <= 1.0]
    if misses:
        return [f"  minidist faster than gloo at every size: FAILS at {', '.join(misses)}"]
    return [f"  minidist faster than gloo at every size: holds (least {min(ratios.values()):.1f}x"
            f" over {len(ratios)} points)"]


def verdicts(n: int, sizes: list[int], reduce_best: dict, algorithms: list[str],
             a2a_best: dict) -> str:
    """Every bar of world ``n``, one line each."""
    lines = [f"world {n}: the bars, in this run"]
    lines += all_reduce_bars(n, sizes, reduce_best, algorithms)
    lines += all_to_all_bars(n, sizes, a2a_best)
    lines += gloo_bars(sizes, reduce_best, a2a_best)
    return "\n".join(lines)
