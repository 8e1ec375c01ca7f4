"""Hiding model parallelism's communication: exposed communication and step time, with and without each overlap.

    python bench/bench_overlap.py                     # world 2 on an emulated 1 GB/s link
    python bench/bench_overlap.py --only tp,fsdp --rounds 5 --link-gbps 0.5

Four pairs, each run in one world of 2 ranks on the emulated link (comm/transport/link.py:
bytes on the wire for M / B while the CPU is free), each variant's ratio taken against
the plain one of the same run:

- ``tp``:       a GPT under tensor + sequence parallelism (tp = 2), plain (all-gather, then
                matmul) vs async TP (distributed/_symmetric_memory/: the ring's chunk
                travels while the previous one multiplies);
- ``pipeline``: an MoE Llama over 2 stages, 1F1B vs DualPipeV (pipeline/dualpipe.py);
- ``fsdp``:     a GPT under fully_shard per block, float32 gathers vs bfloat16 and float8
                (distributed/fsdp/gather_format.py), with the bytes they move;
- ``moe``:      an expert-parallel MoE Llama with a shared expert (ep = 2), plain dispatch
                vs overlapped (parallel/expert/dispatch.py: the shared expert computes
                while the all-to-all travels).

A step is forward, backward, the gradient sync the strategy needs and SGD. Per variant:
the median step time over ``--rounds`` rounds (variants alternate within a round, so a
burst of load hits all of them), the slowest rank's; then ``--trace-steps`` steps
recorded (trace/) and ``exposed`` read off the trace by ``minidist trace summary``:
communication that no compute on the main thread hid, a blocking ``wait()`` included
(trace/summary.py), per step, the largest over the ranks. ``MB sent`` is one rank's
bytes per step, ``wire`` their time on the link.

What an overlap can hide: the bytes' time on the wire, no more (the copies in and out of
the link run on the cores, which compute too). The first line under each pair compares
the exposed communication it removed with min(the plain variant's wire time, its exposed
communication); the target is half of it. The CPU floor, measured as bench_ddp.py
measures it: each rank has one core here (2 ranks on 2 cores), so a step cannot take
less than its own CPU time (every thread of the rank: the main thread, the
communication thread); the second line states the share of the plain step above the
overlapped step's CPU time that it saved. For the gathers and the dispatch a third line
weighs the extra CPU time the overlap costs a step (rounding to bfloat16 / float8, the
second thread) against the wire time it saves or hides, and names the link speed below
which it pays: the low-precision gathers save bytes at 1 GB/s but round on the same
cores, so at 1 GB/s they can lose, and only on a link slower than the one that line
names do they win (a loaded 2-core machine put it near 0.2-0.4 GB/s with encode /
decode's fast paths, +2 to +7 ms a step; near 0.05 GB/s, +21 ms, before them); bigger tensors do not
change that ratio (both grow with the elements). The
closing block repeats each overlap's bars on one line.
Each rank uses one BLAS thread; a waiting rank sleeps at once (``--spin-s 0``), so that
its CPU time is its work, not its polling.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile

from _args import non_negative, positive, positive_int

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")   # before NumPy loads, here and in the spawned ranks

PAIRS = {   # pair -> its variants, the plain (reference) one first
    "tp": ["plain SP", "async TP"],
    "pipeline": ["1F1B", "DualPipeV"],
    "fsdp": ["float32", "bfloat16", "float8"],
    "moe": ["plain dispatch", "overlapped"],
}


def _gpt_config(a, dtype="float32"):
    from minidist.nn import GPTConfig
    return GPTConfig(block_size=a.seq, vocab_size=64, n_layer=a.layers, n_head=4,
                     n_embd=a.width, dtype=dtype, seed=0)


def _llama_config(a, shared: int, layers: int):
    from minidist.nn import LlamaConfig
    return LlamaConfig(vocab_size=64, hidden_size=a.width, intermediate_size=2 * a.width,
                       num_hidden_layers=layers, num_attention_heads=4,
                       num_key_value_heads=2, max_position_embeddings=a.seq,
                       num_local_experts=4, num_experts_per_tok=2, n_shared_experts=shared,
                       moe_intermediate_size=a.width, dtype="float32", seed=0)


def _tokens(a, rows: int, seed: int):
    import numpy as np

    from minidist import backend
    idx = np.random.default_rng(seed).integers(0, 64, (rows, a.seq))
    return backend.from_host(idx), backend.from_host(np.roll(idx, -1, axis=1))


def _sgd_step(model, loss_of):
    """One step: the loss (forward), its backward, SGD on ``model.parameters()``."""
    from minidist.optim import SGD
    opt = SGD(model.parameters(), lr=1e-3)

    def step():
        loss_of().backward()
        opt.step()
        opt.zero_grad()
    return step


def build_tp(a, variant):
    """TP GPT, sequence parallel, every rank the same batch."""
    from minidist.parallel import TensorParallelGPT
    model = TensorParallelGPT(_gpt_config(a), None, True, async_tp=variant == "async TP")
    idx, tgt = _tokens(a, a.batch, 0)
    return _sgd_step(model, lambda: model(idx, tgt)[1])


def build_fsdp(a, variant):
    """GPT, fully_shard per block and at the root, this rank's batch."""
    import minidist.distributed as dist
    from minidist.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from minidist.nn import GPT
    policy = {"float32": MixedPrecisionPolicy(),
              "bfloat16": MixedPrecisionPolicy(param_dtype="bfloat16"),
              "float8": MixedPrecisionPolicy(float8_all_gather=True)}[variant]
    model = GPT(_gpt_config(a))
    for block in model.blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    idx, tgt = _tokens(a, a.batch, dist.get_rank())
    return _sgd_step(model, lambda: model(idx, tgt)[1])


