"""Demo 28: one step with and without an overlap of model parallelism, traced, on one clock.

Two ranks on an emulated link (1 GB/s: bytes on the wire while the CPU is free) run one
traced training step of the plain variant, then one of the overlapped one, of a pair
from bench/bench_overlap.py (whose builders this demo borrows):

    --pair tp        plain sequence parallelism vs async TP (the gathers and
                     reduce-scatters as rings beside their matmuls)
    --pair pipeline  1F1B vs DualPipeV on an MoE Llama over 2 stages
    --pair moe       plain expert dispatch vs overlapped (the shared expert computes
                     while the all-to-all travels)
    --pair fsdp      float32 gathers vs bfloat16 gathers (half the bytes)

    python demos/28_overlap.py --pair tp --figure /tmp/tp.png

It prints, from each trace, what ``minidist trace summary`` prints per rank: the
communication time, the part of it no compute hid (exposed), and the part hidden. The
figure puts both steps on one time axis, plain above, overlapped below (red:
communication, a blocking wait included; blue: module forwards; pipeline ops green /
orange / purple). The check: both traces are valid Chrome traces (trace/check.py) and
the overlapped variant hides some communication behind compute (for the pipeline, whose
sends travel as no span: runs F&B ops; for moe: runs its all-to-alls on the
communication thread; for fsdp: gathers half the bytes). On a loaded
machine the times move; the check does not compare them.
"""
import argparse
import os
import pathlib
import sys
import tempfile

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")   # before NumPy loads, here and in the spawned ranks
from _args import positive, positive_int  # noqa: E402
from _launched import one_process_only  # noqa: E402
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "bench"))
import bench_overlap  # noqa: E402  (the pairs' builders: one copy, the benchmark's)

PAIRS = {"tp": ("plain SP", "async TP"), "pipeline": ("1F1B", "DualPipeV"),
         "moe": ("plain dispatch", "overlapped"), "fsdp": ("float32", "bfloat16")}

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--pair", choices=sorted(PAIRS), default="tp")
parser.add_argument("--layers", type=positive_int, default=2)
parser.add_argument("--width", type=positive_int, default=64, help="hidden size")
parser.add_argument("--seq", type=positive_int, default=64, help="tokens a sequence")
parser.add_argument("--batch", type=positive_int, default=4, help="sequences per rank")
parser.add_argument("--microbatches", type=positive_int, default=4, help="pipeline: m >= 4")
parser.add_argument("--link-gbps", type=positive, default=1.0)
parser.add_argument("--figure", metavar="PATH", help="save both steps' timelines as a PNG")
args = parser.parse_args()
args.steps, args.trace_steps, args.spin_s = 1, 1, 0.0


def traced(world, variant: str, folder: str) -> dict:
    """One traced step of ``variant`` (after an untimed warm-up): the merged trace."""
    from minidist.trace import load
    path = os.path.join(folder, variant.replace(" ", "_") + ".json")
    world.run(bench_overlap.time_variant, args.pair, variant, args, path)
    return load(path)


def hidden_and_exposed(trace: dict) -> list[tuple[str, float, float, float]]:
    """Per rank: (name, communication, exposed, hidden) in ms."""
    from minidist.trace.summary import summarize
    rows = summarize(trace)["ranks"].values()
    return [(r["name"].split(" (")[0], r["comm"] / 1e3, r["exposed_comm"] / 1e3,
             (r["comm"] - r["exposed_comm"]) / 1e3) for r in rows]


def on_one_clock(plain: dict, fused: dict, names: tuple) -> dict:
    """Both traces in one, each starting at 0, the ranks named after their variant."""
    events = []
    for k, (trace, name) in enumerate(zip((plain, fused), names)):
        start = min(e["ts"] for e in trace["traceEvents"] if "ts" in e)
        for e in trace["traceEvents"]:
            e = dict(e, pid=e["pid"] + 1000 * k)
            if "ts" in e:
                e["ts"] -= start
            if e.get("ph") in ("s", "f"):
                e["id"] = f"{k}-{e['id']}"
            if e.get("ph") == "M" and e.get("name") == "process_name":
                e["args"] = {"name": f"{name}, {e['args']['name'].split(' (')[0]}"}
            events.append(e)
    return {"traceEvents": events}


def main() -> int:
    one_process_only("it starts a world of 2 ranks on an emulated link of its own")
    from minidist.comm import World
    from minidist.trace.check import check
    plain_name, fused_name = PAIRS[args.pair]
    with tempfile.TemporaryDirectory() as folder, World(2, link_gbps=args.link_gbps) as world:
        plain, fused = (traced(world, v, folder) for v in (plain_name, fused_name))
    print(f"{args.pair}: one step each on a {args.link_gbps:g} GB/s link "
          f"(ms, from the traces)")
    print(f"  {'variant':<16} {'rank':<8} {'comm':>8} {'exposed':>8} {'hidden':>8}")
    hidden = {}
    for name, trace in ((plain_name, plain), (fused_name, fused)):
        for rank, comm, exposed, hid in hidden_and_exposed(trace):
            print(f"  {name:<16} {rank:<8} {comm:8.1f} {exposed:8.1f} {hid:8.1f}")
            hidden[name] = hidden.get(name, 0.0) + hid
    valid = not check(plain) and not check(fused)
    if args.pair == "fsdp":
        ratio = gathered(fused) / gathered(plain)
        ok = valid and abs(ratio - 0.5) < 0.01
        print(f"check: traces valid {valid}; bfloat16 gathers {ratio:.3f} x float32's bytes "
              f"(0.5)  {'ok' if ok else 'FAILED'}")
    elif args.pair == "pipeline":   # its sends travel during the F&B ops, as no span
        pairs = sum(1 for e in fused["traceEvents"] if e.get("cat") == "pipeline"
                    and " & B" in e["name"])
        ok = valid and pairs > 0
        print(f"check: traces valid {valid}; DualPipeV ran {pairs} F&B ops, a forward and "
              f"a backward in one (> 0)  {'ok' if ok else 'FAILED'}")
    elif args.pair == "moe":        # how much it hid depends on when the thread ran
        background = sum(1 for e in fused["traceEvents"] if e.get("ph") == "X"
                         and e["name"] == "all_to_all_single" and e["tid"] != 0)
        ok = valid and background > 0
        print(f"check: traces valid {valid}; {background} all-to-alls ran on the "
              f"communication thread, beside the shared expert (> 0)  {'ok' if ok else 'FAILED'}")
    else:
        ok = valid and hidden[fused_name] > 0
        print(f"check: traces valid {valid}; {fused_name} hides {hidden[fused_name]:.1f} ms "
              f"of communication behind compute (> 0)  {'ok' if ok else 'FAILED'}")
    if args.figure:
        from minidist.trace.plot import plot
        plot(on_one_clock(plain, fused, PAIRS[args.pair]), args.figure,
             title=f"{plain_name} (above) and {fused_name} (below), one step each, "
                   f"{args.link_gbps:g} GB/s link")
        print(f"figure: {args.figure}")
    return 0 if ok else 1


def gathered(trace: dict) -> float:
    """Bytes the all-gathers received, over every rank."""
    return sum(e["args"].get("bytes_recv", 0) for e in trace["traceEvents"]
               if e.get("ph") == "X" and e["name"].startswith("all_gather"))


if __name__ == "__main__":
    sys.exit(main())
