"""What each overlap of bench_overlap.py acts on, read off a trace: bytes per call kind.

    traffic_of(trace)   kind -> {rank: bytes sent}: every call, each collective, the
                        point-to-point sends, the all-to-alls started async or inside an
                        F&B op, the calls on mesh dimension pp or ep
    targeted(pair, row, base)   the bytes the pair's overlap acts on, the busiest rank's:

        tp            the plain variant's all-gathers and reduce-scatters (async TP's
                      ring sends the same bytes)
        pipeline      DualPipeV's stage sends
        pipeline_ep   DualPipeV's stage sends and the all-to-alls that begin inside its
                      F&B ops (the ones the other half's compute can hide)
        moe           the all-to-alls the overlapped dispatch starts async
        fsdp          the all-gather bytes a low-precision format saves (float32's
                      minus the variant's): it hides nothing, it sends less

    over the link's bandwidth, the wire time the overlap may remove from the exposed
    communication (for fsdp, from the gathers' exposed time: what the units waited for
    their weights, the reduce-scatters and the rest of the step left out; for moe, from
    the dispatches': what each layer waited for its rows, the counts' exchange, the
    combine and a late peer left out). from_trace adds the exposed communication
    ``minidist trace summary`` reads, whole and in the units' waits (which counts the
    blocking calls of an F&B's second half as exposed: the main thread is parked while
    they block, trace/summary.py).
"""
from __future__ import annotations


WAITS = {"fsdp": "FSDP gather",     # pair -> the family of its unit-wait spans: how long
         "moe": "MoE dispatch"}     # an FSDP unit waited for its weights, an MoE layer
                                    # for its dispatched rows (trace/summary.py)


def from_trace(path: str, steps: int, family: str | None = None) -> dict:
    """Per step, read off the trace as ``minidist trace summary`` reads it: ``exposed``
    (seconds), ``waits_exposed`` (seconds: the part of it inside the unit-wait spans of
    ``family``, "FSDP gather unit k" or "MoE dispatch unit k") and ``sent`` / ``gathered``
    (bytes), each the largest over the ranks, ``waits_own`` (seconds: the waits' exposed
    time without the waits for a late peer, ``own_waits``), and ``traffic``: kind ->
    {rank: bytes it sent per step} for the kinds an overlap acts on (``traffic_of``)."""
    from minidist.trace import load
    from minidist.trace.summary import summarize
    trace = load(path)
    ranks = summarize(trace)["ranks"].values()
    exposed = max(row["exposed_comm"] for row in ranks)
    waits = max(row["exposed_by"].get(family, 0) for row in ranks)
    traffic = {k: {pid: n / steps for pid, n in v.items()} for k, v in traffic_of(trace).items()}
    return dict(exposed=exposed * 1e-6 / steps, waits_exposed=waits * 1e-6 / steps,
                waits_own=own_waits(ranks, family) * 1e-6 / steps,
                sent=max(traffic["all"].values(), default=0),
                gathered=max(traffic["gathered"].values(), default=0), traffic=traffic)


def own_waits(ranks, family: str | None) -> float:
    """The waits' own exposed time (microseconds): at each wait of ``family`` (the k-th
    span of it on every rank: each rank waits for the same FSDP gathers, or MoE
    dispatches, in the same order) the least over the ranks, summed. The rank that came
    last to a collective waited for it alone (wire, copies); the others waited for that
    rank as well, which is its compute or the scheduler, not the collective's bytes."""
    per_rank = [row["exposed_in_waits"].get(family, []) for row in ranks]
    return sum(min(each) for each in zip(*per_rank)) if per_rank else 0.0


KINDS = ("all", "gathered", "all_gather", "reduce_scatter", "all_to_all", "sends",
         "a2a_async", "a2a_in_fb", "pp", "ep")


def traffic_of(trace: dict) -> dict:
    """kind -> {rank (pid): bytes sent} over the trace's communication spans (each
    call's ``bytes_sent``; ``gathered``: the all-gathers' ``bytes_recv``):

        all             every call
        all_gather, reduce_scatter, all_to_all   the calls of that collective
        sends           point-to-point isend / send (the pipeline's stage messages)
        a2a_async       all-to-alls that ran on a thread other than the main one:
                        started with ``async_op=True`` (overlapped dispatch, F&B's turns)
        a2a_in_fb       all-to-alls that began inside one of the rank's F&B ops (a
                        pipeline span of kind "F&B")
        pp, ep          the calls on that device-mesh dimension (the span's mesh_dim)"""
    from minidist.trace.summary import COMM
    spans = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    fb = [e for e in spans if e["cat"] == "pipeline" and e["args"].get("kind") == "F&B"]
    out: dict = {k: {} for k in KINDS}

    def add(kind, pid, n):
        out[kind][pid] = out[kind].get(pid, 0) + n
    for e in spans:
        if e["cat"] != COMM:
            continue
        args, pid, name = e.get("args", {}), e["pid"], e["name"]
        n = args.get("bytes_sent", 0)
        add("all", pid, n)
        if name.startswith("all_gather"):
            add("all_gather", pid, n)
            add("gathered", pid, args.get("bytes_recv", 0))
        elif name.startswith("reduce_scatter"):
            add("reduce_scatter", pid, n)
        elif name.startswith("all_to_all"):
            add("all_to_all", pid, n)
            if e["tid"] != 0:
                add("a2a_async", pid, n)
            if any(f["pid"] == pid and f["ts"] <= e["ts"] < f["ts"] + f["dur"] for f in fb):
                add("a2a_in_fb", pid, n)
        elif name in ("isend", "send"):
            add("sends", pid, n)
        if args.get("mesh_dim") in ("pp", "ep"):
            add(args["mesh_dim"], pid, n)
    return out


def most(*terms: tuple[int, dict]) -> float:
    """max over ranks of sum(sign * bytes[rank]) for (sign, {rank: bytes}) terms."""
    ranks = {pid for _, per_rank in terms for pid in per_rank}
    return max((sum(sign * per_rank.get(pid, 0) for sign, per_rank in terms) for pid in ranks),
               default=0.0)


def targeted(pair: str, row: dict, base: dict) -> tuple[float, str]:
    """(bytes per step, what they are): the traffic the pair's overlap acts on, the
    largest over the ranks (module docstring)."""
    t, b = row["traffic"], base["traffic"]
    if pair == "tp":
        return (most((1, b["all_gather"]), (1, b["reduce_scatter"])),
                "the plain variant's TP all-gathers and reduce-scatters")
    if pair == "fsdp":
        return most((1, b["all_gather"]), (-1, t["all_gather"])), "the all-gather bytes saved"
    if pair == "moe":
        return most((1, t["a2a_async"])), "the all-to-alls it starts async"
    if pair == "pipeline_ep":
        return (most((1, t["sends"]), (1, t["a2a_in_fb"])),
                "its stage sends (pp) and the all-to-alls inside its F&B ops (ep)")
    return most((1, t["sends"])), "its stage sends"
