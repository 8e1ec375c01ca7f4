"""Run a parallel layout of a small GPT and measure its step time and peak memory per rank.

What ``minidist plan --measure`` holds the planner's predictions against. A layout is
given in the planner's words (dp, tp, pp, ZeRO stage, micro-batch b, recomputation)
and run with minidist's own strategies on a world of local processes:

    tp = pp = 1   DDP (zero 0) or ZeRO-1 / 2 / 3 (parallel/zero) over dp ranks; each
                  rank's B / dp sequences in m = B / (dp b) micro-batches, gradients
                  accumulated (DDP's no_sync until the last), one AdamW step;
                  recompute "full" is GPTConfig(checkpoint=True)
    otherwise     ThreeDParallelGPT on a dp x pp x tp mesh (parallel/three_d.py), the
                  1F1B schedule over m micro-batches, AdamW; ZeRO 0, no recomputation

Every rank traces its allocations (``tracemalloc`` on the CPU; CuPy's memory pool
counts them on a GPU; ``backend.memory_in_use`` and ``MemoryTracker`` read either)
from before the model is built: after a warm-up step (AdamW's state exists),
the peak of one more step counted from zero is the rank's peak memory -- weights,
gradients, optimizer state, activations and every temporary. Tracing slows
allocation, so it is stopped before the timed steps; a step's time is the slowest
rank's, between barriers, and the median of the timed steps is reported.

``calibrate`` times a float32 matmul on every rank at once (so the ranks share the
cores as they will in the runs): the FLOP/s each rank reaches. ``message_latency``
times an all-reduce of one float: the seconds a message costs besides its bytes.
"""
from __future__ import annotations

import statistics
import time
import tracemalloc
from typing import Any

import minidist.distributed as dist
from minidist import backend
from minidist.comm import DeviceMesh, World
from minidist.nn.gpt import GPT, GPTConfig
from minidist.optim import AdamW
from minidist.parallel.data.ddp import DistributedDataParallel
from minidist.parallel.three_d import ThreeDParallelGPT
from minidist.parallel.zero import Zero1, Zero2, Zero3

LR = 1e-3


def _matmul_rate(rows: int, inner: int, cols: int, seconds: float) -> float:
    """FLOP/s of (rows, inner) @ (inner, cols) in float32 on this rank: 2 rows inner cols
    per product, repeated for about ``seconds`` after one warm-up product."""
    gen = backend.Generator(dist.get_rank())
    a = gen.normal((rows, inner), dtype="float32")
    b = gen.normal((inner, cols), dtype="float32")
    backend.xp.matmul(a, b)
    dist.barrier()
    count, start = 0, time.perf_counter()
    while True:
        backend.xp.matmul(a, b)
        count += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return 2 * rows * inner * cols * count / elapsed


def calibrate(world: World, rows: int = 1024, inner: int = 512, cols: int = 512,
              seconds: float = 1.0) -> float:
    """The FLOP/s one rank of ``world`` reaches on a float32 matmul while every rank
    runs one (the slowest rank's)."""
    return min(world.run(_matmul_rate, rows, inner, cols, seconds))


def _message_seconds(repeats: int) -> float:
    """Seconds per ring step of an all-reduce of one float (its 2 (N - 1) steps are all
    latency): the median of ``repeats``, between barriers."""
    x = backend.xp.zeros(1, dtype="float32")
    steps = 2 * (dist.get_world_size() - 1)
    times = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(x)
        times.append((time.perf_counter() - start) / max(steps, 1))
    return statistics.median(times)


def message_latency(world: World, repeats: int = 50) -> float:
    """The latency of one message between ranks of ``world`` (the slowest rank's)."""
    return max(world.run(_message_seconds, repeats))


def _batches(cfg: GPTConfig, sequences: int, steps: int) -> list:
    gen = backend.Generator(7)
    shape = (sequences, cfg.block_size)
    return [(gen.integers(0, cfg.vocab_size, shape), gen.integers(0, cfg.vocab_size, shape))
            for _ in range(steps)]


class _DataParallelStep:
    """DDP or ZeRO-1/2/3 over every rank, m micro-batches of b sequences, one AdamW step;
    ``zero=None``: no communication, every rank trains its own copy (the calibration)."""

    def __init__(self, cfg: GPTConfig, zero: int | None, micro_batch: int):
        self.b = micro_batch
        model = GPT(cfg)
        if zero is None:
            self.model = model
            self.optimizer = AdamW(model.parameters(), lr=LR)
        elif zero == 0:
            self.model = DistributedDataParallel(model)
            self.optimizer = AdamW(model.parameters(), lr=LR)
        else:
            self.model = {1: Zero1, 2: Zero2, 3: Zero3}[zero](model, AdamW, lr=LR)
            self.optimizer = self.model

    def __call__(self, idx: Any, targets: Any) -> None:
        n, d = dist.get_world_size(), dist.get_rank()
        rows = idx.shape[0] // n
        idx, targets = idx[d * rows:(d + 1) * rows], targets[d * rows:(d + 1) * rows]
        m = rows // self.b
        for i in range(m):
            x, y = idx[i * self.b:(i + 1) * self.b], targets[i * self.b:(i + 1) * self.b]
            last = i == m - 1
            if isinstance(self.model, DistributedDataParallel) and not last:
                with self.model.no_sync():
                    (self.model(x, y)[1] * (1.0 / m)).backward()
            else:
                (self.model(x, y)[1] * (1.0 / m)).backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        if isinstance(self.model, DistributedDataParallel):
            self.model.module.zero_grad()