def build_moe(a, variant):
    """Expert-parallel MoE Llama (ep = world), a shared expert, this rank's batch."""
    import minidist.distributed as dist
    from minidist.nn import Llama
    from minidist.parallel.expert import (ExpertMesh, expert_parallel,
                                          sync_expert_parallel_gradients)
    mesh = ExpertMesh(ep=dist.get_world_size())
    model = expert_parallel(Llama(_llama_config(a, 1, a.layers)), mesh, overlap=variant == "overlapped")
    idx, tgt = _tokens(a, a.batch, dist.get_rank())

    def loss_of():
        loss = model(idx, tgt)[1]
        loss.backward()
        sync_expert_parallel_gradients(model, mesh)
        return _Done(loss)
    return _sgd_step(model, loss_of)


class _Done:
    """A loss whose backward (and the gradient sync after it) already ran."""

    def __init__(self, loss):
        self.loss = loss

    def backward(self):
        pass


def build_pipeline(a, variant):
    """MoE Llama over the world's stages, ``a.microbatches`` micro-batches of ``a.batch``."""
    import minidist.distributed as dist
    from minidist.nn import Llama
    from minidist.parallel.pipeline.executor import run_pipeline
    from minidist.parallel.pipeline.gpt import pieces_of_rank, split_gpt
    from minidist.parallel.pipeline.schedule import chunks_per_rank, make_schedule, placement
    name = {"1F1B": "1f1b", "DualPipeV": "dualpipe_v"}[variant]
    p, r, m = dist.get_world_size(), dist.get_rank(), a.microbatches
    v, where = chunks_per_rank(name), placement(name)
    model = Llama(_llama_config(a, 0, 2 * p))   # a layer per piece: DualPipeV cuts 2p
    chunks = pieces_of_rank(split_gpt(model, p, v), r, p, where)
    ops = make_schedule(name, p, m, v)[r]
    idx, tgt = _tokens(a, m * a.batch, 0)
    inputs = [idx[i * a.batch:(i + 1) * a.batch] for i in range(m)]
    targets = [tgt[i * a.batch:(i + 1) * a.batch] for i in range(m)]
    mine = [q for chunk in chunks for q in chunk.parameters()]

    def loss_of():
        run_pipeline(ops, chunks, m, inputs, targets, activation_shape=(a.batch, a.seq, a.width),
                     dtype="float32", placement=where)
        return _Done(None)
    return _sgd_step(_Params(mine), loss_of)


