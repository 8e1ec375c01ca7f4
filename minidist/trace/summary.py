"""Reading a trace back: where each rank's time went.

    minidist trace summary run.json

Per rank, over its window (first span's start to last span's end), with C the
union of its communication spans (any thread) and K the union of its main
thread's other spans (module forwards, pipeline ops, the optimizer step) less
the communication inside them::

    busy = |K u C|      idle = window - busy      comm = |C|
    exposed comm = |C \\ K|      (communication that no compute hid)

A thread that blocks in ``wait()`` on an async collective's Work or on an isend /
irecv handle records a "wait" span of cat "comm" (comm/collectives/work.py, p2p.py),
so a forward that waits for its all-gather counts the wait as communication, not as
its own compute: the overlap that async TP, expert dispatch or FSDP's prefetch
promise is what is left of C outside the waits and blocking calls.

The main thread is not the only one that computes for the rank: an F&B op of DualPipeV
runs its second half on the thread ``TURN_THREAD`` (comm/collectives/interleave.py),
taking turns with the main thread, which is parked meanwhile inside the op's span. A
blocking call on that thread is a wait of the rank's compute, as one on the main thread
is: both are taken out of K (otherwise the F&B span would hide them)::

    K = |main thread's other spans| \\ (comm spans of the main thread and of TURN_THREAD)

Exposed communication by the unit wait it fell in: ZeRO-3 and FSDP record on the main
thread how long a unit still waited for its weights or its gradients (spans of cat
"zero": ``FSDP gather unit k (forward)``, ``FSDP reduce-scatter unit k``, ``ZeRO-3
gather unit k (backward)``); an expert-parallel MoE layer how long it waited for its
dispatched rows (cat "moe": ``MoE dispatch unit k``). With W_f the union of the spans of one family (the name
without its unit: "FSDP gather")::

    exposed by f = |(C \\ K) n W_f|          elsewhere = exposed comm - sum_f exposed by f

so a low-precision gather or a prefetch, which act on the gathers, are read off the
gathers' waits alone, not off the reduce-scatters' or a peer's lateness elsewhere. Per
span as well (``exposed_in_waits``: family -> one figure per span, in order): every rank
waits for the same gathers in the same order, and at each the rank that came last waited
for the gather itself (its wire time, its copies), the others for that rank too.

Per mesh dimension (a span's ``mesh_dim``: the group came from a device mesh), the
bytes each rank sent on it: how much of a composed step each dimension moves.

Two figures that strategies already measure their own way, recomputed from the
trace alone (the tests hold them equal on the same run):

- the pipeline bubble of each step (spans of cat "pipeline" with ``step`` and
  ``group``), as ``measured_bubble`` (parallel/pipeline/executor.py): the largest
  over the stages of (span - busy) / busy;
- DDP's hidden fraction of each synchronised backward (the bucket spans of cat
  "ddp" and the "DDP backward end" instant), as the bucket timeline
  (parallel/data/timeline.py): sum_b |[start_b, end_b] before backward end| / sum_b (end_b - start_b).
"""
from __future__ import annotations

import re
from collections import defaultdict

from minidist.trace.merge import NO_RANK_PID, WORLD_PID

COMM = "comm"
WAITING = ("zero", "moe")      # the spans of how long a unit waited (ZeRO-3, FSDP; MoE dispatch)
TURN_THREAD = "second half"    # the thread that takes turns with the main thread (F&B ops)


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Disjoint, sorted intervals covering the same points."""
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def length(intervals: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


def minus(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points of the union ``a`` not in the union ``b`` (both disjoint and sorted)."""
    out, k = [], 0
    for start, end in a:
        while k < len(b) and b[k][1] <= start:
            k += 1
        j, cursor = k, start
        while j < len(b) and b[j][0] < end:
            if b[j][0] > cursor:
                out.append((cursor, b[j][0]))
            cursor = max(cursor, b[j][1])
            j += 1
        if cursor < end:
            out.append((cursor, end))
    return out


