"""bench_overlap.py's report: each pair's table and, per overlap, its bars.

    removed  = exposed(plain) - exposed(overlapped)          (from the traces; fsdp, moe:
                       the gathers' / dispatches' waits alone, the least rank's at each)
    allowed  = min(wire time of the traffic it acts on, exposed(plain))
    target:    removed >= allowed / 2
    room     = step(plain) - CPU floor(overlapped);   saved = step(plain) - step(overlapped)

beside the old whole-wire figure min(every call's wire time, exposed(plain)), and for
the gathers and the dispatch the link speed below which the extra CPU time pays
(break_even). Module docstring of bench_overlap.py: what each figure means.
"""
from __future__ import annotations

from _overlap_traffic import WAITS, most, targeted


def report(pair: str, variants: list, rows: dict, gbps: float) -> list[str]:
    """The pair's table, ratios against its plain (first) variant, and its verdicts;
    returns each overlapped variant's line for the closing summary."""
    plain, *overlapped = variants
    base = rows[plain]
    print(f"  {'(x: / ' + plain + ')':<16} {'step ms':>8} {'x':>6} {'exposed ms':>10} {'x':>6} "
          f"{'CPU ms':>7} {'MB sent':>8} {'wire ms':>8}")
    for v, row in rows.items():
        wire = row["sent"] / (gbps * 1e9)
        exposed_ratio = row["exposed"] / base["exposed"] if base["exposed"] > 0 else float("nan")
        print(f"  {v:<16} {1e3 * row['step']:8.1f} {row['step'] / base['step']:6.3f} "
              f"{1e3 * row['exposed']:10.1f} {exposed_ratio:6.3f} {1e3 * row['cpu']:7.1f} "
              f"{row['sent'] / 1e6:8.3f} {1e3 * wire:8.1f}")
    if pair == "fsdp":       # the gathers' bytes: what the low-precision formats change
        print("  all-gathered per step and rank: " + ", ".join(
            f"{v} {row['gathered'] / 1e6:.3f} MB ({row['gathered'] / base['gathered']:.2f} x)"
            for v, row in rows.items()))
    if pair in WAITED:       # the units' own waits: what the bar reads
        many, one = WAITED[pair]
        print(f"  exposed in the {many} waits ({WAITS[pair]} unit k spans), per step, median "
              f"over the rounds, at each {one} the least over the ranks (the largest rank's "
              f"waits): " + ", ".join(f"{v} {1e3 * row['waits_own']:.2f} ms "
                                      f"({1e3 * row['waits_exposed']:.2f})"
                                      for v, row in rows.items()))
    if pair == "pipeline_ep":   # which mesh dimension carries what
        print("  MB sent per step (largest rank) on pp / ep: " + ", ".join(
            f"{v} {most((1, row['traffic']['pp'])) / 1e6:.3f} / "
            f"{most((1, row['traffic']['ep'])) / 1e6:.3f}" for v, row in rows.items()))
    bars = []
    for v in overlapped:
        bars.append(f"{pair + ':':<13}"
                    + verdict(v, plain, rows[v], base, gbps, targeted(pair, rows[v], base),
                              "waits_own" if pair in WAITED else "exposed", WAITED.get(pair)))
        if pair in ("fsdp", "moe"):
            break_even(v, rows[v], base, gbps)
    return bars


def break_even(v: str, row: dict, base: dict, gbps: float) -> None:
    """Where the overlap pays on these cores: the extra CPU time a step spends on it
    (the rounding of the low-precision gathers, the second thread's bookkeeping)
    against the wire time it saves or hides; the link speed at which they are equal."""
    extra_cpu = row["cpu"] - base["cpu"]
    saved_bytes = base["sent"] - row["sent"]
    if saved_bytes > 0:
        wire_saved = saved_bytes / (gbps * 1e9)
        what = f"the {1e3 * wire_saved:.1f} ms of wire its {saved_bytes / 1e6:.3f} MB fewer take"
    else:
        wire_saved = base["exposed"] - row["exposed"]
        saved_bytes = wire_saved * gbps * 1e9
        what = f"the {1e3 * wire_saved:.1f} ms of exposed communication it hid"
    pad = " " * (len(v) + 4)
    if wire_saved <= 0:
        print(f"  {pad}CPU {1e3 * extra_cpu:+.1f} ms per step and nothing saved or hidden "
              f"on the wire in this run")
    elif extra_cpu <= 0:
        print(f"  {pad}CPU {1e3 * extra_cpu:+.1f} ms per step against {what}: pays at any "
              f"link speed")
    else:
        print(f"  {pad}CPU {1e3 * extra_cpu:+.1f} ms per step against {what}: pays on a link "
              f"slower than {saved_bytes / extra_cpu / 1e9:.2f} GB/s (--link-gbps)")