class _Params:
    """The parameters a pipeline rank holds, as the optimizer asks for them."""

    def __init__(self, params):
        self.params = params

    def parameters(self):
        return self.params


BUILDERS = {"tp": build_tp, "fsdp": build_fsdp, "moe": build_moe, "pipeline": build_pipeline}


def time_variant(pair: str, variant: str, a, path: str | None) -> tuple[float, float]:
    """On every rank: (median seconds, median CPU seconds of the whole process) per step;
    then, with ``path``, ``a.trace_steps`` steps recorded into it."""
    import time

    import minidist.distributed as dist
    from minidist import trace
    from minidist.backend import synchronize
    from minidist.comm.group import world_group
    world_group().transport.spin_s = a.spin_s   # a waiting rank sleeps: its CPU time is work
    step = BUILDERS[pair](a, variant)
    step()                                       # warm-up
    wall, cpu = [], []
    for _ in range(a.steps):
        dist.barrier()
        t, c = time.perf_counter(), time.process_time()
        step()
        synchronize()                            # a GPU backend computes asynchronously
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)     # every thread: main and communication
    if path is not None:
        dist.barrier()
        with trace.record(path):
            for _ in range(a.trace_steps):
                step()
            synchronize()
    return statistics.median(wall), statistics.median(cpu)


def from_trace(path: str, steps: int) -> tuple[float, float, float]:
    """(exposed communication, bytes sent, bytes all-gathered) per step, the largest over
    the ranks, read off the trace as ``minidist trace summary`` reads it."""
    from minidist.trace import load
    from minidist.trace.summary import COMM, summarize
    trace = load(path)
    exposed = max(row["exposed_comm"] for row in summarize(trace)["ranks"].values())
    sent: dict = {}
    gathered: dict = {}
    for e in trace["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") == COMM:
            args, pid = e.get("args", {}), e["pid"]
            sent[pid] = sent.get(pid, 0) + args.get("bytes_sent", 0)
            if e["name"].startswith("all_gather"):
                gathered[pid] = gathered.get(pid, 0) + args.get("bytes_recv", 0)
    most = max(gathered.values(), default=0)
    return exposed * 1e-6 / steps, max(sent.values(), default=0) / steps, most / steps


def measure_pair(world, pair: str, a, folder: str) -> dict:
    """variant -> dict(step, cpu, exposed, sent): step and CPU the medians over rounds of
    the slowest rank's; exposed and sent from the first round's trace."""
    per_round: dict = {v: [] for v in PAIRS[pair]}
    rows: dict = {}
    for r in range(a.rounds):
        for v in PAIRS[pair]:
            path = os.path.join(folder, f"{pair}-{v.replace(' ', '_')}.json") if r == 0 else None
            ranks = world.run(time_variant, pair, v, a, path)
            per_round[v].append((max(t for t, _ in ranks), max(c for _, c in ranks)))
            if path is not None:
                exposed, sent, gathered = from_trace(path, a.trace_steps)
                rows[v] = dict(exposed=exposed, sent=sent, gathered=gathered)
    for v, times in per_round.items():
        rows[v].update(step=statistics.median(t for t, _ in times),
                       cpu=statistics.median(c for _, c in times))
    return rows


def report(pair: str, rows: dict, gbps: float) -> list[str]:
    """The pair's table, ratios against its plain (first) variant, and its verdicts;
    returns each overlapped variant's line for the closing summary."""
    plain, *overlapped = PAIRS[pair]
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
    bars = []
    for v in overlapped:
        bars.append(verdict(v, plain, rows[v], base, gbps))
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