def within(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points of the union ``a`` that are in the union ``b`` (both disjoint and sorted)."""
    return minus(a, minus(a, b))


def waiting_family(name: str) -> str:
    """"FSDP gather unit 2 (backward)" -> "FSDP gather": a unit-wait span's name less its unit."""
    return re.sub(r" unit -?\d+.*$", "", name)


def exposed_in_waits(exposed: list[tuple[float, float]], rows: list[dict]) -> dict:
    """family -> [the part of ``exposed`` inside each of the main thread's unit-wait spans
    of that family, in the order they began] (module docstring), for one rank's spans
    ``rows``. A family's spans follow one another on the main thread, so their sum is the
    family's exposed time."""
    waits = defaultdict(list)
    for e in sorted(rows, key=lambda e: e["ts"]):
        if e["cat"] in WAITING and e["tid"] == 0:
            waits[waiting_family(e["name"])].append(
                length(within(exposed, [(e["ts"], e["ts"] + e["dur"])])))
    return dict(waits)


def summarize(trace: dict) -> dict:
    """The numbers of the summary (times in microseconds): ``ranks`` (pid -> row),
    ``largest`` (the largest communication calls), ``bubbles``, ``ddp_hidden``."""
    events = trace["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    spans = [e for e in events if e.get("ph") == "X"]
    by_pid = defaultdict(list)
    for e in spans:
        by_pid[e["pid"]].append(e)
    turn_threads = {(e["pid"], e["tid"]) for e in events if e.get("ph") == "M"
                    and e.get("name") == "thread_name" and e["args"]["name"] == TURN_THREAD}
    ranks = {}
    for pid, rows in sorted(by_pid.items()):
        comm = union([(e["ts"], e["ts"] + e["dur"]) for e in rows if e["cat"] == COMM])
        waited = union([(e["ts"], e["ts"] + e["dur"]) for e in rows if e["cat"] == COMM
                        and (e["tid"] == 0 or (pid, e["tid"]) in turn_threads)])
        compute = minus(union([(e["ts"], e["ts"] + e["dur"]) for e in rows
                               if e["cat"] != COMM and e["tid"] == 0]), waited)
        start = min(e["ts"] for e in rows)
        window = max(e["ts"] + e["dur"] for e in rows) - start
        busy = length(union(comm + compute))
        exposed = minus(comm, union(compute))
        ranks[pid] = dict(name=names.get(pid, f"pid {pid}"), window=window, busy=busy,
                          idle=window - busy, comm=length(comm), exposed_comm=length(exposed),
                          exposed_in_waits=exposed_in_waits(exposed, rows))
        ranks[pid]["exposed_by"] = {family: sum(each) for family, each in
                                    ranks[pid]["exposed_in_waits"].items()}
    largest = sorted((e for e in spans if e["cat"] == COMM), key=lambda e: -e["dur"])[:5]
    return dict(ranks=ranks, largest=largest, bubbles=pipeline_bubbles(spans),
                ddp_hidden=ddp_hidden_fractions(events), bytes_by_mesh_dim=bytes_by_mesh_dim(spans))


def bytes_by_mesh_dim(spans: list[dict]) -> dict:
    """mesh dimension -> {pid: bytes that rank sent on it}, over the calls on groups of
    more than one rank that a device mesh made."""
    sent: dict = defaultdict(lambda: defaultdict(int))
    for e in spans:
        args = e.get("args", {})
        if e["cat"] == COMM and "mesh_dim" in args and len(args.get("group", [])) > 1:
            sent[args["mesh_dim"]][e["pid"]] += args.get("bytes_sent", 0)
    return {dim: dict(per_rank) for dim, per_rank in sent.items()}


def pipeline_bubbles(spans: list[dict]) -> dict:
    """(group, step) -> the bubble of that pipeline step, as ``measured_bubble``;
    (group, step, world) for the worlds after the first of a run (merge.py)."""
    steps = defaultdict(lambda: defaultdict(list))
    for e in spans:
        if e["cat"] == "pipeline":
            args, world = e["args"], world_of(e["pid"])
            key = (tuple(args["group"]), args["step"]) + ((world,) if world else ())
            steps[key][e["pid"]].append(e)
    bubbles = {}
    for key, stages in steps.items():
        worst = 0.0
        for row in stages.values():
            busy = sum(e["dur"] for e in row)
            span = max(e["ts"] + e["dur"] for e in row) - min(e["ts"] for e in row)
            worst = max(worst, (span - busy) / busy)
        bubbles[key] = worst
    return bubbles


def world_of(pid: int) -> int:
    """Which world of the run a rank's pid belongs to (merge.py numbers them)."""
    return pid // WORLD_PID if pid < NO_RANK_PID else 0


def ddp_hidden_fractions(events: list[dict]) -> dict:
    """(pid, step) -> the share of DDP's bucket communication that ran before
    backward ended, as the bucket timeline's ``hidden_fraction``."""
    ends = {(e["pid"], e["args"]["step"]): e["ts"] for e in events
            if e.get("ph") == "i" and e.get("name") == "DDP backward end"}
    buckets = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "ddp":
            buckets[(e["pid"], e["args"]["step"])].append(e)
    fractions = {}
    for key, end in ends.items():
        rows = buckets.get(key, [])
        total = sum(e["dur"] for e in rows)
        hidden = sum(max(0.0, min(e["ts"] + e["dur"], end) - e["ts"]) for e in rows)
        fractions[key] = hidden / total if total > 0 else 0.0
    return fractions


def _dim(args: dict) -> str:
    return f" ({args['mesh_dim']})" if "mesh_dim" in args else ""


def render(summary: dict) -> str:
    """The summary as text."""
    ms = 1e-3
    lines = [f"{'rank':<34} {'busy ms':>9} {'idle ms':>9} {'comm ms':>9} {'exposed ms':>10}"]
    for row in summary["ranks"].values():
        lines.append(f"{row['name']:<34} {row['busy'] * ms:9.2f} {row['idle'] * ms:9.2f} "
                     f"{row['comm'] * ms:9.2f} {row['exposed_comm'] * ms:10.2f}")
    lines.append("(exposed: communication that no compute on the main thread hid)")
    for row in summary["ranks"].values():
        if row.get("exposed_by"):
            cut = ", ".join(f"{family} {us * ms:.2f}" for family, us in
                            sorted(row["exposed_by"].items()))
            rest = row["exposed_comm"] - sum(row["exposed_by"].values())
            lines.append(f"  {row['name'].split(' (')[0]} exposed ms, by the unit wait it fell "
                         f"in: {cut}, elsewhere {rest * ms:.2f}")
    if summary["largest"]:
        lines.append("largest communication calls:")
        names = {pid: row["name"].split(" (")[0] for pid, row in summary["ranks"].items()}
        for e in summary["largest"]:
            args = e.get("args", {})
            moved = args.get("bytes_sent", 0) + args.get("bytes_recv", 0)
            what = " ".join(str(args[k]) for k in ("algorithm", "dtype") if k in args)
            lines.append(f"  {names.get(e['pid'], e['pid']):<8} {e['name']:<18} "
                         f"{e['dur'] * ms:8.2f} ms  {moved / 1e6:8.3f} MB moved  "
                         f"group {args.get('group')}{_dim(args)}  {what}")
    if summary.get("bytes_by_mesh_dim"):
        lines.append("bytes sent per rank, by mesh dimension (mean and max over its ranks):")
        for dim, per_rank in sorted(summary["bytes_by_mesh_dim"].items()):
            values = list(per_rank.values())
            lines.append(f"  {dim:<14} {sum(values) / len(values):>14,.0f} {max(values):>14,}"
                         f"   ({len(values)} ranks)")
    by_world = sorted(summary["bubbles"].items(), key=lambda kv: (kv[0][2:], kv[0][:2]))
    for (group, step, *world), bubble in by_world:
        where = f"world {world[0]}, " if world else ""
        lines.append(f"pipeline bubble, {where}stages {list(group)}, step {step}: {bubble:.3f} "
                     f"(idle / busy of the worst stage)")
    for (pid, step), fraction in sorted(summary["ddp_hidden"].items()):
        name = summary["ranks"].get(pid, {}).get("name", f"pid {pid}").split(" (")[0]
        lines.append(f"DDP {name}, backward {step}: {fraction:.2f} of the bucket "
                     f"all-reduce time hidden behind backward")
    return "\n".join(lines)