WAITED = {"fsdp": ("gathers'", "gather"),       # pair -> whose own waits its bar reads
          "moe": ("dispatches'", "dispatch")}


def verdict(v: str, plain: str, row: dict, base: dict, gbps: float,
            target: tuple[float, str], key: str = "exposed",
            waited: tuple[str, str] | None = None) -> str:
    """Three lines: the exposed communication removed against what the wire allows this
    overlap to hide (the wire time of the traffic it acts on, ``target``, no more than
    the plain variant exposed), the old whole-wire figure beside it, and the step time
    saved against the CPU floor. ``key``: the exposed figure the bar reads ("exposed",
    the whole step's, or "waits_own", the FSDP gathers' or the MoE dispatches' own waits,
    ``waited`` naming them, with the largest rank's waits and the whole step's beside
    it). Returns the one-line form for the closing summary."""
    removed = base[key] - row[key]
    acted, what = target
    allowed = min(acted / (gbps * 1e9), base[key])
    whole = min(base["sent"] / (gbps * 1e9), base[key])
    pad = " " * (len(v) + 6)
    ok = allowed > 0 and removed >= 0.5 * allowed
    met = (f"target >= half {'met' if ok else 'NOT met'}" if allowed > 0
           else "nothing it acts on to hide")
    d = 1 if key == "exposed" else 2       # the waits' bar is a few tenths of a ms
    name = "exposed" if key == "exposed" else f"{waited[0]} exposed"
    step = ("" if key == "exposed" else f" (largest rank's {waited[1]} waits "
            f"{1e3 * base['waits_exposed']:.1f} -> {1e3 * row['waits_exposed']:.1f} ms, "
            f"whole step {1e3 * base['exposed']:.1f} -> {1e3 * row['exposed']:.1f} ms)")
    print(f"  {v} vs {plain}: {name} {1e3 * base[key]:.{d}f} -> {1e3 * row[key]:.{d}f} ms"
          f"{step}, removed {1e3 * removed:.{d}f} ms of the {1e3 * allowed:.{d}f} ms the wire "
          f"allows hiding: {met}")
    print(f"{pad}(it acts on {what}: {acted / 1e6:.3f} MB, "
          f"{1e3 * acted / (gbps * 1e9):.{d}f} ms on the wire;")
    print(f"{pad} the old figure, every call's wire time up to the plain exposed: "
          f"{1e3 * whole:.1f} ms" + (f", removed {removed / whole:.2f} x it)" if whole > 0
                                     else ")"))
    if base["exposed"] > 3 * base["sent"] / (gbps * 1e9):    # then what moves is waiting
        print(f"{pad}(the plain variant's exposed time is over 3 x its wire time: it waits on "
              f"its peer's compute and the scheduler, which the verdict cannot tell from the "
              f"wire)")
    room = base["step"] - row["floor"]         # the plain step down to the CPU floor
    saved = base["step"] - row["step"]
    shared = ": all ranks' CPU over the cores" if row["floor"] > row["cpu"] else ""
    line = (f"{pad}step saved {1e3 * saved:.1f} ms of the {1e3 * room:.1f} ms above the CPU "
            f"floor ({1e3 * row['floor']:.1f} ms{shared})")
    summary = (f"{v + ' vs ' + plain + ':':<30} {name} {1e3 * base[key]:.{d}f} -> "
               f"{1e3 * row[key]:.{d}f} ms{step}, removed {1e3 * removed:.{d}f} of "
               f"{1e3 * allowed:.{d}f} ms allowed ({met}; whole wire {1e3 * whole:.1f} ms); "
               f"step {1e3 * base['step']:.1f} -> {1e3 * row['step']:.1f} ms, CPU floor "
               f"{1e3 * row['floor']:.1f} ms")
    if room <= 0:
        print(line + ": no room on these cores (the floor is at or above the plain step)")
        return summary
    print(line + f": {saved / room:.2f} of it")
    return summary
