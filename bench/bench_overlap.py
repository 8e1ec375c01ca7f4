"""Hiding model parallelism's communication: exposed communication and step time, with and without each overlap.

    python bench/bench_overlap.py                     # on an emulated 1 GB/s link
    python bench/bench_overlap.py --only tp,fsdp --rounds 5 --link-gbps 0.5
    python bench/bench_overlap.py --only pipeline_ep  # DualPipeV on pp = 2 x ep = 2 alone

Five pairs on the emulated link (comm/transport/link.py: bytes on the wire for M / B
while the CPU is free), each variant's ratio taken against the plain one of the same run:

- ``tp``:          a GPT under tensor + sequence parallelism (tp = 2), plain (all-gather,
                   then matmul) vs async TP (distributed/_symmetric_memory/: the ring's
                   chunk travels while the previous one multiplies);
- ``pipeline``:    an MoE Llama over 2 stages, no expert parallelism, 1F1B vs DualPipeV
                   (pipeline/dualpipe.py): what DualPipeV's order alone does;
- ``fsdp``:        a GPT under fully_shard per block, float32 gathers vs bfloat16 and
                   float8 (distributed/fsdp/gather_format.py), with the bytes they move;
- ``moe``:         an expert-parallel MoE Llama with a shared expert (ep = 2), plain
                   dispatch vs overlapped (parallel/expert/dispatch.py: the shared expert
                   computes while the all-to-all travels), read off the dispatches' own
                   waits (the ``MoE dispatch unit k`` spans, as fsdp's gathers below);
- ``pipeline_ep``: an MoE Llama on 4 ranks, pp = 2 x ep = 2 (ep borrows dp_shard = 2, so
                   FSDP shards the dense weights over it; parallel/compose/:
                   ParallelDims, parallelize_llama), 1F1B vs DualPipeV, whose F&B ops take
                   turns at each expert all-to-all (comm/collectives/interleave.py).

The first four run in one world of 2 ranks, ``pipeline_ep`` in one of 4 (two ranks a
core here). A step is forward, backward, the gradient sync the strategy needs and SGD.
Per variant: the median step time over ``--rounds`` rounds (variants alternate within a
round, so a burst of load hits all of them), the slowest rank's; in each round, after the
timed steps, ``--trace-steps`` steps recorded (trace/) and ``exposed`` read off that
trace by ``minidist trace summary``: communication that no compute on the main thread
hid, a blocking ``wait()`` included (trace/summary.py), per step, the largest over the
ranks; its median over the rounds. For ``fsdp`` also the part of it inside the units'
``FSDP gather unit k`` spans (how long each unit still waited for its weights: the
summary's cut by unit wait), per step: the gathers' own exposed time, at each gather the
least over the ranks (the rank that came last waited for the gather alone, the others
for that rank too: its compute, the scheduler), summed, its median over the rounds,
which the fsdp bar reads (the moe bar reads the ``MoE dispatch unit k`` spans the same way:
each layer's wait for its dispatched rows, the counts' exchange before it, which waits
for a late peer, and the combine after it left out); beside it the largest rank's gather waits and the whole step's
exposed time (the reduce-scatters' waits and a late peer move the whole step's by more
than the gathers' bytes, 3.1-6.9 ms from run to run on a quiet machine, against a bar
of 0.4-0.6 ms). ``MB sent`` is one rank's bytes per step (every call's ``bytes_sent``),
``wire`` their time on the link.

What each overlap can hide: the wire time of the traffic it acts on, no more (the copies
in and out of the link run on the cores, which compute too), and no more than the plain
variant exposed. Read off the traces, per rank, from each call's bytes and kind (and
``mesh_dim`` on a device mesh), over the link's bandwidth (_overlap_traffic.py):

    async TP      the plain variant's all-gathers and reduce-scatters (the same bytes
                  travel as the ring's sends)
    DualPipeV     its stage sends and, with expert parallelism, the all-to-alls that
                  begin inside its F&B ops (the ones the other half's compute can hide)
    overlapped    the all-to-alls it starts async (on the communication thread): the
    dispatch      dispatch's; the combine, the backward's and the gradient all-reduce
                  stay blocking in both variants, so are not counted
    low-precision the all-gather bytes saved (float32's minus the variant's): these
    gathers       gathers hide nothing, they send less; read against the gathers'
                  exposed time, not the whole step's

The first line under each pair states the exposed communication removed against half
of that figure ("target >= half met" or "NOT met"); the next line prints the traffic's
MB and wire time beside the old, whole-wire figure (min(every call's wire time, the
plain variant's exposed)), which counted traffic the overlap never touches. Where the
plain variant's exposed time is over 3 x its wire time, most of it is waiting on a
peer's compute or on the scheduler (on 2 loaded cores, 4 ranks certainly), and an
overlap that reorders work can remove more than the wire time: a bar met there says
that the waits went, not that the wire was hidden; the line says so. Under DualPipeV
with expert parallelism an F&B op's second half runs on a thread of its own while the
main thread is parked inside the op's span; the summary counts that thread's blocking
calls (FSDP's reduce-scatters, its waits) as exposed, as the main thread's: the rank
computed nothing then (trace/summary.py).

The CPU floor, measured as bench_ddp.py measures it: a step cannot take less than its
slowest rank's CPU time (every thread of the rank: the main thread, the communication
thread), nor less than all ranks' CPU time over the cores (it binds where 4 ranks share
2 cores); the next line states the share of the plain step above the overlapped step's
floor that it saved. For the gathers and the dispatch a last line weighs the extra CPU
time the overlap costs a step (rounding to bfloat16 / float8, the second thread) against
the wire time it saves or hides, and names the link speed below which it pays: the
low-precision gathers save bytes at 1 GB/s but round on the same cores, so at 1 GB/s
they can lose, and only on a link slower than the one that line names do they win (a
loaded 2-core machine put it near 0.2-0.4 GB/s with encode / decode's fast paths, +2 to
+7 ms a step; near 0.05 GB/s, +21 ms, before them); bigger tensors do not change that
ratio (both grow with the elements). The closing block repeats each overlap's bars on
one line. Each rank uses one BLAS thread; a waiting rank sleeps at once (``--spin-s 0``), so that
its CPU time is its work, not its polling.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile

from _args import non_negative, positive, positive_int
from _overlap_report import report
from _overlap_traffic import WAITS, from_trace

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")   # before NumPy loads, here and in the spawned ranks

PAIRS = {   # pair -> its variants, the plain (reference) one first
    "tp": ["plain SP", "async TP"],
    "pipeline": ["1F1B", "DualPipeV"],
    "fsdp": ["float32", "bfloat16", "float8"],
    "moe": ["plain dispatch", "overlapped"],
    "pipeline_ep": ["1F1B", "DualPipeV"],
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


def build_pipeline_ep(a, variant):
    """MoE Llama on 4 ranks, pp = 2 x ep = 2 (ep borrows dp_shard = 2: FSDP over it, the
    experts left out), through ParallelDims / parallelize_llama; each rank ``a.batch``
    sequences a micro-batch, ``a.microbatches`` of them; the model's own train_step."""
    from minidist.nn import Llama
    from minidist.optim import SGD
    from minidist.parallel.compose import ParallelDims, parallelize_llama
    name = {"1F1B": "1f1b", "DualPipeV": "dualpipe_v"}[variant]
    dims = ParallelDims(**EP_DIMS)
    model = parallelize_llama(Llama(_llama_config(a, 0, 2 * dims.pp)), dims.build_mesh(),
                              dims, a.microbatches, name)   # a layer per piece: DualPipeV cuts 2p
    opt = SGD(model.parameters(), lr=1e-3)
    idx, tgt = _tokens(a, dims.dp_shard * a.microbatches * a.batch, 0)
    return lambda: model.train_step(idx, tgt, opt)


