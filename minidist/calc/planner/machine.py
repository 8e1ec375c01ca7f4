"""The planner on this machine: a model scaled to run here, a cluster from measurements,
and its predictions held against runs (``minidist plan --measure``).

    model     minidist's own GPT (nn.gpt: LayerNorm, GELU MLP of 4h, tied embeddings,
              learned positions, biases, naive attention, float32), small enough that a
              step takes a fraction of a second on a core: ``scaled_gpt``
    cluster   "this-machine" (``this_machine``): one rank per core as a GPU, its
              memory unlimited (or ``--memory``), and
                peak x efficiency   measured: peak is the FLOP/s a float32 matmul of
                                    1024 x 512 x 512 reaches on each rank while every
                                    rank runs one; efficiency and the fixed cost per
                                    layer and micro-batch c come from two calibration
                                    steps of the whole model on every rank with no
                                    communication, at micro-batch 1 (m_1 micro-batches)
                                    and the largest b (m_b):
                                        t = F / (peak x eff) + L m c
                                    two equations, two unknowns
                links               the emulated link (comm/transport/link.py):
                                    MINIDIST_LINK_GBPS inside a node,
                                    MINIDIST_INTER_NODE_GBPS between nodes of
                                    MINIDIST_NODE_SIZE ranks; the latency of a
                                    message measured (an all-reduce of one float,
                                    its 2 (N - 1) steps all latency), the same on
                                    both levels
    layouts   what minidist's strategies can run (``runnable``): dp x tp x pp = ranks;
              tp = pp = 1 with DDP or ZeRO 1-3 and recomputation none or full; otherwise
              ThreeDParallelGPT (ZeRO 0, no recomputation, 1F1B)
    rows      the predicted five best, then the slowest and one from the middle, and
              the fastest that the planner excludes (tp across nodes, or more memory
              than ``--memory``) (``pick``), each run and compared: step time and the
              fullest rank's peak memory, predicted beside measured, and the order of
              the top five by measured time against the predicted order.

The runs themselves are minidist/parallel/compare/measure.py (the command line passes it in:
calc imports nothing of the package).
"""
from __future__ import annotations

from dataclasses import dataclass

from minidist.calc.planner import model
from minidist.calc.planner.layouts import Layout, divisors, microbatches
from minidist.calc.planner.presets import ClusterSpec, ModelSpec, TrainingSetup
from minidist.calc.planner.memory import memory_per_gpu
from minidist.calc.planner.search import Scored, score
from minidist.calc.planner.time import step_time

MEMORY_TARGET = 0.10       # |measured - predicted| / predicted, peak memory per rank
TIME_TARGET = 0.25         # the same for step time
UNLIMITED = 1e15           # bytes: this machine's memory, taken as no limit
TIE = 0.05                 # predicted step times closer than this are a tie


def scaled_gpt(layers: int = 4, hidden: int = 128, heads: int = 4, seq: int = 128,
               vocab: int = 512) -> ModelSpec:
    """minidist's GPT with these sizes, as the planner sees it."""
    return ModelSpec("minidist-gpt", layers, hidden, heads, heads, 4 * hidden, vocab,
                     gated=False, tied=True, positions=seq, biases=True,
                     implementation="minidist")


def gpt_kwargs(spec: ModelSpec, seq: int) -> dict:
    """GPTConfig's keyword arguments for ``spec`` (what the runner builds)."""
    return dict(block_size=seq, vocab_size=spec.vocab, n_layer=spec.layers,
                n_head=spec.heads, n_embd=spec.hidden)


