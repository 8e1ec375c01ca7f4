"""What tracing costs: a DDP GPT training step with the recorder on, off, and without its hooks.

    python bench/bench_trace.py                          # on vs off, world 2
    python bench/bench_trace.py --base /tmp/base         # also off vs a checkout without hooks

A small GPT is trained with DistributedDataParallel (overlapped buckets) on
``--world`` ranks. Each round times ``--steps`` steps with tracing off and
``--steps`` with it on (every rank records its collectives, messages, module
forwards, buckets and optimizer step into a part file), alternating, so a burst
of load from elsewhere hits both; the medians over rounds give

    on / off    the price of recording (target <= 1.05)

With ``--base DIR`` (a checkout of the code before the trace hooks, e.g.
``git worktree add /tmp/base <commit>``) the same "off" measurement runs in a fresh
process on that code and on this one, alternately, ``--rounds`` times each:

    off / base  the price of the hooks when nothing is recorded: one ``if`` per
                event site (target <= 1.01)

Times are the slowest rank's per step. On a loaded machine the ratios move by a few
per cent from run to run: compare the figures of one invocation only.
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

    def step_times(n: int) -> list[float]:
        times = []
        for _ in range(n):
            dist.barrier()
            t = time.perf_counter()
            _, loss = ddp(idx, tgt)
            loss.backward()
            opt.step()
            opt.zero_grad()
            synchronize()
            times.append(time.perf_counter() - t)
        return times

    step_times(2)                                   # warm-up
    out = {"off": [], "on": []}
    for k in range(rounds):
        out["off"].append(statistics.median(step_times(steps)))
        if traced:
            from minidist.trace import recorder
            recorder.start(os.path.join(folder, f"bench{k}.json"))
            out["on"].append(statistics.median(step_times(steps)))
            recorder.stop()
    return out


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
        print(f"off_s {max(r['off'][0] for r in ranks)!r}")
        return 0

    print(f"DDP GPT step: {args.layers} layers, C = {args.width}, T = 64, batch {args.batch} "
          f"per rank, world {args.world}; median of {args.rounds} rounds x {args.steps} steps")
    with tempfile.TemporaryDirectory() as folder, World(args.world) as world:
        ranks = world.run(gpt_steps, args.layers, args.width, args.batch, args.steps,
                          args.rounds, True, folder)
    off = statistics.median(worst(ranks, "off"))
    on = statistics.median(worst(ranks, "on"))
    print(f"  tracing off  {1e3 * off:8.2f} ms per step")
    print(f"  tracing on   {1e3 * on:8.2f} ms per step   on / off = {on / off:.3f}  "
          f"(target <= 1.05)")
    if args.base:
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        times: dict[str, list[float]] = {"base": [], "off": []}
        for _ in range(args.rounds):
            for name, tree in (("base", args.base), ("off", here)):
                times[name].append(_run_off(tree, args))
        base, mine = statistics.median(times["base"]), statistics.median(times["off"])
        print(f"  without hooks ({args.base})  {1e3 * base:8.2f} ms per step")
        print(f"  with hooks, off                {1e3 * mine:8.2f} ms per step   "
              f"off / base = {mine / base:.3f}  (target <= 1.01)")
    return 0


def _run_off(tree: str, args: argparse.Namespace) -> float:
    """One 'off' measurement in a fresh process on the code of ``tree``."""
    env = dict(os.environ, PYTHONPATH=tree)
    cmd = [sys.executable, os.path.abspath(__file__), "--off-only", "--world", str(args.world),
           "--layers", str(args.layers), "--width", str(args.width), "--batch",
           str(args.batch), "--steps", str(args.steps)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"the run in {tree} failed:\n{out.stderr}")
    return float(out.stdout.split("off_s ")[-1])


if __name__ == "__main__":
    sys.exit(main())