def verdict(v: str, plain: str, row: dict, base: dict, gbps: float) -> str:
    """Two lines: the exposed communication removed against what the wire allows hiding
    (at most the plain variant's wire time, and no more than it exposed: the copies
    stay on the cores), and the step time saved against the CPU floor. Returns the
    one-line form of both for the closing summary."""
    wire = base["sent"] / (gbps * 1e9)
    hideable = min(wire, base["exposed"])
    removed = base["exposed"] - row["exposed"]
    line = (f"  {v} vs {plain}: exposed {1e3 * base['exposed']:.1f} -> "
            f"{1e3 * row['exposed']:.1f} ms, removed {1e3 * removed:.1f} ms of the "
            f"{1e3 * hideable:.1f} ms the wire allows hiding")
    ok = hideable > 0 and removed >= 0.5 * hideable
    met = (f"target >= half {'met' if ok else 'NOT met'}" if hideable > 0
           else "nothing on the wire to hide")
    print(line + ": " + met)
    if base["exposed"] > 3 * wire:    # then what moves is waiting, not bytes
        print(f"  {' ' * len(v)}    (the plain variant's exposed time is over 3 x its wire "
              f"time: it waits on its peer's compute and the scheduler, which the verdict "
              f"cannot tell from the wire)")
    allowed = base["step"] - row["cpu"]           # the plain step down to the CPU floor
    saved = base["step"] - row["step"]
    line = (f"  {' ' * len(v)}    step saved {1e3 * saved:.1f} ms of the {1e3 * allowed:.1f} "
            f"ms above the CPU floor ({1e3 * row['cpu']:.1f} ms)")
    summary = (f"{v + ' vs ' + plain + ':':<30} exposed {1e3 * base['exposed']:.1f} -> "
               f"{1e3 * row['exposed']:.1f} ms, removed {1e3 * removed:.1f} of "
               f"{1e3 * hideable:.1f} ms allowed ({met}); step {1e3 * base['step']:.1f} -> "
               f"{1e3 * row['step']:.1f} ms, CPU floor {1e3 * row['cpu']:.1f} ms")
    if allowed <= 0:
        print(line + ": no room on these cores (the floor is at or above the plain step)")
        return summary
    print(line + f": {saved / allowed:.2f} of it")
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default=",".join(PAIRS), help="pairs to run, comma-separated")
    ap.add_argument("--layers", type=positive_int, default=2)
    ap.add_argument("--width", type=positive_int, default=128, help="hidden size")
    ap.add_argument("--seq", type=positive_int, default=128, help="tokens a sequence")
    ap.add_argument("--batch", type=positive_int, default=4, help="sequences per rank "
                    "(per micro-batch in the pipeline)")
    ap.add_argument("--microbatches", type=positive_int, default=4, help="pipeline: m >= 2p")
    ap.add_argument("--steps", type=positive_int, default=3, help="timed steps per measurement")
    ap.add_argument("--rounds", type=positive_int, default=3)
    ap.add_argument("--trace-steps", type=positive_int, default=2)
    ap.add_argument("--link-gbps", type=positive, default=1.0, help="the emulated link, GB/s")
    ap.add_argument("--spin-s", type=non_negative, default=0.0,
                    help="seconds a waiting receive polls before sleeping")
    a = ap.parse_args()
    pairs = [p.strip() for p in a.only.split(",")]
    unknown = [p for p in pairs if p not in PAIRS]
    if unknown:
        ap.error(f"--only: unknown pair(s) {unknown}; choose from {list(PAIRS)}")
    from minidist.comm import World
    print(f"world 2 on an emulated {a.link_gbps:g} GB/s link; {a.layers} layers, hidden "
          f"{a.width}, {a.seq} tokens x {a.batch} sequences; median of {a.rounds} rounds x "
          f"{a.steps} steps; exposed from a trace of {a.trace_steps} steps")
    bars = []
    with tempfile.TemporaryDirectory() as folder, World(2, link_gbps=a.link_gbps) as world:
        for pair in pairs:
            print(f"\n== {pair}: {' vs '.join(PAIRS[pair])} ==")
            bars += report(pair, measure_pair(world, pair, a, folder), a.link_gbps)
    print(f"\n== the bars, one line per overlap (exposed communication from the trace, the "
          f"wire's {a.link_gbps:g} GB/s time it may hide, target: half of it; step time "
          f"against the CPU floor, every thread's CPU time as bench_ddp.py measures it) ==")
    for line in bars:
        print("  " + line)


if __name__ == "__main__":
    main()