def fit_compute(spec: ModelSpec, setup: TrainingSetup, ranks: int, peak: float,
                calibration: list[tuple[int, float]]) -> tuple[float, float]:
    """(efficiency, seconds per layer and micro-batch) from calibration steps: each
    (micro-batch b, seconds) of every rank training the whole model alone on
    B / ranks sequences. With F the FLOPs of one rank's share and m = B / (ranks b):
        t = F / (peak x eff) + L m c
    solved on the first and last pair (c = 0 with one pair), with c >= 0 and
    efficiency <= 1 (where noise would give more, efficiency 1 and c the rest)."""
    per_rank = setup.sequences // ranks
    work = per_rank * setup.seq * model.model_flops_per_token(spec, setup.seq)
    (b1, t1), (b2, t2) = calibration[0], calibration[-1]
    m1, m2 = max(1, per_rank // b1), max(1, per_rank // b2)   # b > B / ranks: one, smaller
    c = (t1 - t2) / (spec.layers * (m1 - m2)) if m1 != m2 else 0.0
    c = max(c, 0.0)
    compute = t2 - spec.layers * m2 * c
    if compute < work / peak:       # noise made the overhead explain it all: no rate
        compute = work / peak       # above peak (efficiency at most 1), the rest is c
        c = max(0.0, (t2 - compute) / (spec.layers * m2))
    return work / (peak * compute), c


def this_machine(ranks: int, peak: float, efficiency: float, layer_overhead: float,
                 link_bytes: float, inter_bytes: float = 0.0, node_size: int = 0,
                 latency: float = 50e-6, memory: float = UNLIMITED) -> ClusterSpec:
    """The cluster these ranks make (module docstring); a link of 0 bytes/s (off) is
    taken as 10 GB/s, about what a copy through shared memory moves."""
    link = link_bytes or 10e9
    return ClusterSpec("this-machine", node_size or ranks, memory, peak,
                       link, inter_bytes or link, latency, latency,
                       matmul_efficiency=efficiency, layer_overhead=layer_overhead)


def runnable(spec: ModelSpec, setup: TrainingSetup, ranks: int,
             max_micro_batch: int) -> list[Layout]:
    """Every layout minidist's strategies run (module docstring) whose batch splits into
    whole micro-batches; the other rules are the planner's to check (``predictions``)."""
    out = []
    for tp in divisors(ranks):
        for pp in divisors(ranks // tp):
            dp = ranks // (tp * pp)
            simple = tp == 1 and pp == 1
            for b in divisors(max_micro_batch):
                for zero in ((0, 1, 2, 3) if simple else (0,)):
                    for recompute in (("none", "full") if simple else ("none",)):
                        layout = Layout(dp, tp, pp, 1, 1, zero, b, recompute,
                                        "none" if pp == 1 else "1f1b")
                        if microbatches(layout, setup):
                            out.append(layout)
    return out


def pick(scored: list[Scored], top: int = 5) -> list[Scored]:
    """The ``top`` fastest predicted that can run, then the slowest and one from the
    middle; then the fastest excluded layout, if any (it runs all the same: what the
    planner would not choose, measured)."""
    ranked = sorted((s for s in scored if s.feasible),
                    key=lambda s: (s.time.total, s.memory.total))
    rows = ranked[:top]
    for extra in (ranked[(top + len(ranked)) // 2], ranked[-1]) if ranked else ():
        if extra not in rows:
            rows.append(extra)
    excluded = sorted((s for s in scored if not s.feasible), key=lambda s: s.time.total)
    return rows + excluded[:1]


def predictions(spec: ModelSpec, setup: TrainingSetup, cluster: ClusterSpec, ranks: int,
                max_micro_batch: int) -> list[Scored]:
    """Every runnable layout, scored: those that keep the rules, and those excluded only
    by a rule that minidist's runs do not need (tp across nodes: the formulas still
    apply, with the slower link) or by memory (``--memory``), with their reasons."""
    scored = (predict(spec, setup, layout, cluster, ranks)
              for layout in runnable(spec, setup, ranks, max_micro_batch))
    return [s for s in scored if s.time is not None]


def predict(spec: ModelSpec, setup: TrainingSetup, layout: Layout, cluster: ClusterSpec,
            ranks: int) -> Scored:
    """``search.score``, with memory and time also for a layout excluded only because
    its tp group spans nodes (no time where another rule is broken)."""
    scored = score(spec, setup, layout, cluster, ranks)
    if scored.time is None and all("spans nodes" in r for r in scored.reasons):
        memory = memory_per_gpu(spec, setup, layout)
        time = step_time(spec, setup, layout, cluster)
        scored = Scored(layout, memory, time, 0.0, 0.0, scored.reasons)
    return scored


def runner_layout(layout: Layout) -> dict:
    return dict(dp=layout.dp, tp=layout.tp, pp=layout.pp, zero=layout.zero,
                micro_batch=layout.micro_batch, recompute=layout.recompute)


@dataclass(frozen=True)
class Row:
    predicted: Scored
    seconds: float            # measured step time, median of the timed steps
    peak_bytes: float         # measured peak of the fullest rank

    @property
    def time_error(self) -> float:
        return self.seconds / self.predicted.time.total - 1

    @property
    def memory_error(self) -> float:
        return self.peak_bytes / self.predicted.memory.total - 1


def order_holds(rows: list[Row], top: int = 5) -> bool:
    """Do the predicted ``top`` come out in the same order by measured step time?"""
    first = [r for r in rows if r.predicted.feasible][:top]
    return sorted(first, key=lambda r: r.seconds) == first


def pairs_in_order(rows: list[Row], top: int = 5, tie: float = TIE) -> tuple[int, int]:
    """(pairs ordered as predicted, pairs compared) among the predicted ``top``: a pair
    counts only if its predicted step times differ by more than ``tie`` (a share of the
    faster): closer than that, the prediction does not say which is faster."""
    first, held, compared = [r for r in rows if r.predicted.feasible][:top], 0, 0
    for i, fast in enumerate(first):
        for slow in first[i + 1:]:
            if slow.predicted.time.total > fast.predicted.time.total * (1 + tie):
                compared += 1
                held += slow.seconds > fast.seconds
    return held, compared


def table(rows: list[Row], top: int = 5, memory_limit: float | None = None) -> list[str]:
    """Predicted beside measured, one layout a line, and the verdict on the targets
    (``memory_limit``: this machine's memory in bytes, to say by how much one is over)."""
    MB = 1e6
    lines = [f"{'':>3} {'layout':<36} {'step s':>7} {'measured':>8} {'error':>7}   "
             f"{'peak MB':>7} {'measured':>8} {'error':>7}  {'measured rank':>13}"]
    by_time = sorted(range(len(rows)), key=lambda i: rows[i].seconds)
    notes = []
    for i, row in enumerate(rows):
        p = row.predicted
        mark = f"{i + 1}" if p.feasible else "x"
        if not p.feasible:
            reasons = [f"out of memory: predicted {p.memory.total / MB:.1f} MB, over the "
                       f"{memory_limit / MB:g} MB of --memory" if r.startswith("out of memory")
                       and memory_limit else r for r in p.reasons]
            notes.append(f"  x: excluded by the planner ({'; '.join(reasons)}), run anyway")
        lines.append(f"{mark:>3} {p.layout.short():<36} {p.time.total:7.3f} "
                     f"{row.seconds:8.3f} {row.time_error:+7.1%}   "
                     f"{p.memory.total / MB:7.2f} {row.peak_bytes / MB:8.2f} "
                     f"{row.memory_error:+7.1%}  {by_time.index(i) + 1:>13}")
    lines += notes
    memory_ok = sum(abs(r.memory_error) <= MEMORY_TARGET for r in rows)
    time_ok = sum(abs(r.time_error) <= TIME_TARGET for r in rows)
    lines.append(f"peak memory within {MEMORY_TARGET:.0%}: {memory_ok}/{len(rows)}; "
                 f"step time within {TIME_TARGET:.0%}: {time_ok}/{len(rows)}; "
                 f"measured order of the predicted top {min(top, len(rows))}: "
                 f"{'the same' if order_holds(rows, top) else 'different'}")
    held, compared = pairs_in_order(rows, top)
    lines.append(f"pairs of the top {min(top, len(rows))} predicted more than {TIE:.0%} "
                 f"apart that ran in the predicted order: {held}/{compared} (closer pairs "
                 "are ties)")
    return lines


def measure(bench, spec: ModelSpec, setup: TrainingSetup, ranks: int, *,
            link_bytes: float, inter_bytes: float = 0.0, node_size: int = 0,
            max_micro_batch: int = 4, top: int = 5, rounds: int = 3,
            memory: float = UNLIMITED,
            log=lambda line: None) -> tuple[ClusterSpec, list[Row]]:
    """Calibrate on ``bench`` (parallel/compare/measure.py's Bench), predict every runnable
    layout, and run the ones ``pick`` chooses. Every round runs the two calibration
    steps and then every layout (forwards, then backwards the next round), so that a
    slow spell of a loaded machine falls on calibration and layouts alike; the rows
    are picked with the first round's calibration, and predicted with the median of
    all rounds'. Returns this machine's cluster and the rows, in predicted order."""
    kwargs = gpt_kwargs(spec, setup.seq)
    peak = bench.matmul_flops()
    latency = bench.latency()
    sizes = sorted({1, max(b for b in divisors(max_micro_batch)
                           if (setup.sequences // ranks) % b == 0)})
    times: dict[int, list[float]] = {b: [] for b in sizes}

    def calibrate() -> ClusterSpec:
        for b in sizes:
            alone = dict(alone=True, dp=ranks, tp=1, pp=1, zero=0, micro_batch=b,
                         recompute="none")
            times[b] += bench.run(kwargs, alone, setup.sequences)["all_seconds"]
        efficiency, overhead = fit_compute(spec, setup, ranks, peak,
                                           [(b, _median(times[b])) for b in sizes])
        return this_machine(ranks, peak, efficiency, overhead, link_bytes, inter_bytes,
                            node_size, latency=latency, memory=memory)

    cluster = calibrate()
    layouts = [s.layout for s in pick(predictions(spec, setup, cluster, ranks,
                                                  max_micro_batch), top)]
    seconds: dict[int, list[float]] = {i: [] for i in range(len(layouts))}
    peaks: dict[int, float] = {}
    for r in range(rounds):
        if r:
            cluster = calibrate()
        order = range(len(layouts)) if r % 2 == 0 else reversed(range(len(layouts)))
        for i in order:
            got = bench.run(kwargs, runner_layout(layouts[i]), setup.sequences)
            seconds[i] += got["all_seconds"]
            peaks.setdefault(i, got["peak_bytes"])
            log(f"  round {r + 1}: {layouts[i].short()}  {got['seconds']:.3f} s")
    log(_calibration_line(peak, {b: _median(times[b]) for b in sizes}, cluster, latency))
    scored = [predict(spec, setup, layout, cluster, ranks) for layout in layouts]
    rows = [Row(scored[i], _median(seconds[i]), peaks[i]) for i in range(len(layouts))]
    return cluster, sorted(rows, key=lambda row: (not row.predicted.feasible,
                                                  row.predicted.time.total,
                                                  row.predicted.memory.total))


def _calibration_line(peak: float, alone: dict[int, float], cluster: ClusterSpec,
                      latency: float) -> str:
    """What calibration found: the matmul rate, the whole model's median step alone per
    micro-batch size, the efficiency and overhead fitted to them, a message's latency."""
    return (f"calibration: matmul {peak / 1e9:.2f} GFLOP/s per rank (peak); whole model alone "
            + ", ".join(f"b{b} {seconds:.3f} s" for b, seconds in alone.items())
            + f" -> efficiency {cluster.matmul_efficiency:.1%}, "
            f"{cluster.layer_overhead * 1e3:.2f} ms per layer and micro-batch; "
            f"{latency * 1e6:.0f} us a message")


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