class _MeshStep:
    """ThreeDParallelGPT on a dp x pp x tp mesh with 1F1B."""

    def __init__(self, cfg: GPTConfig, dp: int, tp: int, pp: int, microbatches: int):
        self.model = ThreeDParallelGPT(cfg, DeviceMesh(dp=dp, pp=pp, tp=tp), microbatches)
        self.optimizer = AdamW(self.model.parameters(), lr=LR)

    def __call__(self, idx: Any, targets: Any) -> None:
        self.model.train_step(idx, targets, self.optimizer)


def _run_on_rank(cfg: GPTConfig, layout: dict, sequences: int, steps: int) -> dict:
    batches = [(backend.from_host(x), backend.from_host(y))
               for x, y in _batches(cfg, sequences, steps + 2)]
    tracemalloc.start()
    try:
        if layout.get("alone") or (layout["tp"] == 1 and layout["pp"] == 1):
            cfg = GPTConfig(**{**cfg.__dict__, "checkpoint": layout["recompute"] == "full"})
            zero = None if layout.get("alone") else layout["zero"]
            step = _DataParallelStep(cfg, zero, layout["micro_batch"])
        else:
            m = sequences // (layout["dp"] * layout["micro_batch"])
            step = _MeshStep(cfg, layout["dp"], layout["tp"], layout["pp"], m)
        step(*batches[0])                       # warm-up: AdamW's state is made here
        base = backend.memory_in_use()          # traced host memory; CuPy's pool on a GPU
        with backend.MemoryTracker() as step_memory:
            step(*batches[1])
        peak = base + step_memory.peak
    finally:
        tracemalloc.stop()
    seconds = []
    for x, y in batches[2:]:
        dist.barrier()
        start = time.perf_counter()
        step(x, y)
        backend.synchronize()
        dist.barrier()
        seconds.append(time.perf_counter() - start)
    return {"peak_bytes": peak, "base_bytes": base, "seconds": seconds}


def run_layout(world: World, cfg: GPTConfig, layout: dict, sequences: int,
               steps: int = 3) -> dict:
    """Run ``layout`` (dp, tp, pp, zero, micro_batch, recompute) on ``world`` for a
    warm-up step, a traced step and ``steps`` timed ones of ``sequences`` sequences.
    ``alone=True`` in the layout: every rank trains the whole model on its own
    ``sequences`` (dp x their number in all) with no communication.

    Returns {"seconds": median step time (the slowest rank's), "peak_bytes": the
    largest rank's peak, "peak_per_rank": each rank's, "base_bytes": each rank's bytes
    held between steps}."""
    if not layout.get("alone") and layout["dp"] * layout["tp"] * layout["pp"] != world.world_size:
        raise ValueError(f"layout {layout} needs dp x tp x pp = {world.world_size} ranks")
    results = world.run(_run_on_rank, cfg, layout, sequences, steps)
    per_step = [max(r["seconds"][i] for r in results) for i in range(steps)]
    return {"seconds": statistics.median(per_step), "all_seconds": per_step,
            "peak_bytes": max(r["peak_bytes"] for r in results),
            "peak_per_rank": [r["peak_bytes"] for r in results],
            "base_bytes": [r["base_bytes"] for r in results]}


class Bench:
    """A world of ``ranks`` processes on the emulated link, for ``plan --measure``:

        with Bench(2, link_gbps=0.5) as bench:
            flops = bench.matmul_flops()
            seconds = bench.run(gpt_kwargs, layout, sequences)["seconds"]

    The model is given as GPTConfig's keyword arguments, the layout as a dict, so that
    the planner (calc, which imports nothing of the package) can drive it."""

    def __init__(self, ranks: int, *, link_gbps: float | None = None,
                 node_size: int | None = None, inter_node_gbps: float | None = None,
                 steps: int = 3):
        self.steps = steps
        self.world = World(ranks, link_gbps=link_gbps, node_size=node_size,
                           inter_node_gbps=inter_node_gbps, timeout=120.0)

    def __enter__(self) -> "Bench":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.world.close()

    def matmul_flops(self, seconds: float = 1.0) -> float:
        return calibrate(self.world, seconds=seconds)

    def latency(self) -> float:
        return message_latency(self.world)

    def run(self, gpt_kwargs: dict, layout: dict, sequences: int) -> dict:
        return run_layout(self.world, GPTConfig(**gpt_kwargs), layout, sequences, self.steps)
