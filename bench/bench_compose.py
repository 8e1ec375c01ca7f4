"""The composed step (parallelize_gpt on a ParallelDims mesh) beside the 3D entry point.

    python bench/bench_compose.py             # 8 ranks: dp_replicate=2 x pp=2 x tp=2

The same GPT (``--layers``, ``--hidden``, 4 heads, vocabulary 512, float32), the same
batches and the same layout run two ways on one world of 8 local processes:

    3D         ThreeDParallelGPT(cfg, DeviceMesh(dp=2, pp=2, tp=2), m, "1f1b")
    composed   parallelize_gpt(GPT(cfg), ParallelDims(dp_replicate=2, pp=2, tp=2)
               .build_mesh(), ...)     (parallel/compose/parallelize.py)

The 3D entry point is the composition with cp = ep = 1 (the same pieces, schedule and
averages), so the ratio measures what the general path adds: the named mesh's groups,
the whole-batch loss sent to every rank (two all-reduces of one number). A step's time
is the slowest rank's between barriers; each way runs ``--rounds`` rounds of ``--steps``
steps after a warm-up, alternating, and the median is printed. Then the planner's
prediction of the same layout on this machine (calc/planner: the matmul rate and message
latency measured on the same 8 ranks, the efficiency fitted from two calibration runs,
as ``minidist plan --measure`` does). Times on a shared machine vary; the ratio is
measured in one invocation.
"""
from __future__ import annotations

import argparse
import statistics
import time

from _args import positive_int


def _steps(way: str, kwargs: dict, shape: dict, microbatches: int, batches: list) -> list:
    """Every rank: build ``way``'s model, one warm-up step, then each batch timed."""
    import minidist.distributed as dist
    from minidist import backend
    from minidist.nn import GPT, GPTConfig
    from minidist.optim import AdamW
    cfg = GPTConfig(**kwargs)
    if way == "3D":
        from minidist.comm import DeviceMesh
        from minidist.parallel import ThreeDParallelGPT
        model = ThreeDParallelGPT(cfg, DeviceMesh(dp=shape["dp_replicate"], pp=shape["pp"],
                                                  tp=shape["tp"]), microbatches, "1f1b")
    else:
        from minidist.parallel import ParallelDims, parallelize_gpt
        dims = ParallelDims(**shape)
        model = parallelize_gpt(GPT(cfg), dims.build_mesh(), dims, microbatches, "1f1b")
    opt = AdamW(model.parameters(), lr=1e-3)
    batches = [(backend.from_host(x), backend.from_host(y)) for x, y in batches]
    model.train_step(*batches[0], opt)
    seconds = []
    for x, y in batches:
        dist.barrier()
        start = time.perf_counter()
        model.train_step(x, y, opt)
        backend.synchronize()
        dist.barrier()
        seconds.append(time.perf_counter() - start)
    return seconds


def predicted(bench, layers: int, hidden: int, seq: int, sequences: int, b: int) -> float:
    """The planner's step time for dp2 tp2 pp2, ZeRO 0, micro-batch b, on this machine."""
    from minidist.calc.planner import machine, presets
    from minidist.calc.planner.layouts import parse_layout
    spec = machine.scaled_gpt(layers=layers, hidden=hidden, seq=seq)
    setup = presets.TrainingSetup(sequences * seq, seq, "fp32")
    ranks = bench.world.world_size
    peak, latency = bench.matmul_flops(), bench.latency()
    kwargs = machine.gpt_kwargs(spec, seq)
    calibration = []
    for size in sorted({1, b}):
        alone = dict(alone=True, dp=ranks, tp=1, pp=1, zero=0, micro_batch=size,
                     recompute="none")
        calibration.append((size, bench.run(kwargs, alone, sequences)["seconds"]))
    efficiency, overhead = machine.fit_compute(spec, setup, ranks, peak, calibration)
    cluster = machine.this_machine(ranks, peak, efficiency, overhead, 0.0, latency=latency)
    layout = parse_layout(f"dp2 tp2 pp2 cp1 z0 b{b} none")
    return machine.predict(spec, setup, layout, cluster, ranks).time.total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=positive_int, default=4)
    parser.add_argument("--hidden", type=positive_int, default=64)
    parser.add_argument("--seq", type=positive_int, default=64)
    parser.add_argument("--sequences", type=positive_int, default=8, help="per step")
    parser.add_argument("--microbatches", type=positive_int, default=2, help="per replica")
    parser.add_argument("--steps", type=positive_int, default=3)
    parser.add_argument("--rounds", type=positive_int, default=3)
    args = parser.parse_args()
    import numpy as np

    from minidist.parallel.compare.measure import Bench
    shape = dict(dp_replicate=2, pp=2, tp=2)
    kwargs = dict(block_size=args.seq, vocab_size=512, n_layer=args.layers, n_head=4,
                  n_embd=args.hidden, dtype="float32")
    rng = np.random.default_rng(0)
    batches = [(rng.integers(0, 512, (args.sequences, args.seq)),
                rng.integers(0, 512, (args.sequences, args.seq))) for _ in range(args.steps)]
    times: dict[str, list] = {"3D": [], "composed": []}
    with Bench(8, steps=args.steps) as bench:
        for r in range(args.rounds):
            for way in (("3D", "composed") if r % 2 == 0 else ("composed", "3D")):
                per_rank = bench.world.run(_steps, way, kwargs, shape, args.microbatches,
                                           batches)
                times[way] += [max(step) for step in zip(*per_rank)]
        b = args.sequences // (2 * args.microbatches)
        plan = predicted(bench, args.layers, args.hidden, args.seq, args.sequences, b)
    print(f"GPT: {args.layers} layers, hidden {args.hidden}, seq {args.seq}, "
          f"{args.sequences} sequences a step, {args.microbatches} micro-batches a replica; "
          "8 ranks: dp_replicate=2 x pp=2 x tp=2, 1F1B, float32")
    three_d, composed = statistics.median(times["3D"]), statistics.median(times["composed"])
    print(f"{'way':<10} {'step s':>8}  {'ratio':>6}")
    print(f"{'3D':<10} {three_d:>8.4f}  {1.0:>6.2f}")
    print(f"{'composed':<10} {composed:>8.4f}  {composed / three_d:>6.2f}")
    print(f"planner, this machine: {plan:.4f} s  (measured composed / predicted "
          f"{composed / plan:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
