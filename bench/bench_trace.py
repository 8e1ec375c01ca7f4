"""What tracing costs: a DDP GPT training step with the recorder on, off, and without its hooks.

    python bench/bench_trace.py                          # on vs off, world 2
    python bench/bench_trace.py --base /tmp/base         # also off vs a checkout without hooks

A small GPT is trained with DistributedDataParallel (overlapped buckets) on
``--world`` ranks. Each round times ``--steps`` steps with tracing off and
``--steps`` with it on (every rank records its collectives, messages, module
forwards, buckets and optimizer step into a part file), alternating, so a burst
of load from elsewhere hits both; the medians over rounds give

    on / off    the price of recording (target <= 1.05)

and, least moved by load from elsewhere, the CPU time of steps that alternate
one by one between on and off (one recorder, switched on for every other step).

With ``--base DIR`` (a checkout of the code before the trace hooks, e.g.
``git worktree add /tmp/base <commit>``) the same "off" measurement runs in a fresh
process on that code and on this one, alternately, ``--rounds`` times each:

    off / base  the price of the hooks when nothing is recorded: one ``if`` per
                event site (target <= 1.01)

Times are the slowest rank's per step, wall clock and CPU (every thread of the
rank: the communication thread and the trace's writer included). On a loaded
machine wall-clock ratios move by tens of per cent from round to round (the
per-round ratios are printed); the CPU time moves less. A bound that no load
moves: the event sites a step runs (each leaves at least one event when
recording) times what one ``if trace.active is not None`` costs.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

from _args import positive_int

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")   # before NumPy loads, here and in the spawned ranks


def gpt_steps(layers: int, width: int, batch: int, steps: int, rounds: int, traced: bool,
              folder: str) -> dict:
    """On every rank: per round, the median step time off (and on, if ``traced``)."""
    import time

    import minidist.distributed as dist
    from minidist.backend import Generator, synchronize
    from minidist.nn import GPT, GPTConfig
    from minidist.optim import AdamW
    from minidist.parallel import DistributedDataParallel

    cfg = GPTConfig(block_size=64, vocab_size=256, n_layer=layers, n_head=4, n_embd=width,
                    dtype="float32")
    model = GPT(cfg)
    ddp = DistributedDataParallel(model, bucket_cap_mb=1.0)
    opt = AdamW(model.parameters(), lr=1e-3)
    gen = Generator(10 + dist.get_rank())
    idx = gen.integers(0, cfg.vocab_size, (batch, cfg.block_size))
    tgt = gen.integers(0, cfg.vocab_size, (batch, cfg.block_size))

    def one_step() -> None:
        _, loss = ddp(idx, tgt)
        loss.backward()
        opt.step()
        opt.zero_grad()
        synchronize()

    def step_times(n: int, key: str) -> None:
        """Median wall and CPU seconds of ``n`` steps, into out[key], out[key + "_cpu"]."""
        wall, cpu = [], []
        for _ in range(n):
            dist.barrier()
            t, c = time.perf_counter(), time.process_time()
            one_step()
            wall.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)      # every thread of this rank
        out[key].append(statistics.median(wall))
        out[key + "_cpu"].append(statistics.median(cpu))

    out = {"off": [], "on": [], "off_cpu": [], "on_cpu": [], "events": 0, "paired": []}
    step_times(2, "off")                             # warm-up
    out.update(off=[], off_cpu=[])
    for k in range(rounds):
        step_times(steps, "off")
        if traced:
            from minidist.trace import recorder
            rec = recorder.start(os.path.join(folder, f"bench{k}.json"))
            step_times(steps, "on")
            recorder.stop()
            from minidist.trace.merge import read_part
            out["events"] += len(read_part(rec.part)[0]) / (rounds * steps)   # per step
    if traced:   # one recorder, switched on and off from one step to the next
        from minidist.trace import recorder
        rec = recorder.start(os.path.join(folder, "paired.json"))
        for _ in range(rounds * steps):
            cpu = []
            for on in (False, True):
                recorder.active = rec if on else None
                dist.barrier()
                c = time.process_time()
                one_step()
                cpu.append(time.process_time() - c)
            out["paired"].append(cpu[1] / cpu[0])
        recorder.active = rec
        recorder.stop()
    return out


def branch_seconds() -> float:
    """What one event site costs while nothing is recorded: ``trace.active is not None``."""
    import timeit
    from minidist.trace import recorder as trace
    n = 1_000_000
    check = min(timeit.repeat("trace.active is not None", globals={"trace": trace},
                              number=n, repeat=5)) / n
    empty = min(timeit.repeat("pass", number=n, repeat=5)) / n
    return max(check - empty, 0.0)


def worst(ranks: list[dict], key: str) -> list[float]:
    """Per round, the slowest rank's median step."""
    return [max(r[key][k] for r in ranks) for k in range(len(ranks[0][key]))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", type=positive_int, default=2)
    ap.add_argument("--layers", type=positive_int, default=4)
    ap.add_argument("--width", type=positive_int, default=128)
    ap.add_argument("--batch", type=positive_int, default=8, help="sequences per rank")
    ap.add_argument("--steps", type=positive_int, default=5, help="timed steps per measurement")
    ap.add_argument("--rounds", type=positive_int, default=5)
    ap.add_argument("--base", default=None, metavar="DIR",
                    help="a checkout without the trace hooks: also compare 'off' against it")
    ap.add_argument("--off-only", action="store_true", help=argparse.SUPPRESS)  # one base run
    args = ap.parse_args()
    from minidist.comm import World

    if args.off_only:   # one measurement in this process's code (maybe the base's)
        with World(args.world) as world:
            ranks = world.run(gpt_steps, args.layers, args.width, args.batch, args.steps,
                              1, False, "")
        print(f"off_s {max(r['off'][0] for r in ranks)!r} "
              f"{max(r['off_cpu'][0] for r in ranks)!r}")
        return 0

    print(f"DDP GPT step: {args.layers} layers, C = {args.width}, T = 64, batch {args.batch} "
          f"per rank, world {args.world}; median of {args.rounds} rounds x {args.steps} steps")
    with tempfile.TemporaryDirectory() as folder, World(args.world) as world:
        ranks = world.run(gpt_steps, args.layers, args.width, args.batch, args.steps,
                          args.rounds, True, folder)
    off = statistics.median(worst(ranks, "off"))
    on = statistics.median(worst(ranks, "on"))
    off_cpu = statistics.median(worst(ranks, "off_cpu"))
    on_cpu = statistics.median(worst(ranks, "on_cpu"))
    pairs = " ".join(f"{n / f:.3f}" for n, f in zip(worst(ranks, "on"), worst(ranks, "off")))
    print(f"  tracing off  {1e3 * off:8.2f} ms per step")
    print(f"  tracing on   {1e3 * on:8.2f} ms per step   on / off = {on / off:.3f}  "
          f"(target <= 1.05)")
    print(f"  on / off per round: {pairs}")
    print(f"  CPU per step (all threads of the busiest rank): off {1e3 * off_cpu:.2f} ms, "
          f"on {1e3 * on_cpu:.2f} ms   on / off = {on_cpu / off_cpu:.3f}")
    # Off, each event site costs one branch; every site that runs while recording
    # leaves at least one event, so events per step bound the branches per step.
    paired = max(statistics.median(r["paired"]) for r in ranks)
    print(f"  CPU on / off, paired steps (on and off alternate step by step, one recorder): "
          f"{paired:.3f}  (the busiest rank's median over {len(ranks[0]['paired'])} pairs)")
    events = max(r["events"] for r in ranks)
    branch = branch_seconds()
    print(f"  off, the hooks' cost from their count: <= {events:.0f} event sites per step x "
          f"{1e9 * branch:.0f} ns per branch = {1e6 * events * branch:.1f} us per step = "
          f"{events * branch / off:.5f} of the step  (target <= 0.01)")
    if args.base:
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        times: dict[str, list[float]] = {"base": [], "off": []}
        cpus: dict[str, list[float]] = {"base": [], "off": []}
        for _ in range(args.rounds):
            for name, tree in (("base", args.base), ("off", here)):
                wall, cpu = _run_off(tree, args)
                times[name].append(wall)
                cpus[name].append(cpu)
        base, mine = statistics.median(times["base"]), statistics.median(times["off"])
        print(f"  without hooks ({args.base})  {1e3 * base:8.2f} ms per step")
        print(f"  with hooks, off                {1e3 * mine:8.2f} ms per step   "
              f"off / base = {mine / base:.3f}  (target <= 1.01)")
        # the noise: the same code measured twice differs by this much from round to round
        spread = [b2 / b1 for b1, b2 in zip(times["base"], times["base"][1:])] or [1.0]
        print(f"  noise: base / previous base run, per round: {min(spread):.3f} .. "
              f"{max(spread):.3f}; off / base per round: "
              + " ".join(f"{o / b:.3f}" for o, b in zip(times["off"], times["base"])))
        base_cpu, mine_cpu = statistics.median(cpus["base"]), statistics.median(cpus["off"])
        print(f"  CPU per step: without hooks {1e3 * base_cpu:.2f} ms, with hooks off "
              f"{1e3 * mine_cpu:.2f} ms   off / base = {mine_cpu / base_cpu:.3f}")
    return 0


def _run_off(tree: str, args: argparse.Namespace) -> tuple[float, float]:
    """One 'off' measurement (wall, CPU seconds per step) in a fresh process on the
    code of ``tree``."""
    env = dict(os.environ, PYTHONPATH=tree)
    cmd = [sys.executable, os.path.abspath(__file__), "--off-only", "--world", str(args.world),
           "--layers", str(args.layers), "--width", str(args.width), "--batch",
           str(args.batch), "--steps", str(args.steps)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"the run in {tree} failed:\n{out.stderr}")
    wall, cpu = out.stdout.split("off_s ")[-1].split()
    return float(wall), float(cpu)


if __name__ == "__main__":
    sys.exit(main())