EP_DIMS = dict(dp_shard=2, pp=2, ep=2)     # pipeline_ep's layout: 4 ranks


BUILDERS = {"tp": build_tp, "fsdp": build_fsdp, "moe": build_moe, "pipeline": build_pipeline,
            "pipeline_ep": build_pipeline_ep}
WORLD = {"pipeline_ep": 4}                 # ranks per pair; 2 for the others


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

def measure_pair(world, pair: str, a, folder: str) -> dict:
    """variant -> dict(step, cpu, floor, exposed, waits_exposed, waits_own, sent,
    gathered, traffic): step and CPU the medians over rounds of the slowest rank's; floor
    the CPU floor, the larger of that rank's CPU time and every rank's together over the
    cores (4 ranks share 2); exposed, waits_exposed (FSDP's gather waits, the MoE
    dispatches' waits alone) and waits_own (less the waits for a late peer) the medians
    over the rounds' traces, per step; the bytes from the first round's."""
    per_round: dict = {v: [] for v in PAIRS[pair]}
    rows: dict = {}
    for r in range(a.rounds):
        for v in PAIRS[pair]:
            path = os.path.join(folder, f"{pair}-{v.replace(' ', '_')}-{r}.json")
            ranks = world.run(time_variant, pair, v, a, path)
            traced = from_trace(path, a.trace_steps, WAITS.get(pair))
            per_round[v].append((max(t for t, _ in ranks), max(c for _, c in ranks),
                                 sum(c for _, c in ranks) / CORES, traced["exposed"],
                                 traced["waits_exposed"], traced["waits_own"]))
            rows.setdefault(v, traced)          # the bytes: the same in every round
    for v, times in per_round.items():
        rows[v].update(step=statistics.median(t[0] for t in times),
                       cpu=statistics.median(t[1] for t in times),
                       floor=statistics.median(max(t[1], t[2]) for t in times),
                       exposed=statistics.median(t[3] for t in times),
                       waits_exposed=statistics.median(t[4] for t in times),
                       waits_own=statistics.median(t[5] for t in times))
    return rows


CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


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
    ap.add_argument("--rounds", type=positive_int, default=7,
                    help="rounds of every variant (the medians over them: fewer are noisier)")
    ap.add_argument("--trace-steps", type=positive_int, default=6)
    ap.add_argument("--link-gbps", type=positive, default=1.0, help="the emulated link, GB/s")
    ap.add_argument("--spin-s", type=non_negative, default=0.0,
                    help="seconds a waiting receive polls before sleeping")
    a = ap.parse_args()
    pairs = [p.strip() for p in a.only.split(",")]
    unknown = [p for p in pairs if p not in PAIRS]
    if unknown:
        ap.error(f"--only: unknown pair(s) {unknown}; choose from {list(PAIRS)}")
    from contextlib import ExitStack

    from minidist.comm import World
    print(f"world 2 (pipeline_ep: 4) on an emulated {a.link_gbps:g} GB/s link; {a.layers} "
          f"layers, hidden {a.width}, {a.seq} tokens x {a.batch} sequences; median of "
          f"{a.rounds} rounds x {a.steps} steps; exposed: per step, median over the rounds of "
          f"a trace of {a.trace_steps} steps (fsdp, moe: also the gathers' and dispatches' "
          f"waits alone)")
    bars, worlds = [], {}
    with tempfile.TemporaryDirectory() as folder, ExitStack() as open_worlds:
        for pair in pairs:
            n = WORLD.get(pair, 2)
            if n not in worlds:
                worlds[n] = open_worlds.enter_context(World(n, link_gbps=a.link_gbps))
            print(f"\n== {pair}: {' vs '.join(PAIRS[pair])} "
                  + (f"(pp=2 x ep=2, {n} ranks) ==" if pair == "pipeline_ep" else "=="))
            bars += report(pair, PAIRS[pair], measure_pair(worlds[n], pair, a, folder),
                           a.link_gbps)
    print(f"\n== the bars, one line per overlap (exposed communication from the trace, "
          f"removed against the {a.link_gbps:g} GB/s wire time of the traffic the overlap acts "
          f"on, target: half of it, the old whole-wire figure beside it; step time against "
          f"the CPU floor, every thread's CPU time as bench_ddp.py measures it) ==")
    for line in bars:
        print("  " + line)


if __name__ == "__main__":
    main()
