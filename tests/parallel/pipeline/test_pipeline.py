"""Pipeline parallelism: schedules are valid, and pipelined training is training.

- Schedules (no processes): for every (p, m, v) each op appears once, a forward
  before its backward; the idealised run never deadlocks, and its bubble and
  peak in-flight count equal minidist.calc.pipeline's formulas exactly. (The
  zero-bubble schedules' own properties: test_zero_bubble.py.)
- The executor in real processes (worlds of 2..4 ranks): the gradients and an
  AdamW step of a GPT cut into pieces equal one process's on the same batch
  (float64, 1e-12), for every schedule; many micro-batches with messages larger
  than the channel do not deadlock.
- Bubbles measured in real processes on a logical clock (each op lasts its
  cost, the sender's clock travels with each message) equal the formulas
  exactly, whatever the load on the machine; wall-clock bubbles with padded
  ops are measured by demos/07 and demos/17, never asserted.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minidist.distributed as dist
from minidist import backend
from minidist.calc.pipeline import (bubble_fraction, dualpipe_v_idle,
                                    peak_inflight_microbatches)
from minidist.comm import World
from minidist.nn import GPT, GPTConfig, Linear, Module
from minidist.parallel.pipeline.executor import measured_bubble, run_pipeline, split_layers
from minidist.parallel.pipeline.gpt import pieces_of_rank, split_gpt, sync_tied_gradients
from minidist.optim import AdamW
from minidist.parallel.pipeline.schedule import (SCHEDULES, chunks_per_rank, make_schedule,
                                                 placement, simulate, virtual_stage)

TOL = 1e-12


# -- schedules as data ---------------------------------------------------------------

def _cases():
    for p in range(1, 6):
        for m in range(1, 13):
            yield "gpipe", p, m, 1
            yield "1f1b", p, m, 1
            for v in (2, 3):
                if m % p == 0:
                    yield "interleaved", p, m, v


@pytest.mark.parametrize("name,p,m,v", list(_cases()))
def test_schedule_runs_each_op_once_and_its_idealised_bubble_is_the_formula(name, p, m, v):
    schedule = make_schedule(name, p, m, v)
    for ops in schedule:
        want = {(k, i, c) for k in "FB" for i in range(m) for c in range(v)}
        assert sorted((o.kind, o.microbatch, o.chunk) for o in ops) == sorted(want)
        for o in ops:   # a forward comes before its backward
            assert ops.index(o) > ops.index(type(o)("F", o.microbatch, o.chunk)) or o.kind == "F"
    timings = simulate(schedule, v, forward_cost=1.0, backward_cost=2.0)   # raises on deadlock
    assert measured_bubble(timings) == pytest.approx(_formula(name, p, m, v), abs=1e-12)
    if name != "interleaved":
        for r, ops in enumerate(schedule):
            held = peak = 0
            for o in ops:
                held += 1 if o.kind == "F" else -1
                peak = max(peak, held)
            assert peak == peak_inflight_microbatches(p, m, name, stage=r)


def _busiest_idle(timelines):
    """The most time a rank spends in no op between the first op anywhere and the last."""
    first = min(start for row in timelines for _, start, _ in row)
    last = max(end for row in timelines for _, _, end in row)
    return max(last - first - sum(end - start for _, start, end in row) for row in timelines)


def _formula(name, p, m, v=1):
    """calc.pipeline's bubble, idle / ideal compute; GPipe idles exactly as long as
    1F1B, (p-1)/m, in that convention."""
    return bubble_fraction(p, m, "1f1b" if name == "gpipe" else name, v)


def test_split_layers_is_balanced_and_refuses_empty_stages():
    assert [len(r) for r in split_layers(10, 4)] == [3, 3, 2, 2]
    with pytest.raises(ValueError, match="cannot split 3 layers into 4"):
        split_layers(3, 4)


def test_a_moe_model_whose_balancing_loss_a_pipeline_would_drop_is_refused():
    """The last piece returns the cross-entropy alone: a router's balancing loss would be
    silently lost, so it is refused; loss-free (bias) balancing is kept."""
    from minidist.nn import Llama, LlamaConfig
    small = dict(n_layer=2, n_head=2, n_embd=8, block_size=8, vocab_size=11, moe_every=1)
    with pytest.raises(ValueError, match="balancing loss of 2 layer"):
        split_gpt(GPT(GPTConfig(**small)), 2)                     # moe_aux_coef 0.01
    with pytest.raises(ValueError, match="moe_z_coef=0"):
        split_gpt(GPT(GPTConfig(moe_aux_coef=0.0, moe_z_coef=1e-3, **small)), 2)
    assert len(split_gpt(GPT(GPTConfig(moe_aux_coef=0.0, moe_bias_rate=1e-3, **small)), 2)) == 2
    llama = dict(vocab_size=11, hidden_size=8, intermediate_size=8, num_hidden_layers=2,
                 num_attention_heads=2, num_local_experts=4)
    with pytest.raises(ValueError, match="router_aux_loss_coef=0"):
        split_gpt(Llama(LlamaConfig(router_aux_loss_coef=0.01, **llama)), 2)
    assert len(split_gpt(Llama(LlamaConfig(**llama)), 2)) == 2


def test_pieces_recompute_their_blocks_under_config_checkpoint():
    """config.checkpoint: a piece runs each block again in its backward (the whole
    model's activation checkpointing), and not in eval mode or without the flag."""
    for flag, training, calls in ((True, True, 4), (False, True, 2), (True, False, 2)):
        model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=8, block_size=4, vocab_size=11,
                              dtype="float64", checkpoint=flag))
        model.train(training)
        counted = []
        for block in model.blocks:
            def counting(x, forward=block.forward):
                counted.append(1)
                return forward(x)
            block.forward = counting
        (piece,) = split_gpt(model, 1)
        idx = backend.from_host(np.zeros((1, 4), dtype=np.int64))
        piece(idx, idx).backward()
        assert len(counted) == calls, (flag, training)


def test_interleaved_needs_microbatches_a_multiple_of_stages():
    with pytest.raises(ValueError, match="multiple of the stages"):
        make_schedule("interleaved", 4, 6, 2)


# -- the executor in real processes ----------------------------------------------------

class Restarting:
    """A world for the module, started again if a failing case brought it down."""

    def __init__(self, n: int, **options):
        self.world_size, self.options = n, dict(timeout=20.0, run_timeout=90.0, **options)
        self.world = World(n, **self.options)

    def run(self, fn, *args):
        if self.world.closed:
            self.world = World(self.world_size, **self.options)
        return self.world.run(fn, *args)


@pytest.fixture(scope="module", params=[2, 3, 4], ids=lambda n: f"pp{n}")
def world(request):
    # small channel slots: activations are cut into pieces, as large ones are
    w = Restarting(request.param, slot_bytes=4096)
    yield w
    w.world.close()


def _config(case, pieces):
    return GPTConfig(block_size=4, vocab_size=11, n_layer=pieces + case["extra_layers"],
                     n_head=2, n_embd=8, tie_weights=case["tie"], dtype="float64",
                     seed=case["seed"], checkpoint=case.get("checkpoint", False))


def _batch(case, cfg):
    rng = np.random.default_rng(case["seed"])
    shape = (case["m"] * case["mb"], cfg.block_size)
    return rng.integers(0, cfg.vocab_size, shape), rng.integers(0, cfg.vocab_size, shape)


def pipeline_gpt_grads(case):
    """Every rank: its pieces of the GPT through one pipelined step and an AdamW
    step -> its gradients and updated parameters."""
    p, r = dist.get_world_size(), dist.get_rank()
    v, m, where = case["v"], case["m"], placement(case["schedule"])
    cfg = _config(case, p * v)
    model = GPT(cfg)
    chunks = pieces_of_rank(split_gpt(model, p, v), r, p, where)
    idx, tgt = (np.split(a, m) for a in _batch(case, cfg))
    ops = make_schedule(case["schedule"], p, m, v)[r]
    stats = run_pipeline(ops, chunks, m, [backend.from_host(a) for a in idx],
                         [backend.from_host(a) for a in tgt],
                         activation_shape=(case["mb"], cfg.block_size, cfg.n_embd),
                         dtype="float64", placement=where)
    sync_tied_gradients(model, chunks)
    mine = [(n, q) for n, q in model.named_parameters()
            if any(q is c for chunk in chunks for c in chunk.parameters())]
    grads = {n: backend.to_host(q.grad) for n, q in mine}
    AdamW([q for _, q in mine], lr=0.01).step()
    return grads, stats.losses, {n: backend.to_host(q.data) for n, q in mine}


def single_process_grads(case, pieces):
    cfg = _config(case, pieces)
    model = GPT(cfg)
    idx, tgt = _batch(case, cfg)
    _, loss = model(backend.from_host(idx), backend.from_host(tgt))
    loss.backward()
    grads = {n: backend.to_host(q.grad) for n, q in model.named_parameters()}
    AdamW(model.parameters(), lr=0.01).step()
    stepped = {n: backend.to_host(q.data) for n, q in model.named_parameters()}
    return grads, float(loss.data), stepped


@st.composite
def pipeline_cases(draw, p):
    schedule = draw(st.sampled_from(SCHEDULES))
    v = chunks_per_rank(schedule, draw(st.integers(2, 3)))
    m = p * draw(st.integers(1, 3)) if schedule == "interleaved" else draw(st.integers(1, 7))
    if schedule == "dualpipe_v":
        m = 2 * p + draw(st.integers(0, 2))        # DualPipeV needs m >= 2p
    return dict(schedule=schedule, v=v, m=m, mb=draw(st.integers(1, 2)),
                extra_layers=draw(st.integers(0, 2)), tie=draw(st.booleans()),
                checkpoint=draw(st.sampled_from([False, True, "selective"])),
                seed=draw(st.integers(0, 2**16)))


@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_every_schedule_gives_the_single_process_gradients(world, data):
    _check_against_one_process(world, data.draw(pipeline_cases(world.world_size)))


@settings(max_examples=1, deadline=None)
@given(extra=st.integers(0, 2), tie=st.booleans(), checkpoint=st.booleans(),
       seed=st.integers(0, 2**16))
def test_dualpipe_v_gives_the_single_process_gradients(world, extra, tie, checkpoint, seed):
    p = world.world_size
    _check_against_one_process(world, dict(schedule="dualpipe_v", v=2, m=2 * p + extra, mb=2,
                                           extra_layers=1, tie=tie, checkpoint=checkpoint,
                                           seed=seed))


def _check_against_one_process(world, case):
    """The pipelined step's gradients, AdamW step and loss equal one process's."""
    p = world.world_size
    results = world.run(pipeline_gpt_grads, case)
    want, loss, want_stepped = single_process_grads(case, p * case["v"])
    got, stepped = {}, {}
    for grads, _, params in results:
        for name, g in grads.items():
            if name in got:     # the tied matrix: on the first and the last stage alike
                assert np.array_equal(got[name], g)
                assert np.array_equal(stepped[name], params[name])
            got[name], stepped[name] = g, params[name]
    assert set(got) == set(want)
    for name in want:
        assert np.abs(got[name] - want[name]).max() <= TOL, (case, name)
        assert np.abs(stepped[name] - want_stepped[name]).max() <= TOL, (case, name)
    # the loss is on the rank of the last piece: rank p - 1, or rank 0 in zb_v's V
    losses = [np.mean(ls) for _, ls, _ in results if ls]
    assert len(losses) == 1 and abs(losses[0] - loss) <= TOL


class Dense(Module):
    """A piece of a plain MLP, for the stress test: x -> tanh(x W^T); loss = mean(y^2)."""

    def __init__(self, width, seed, first, last):
        super().__init__()
        self.lin = Linear(width, width, dtype="float64", generator=backend.Generator(seed))
        self.first, self.last = first, last

    def forward(self, x, target=None):
        y = self.lin(x).tanh()
        return (y * y).mean() if self.last else y


def _dense_chunks(schedule, v, width):
    p, r = dist.get_world_size(), dist.get_rank()
    pieces = [virtual_stage(r, c, p, placement(schedule)) for c in range(v)]
    return [Dense(width, s, s == 0, s == p * v - 1) for s in pieces]


def many_microbatches(schedule, m, v, width):
    p, r = dist.get_world_size(), dist.get_rank()
    chunks = _dense_chunks(schedule, v, width)
    rng = np.random.default_rng(0)
    inputs = [backend.from_host(rng.standard_normal((4, width))) for _ in range(m)]
    ops = make_schedule(schedule, p, m, v)[r]
    stats = run_pipeline(ops, chunks, m, inputs, [None] * m, activation_shape=(4, width),
                         dtype="float64", placement=placement(schedule))
    return len(stats.timeline)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_many_microbatches_and_large_messages_never_deadlock(world, schedule):
    p = world.world_size
    v = chunks_per_rank(schedule, 2)
    m = 8 * p
    # 4 x 640 float64 = 20 KiB per message, more than the channel's four 4 KiB
    # slots: a blocking send would wait for its receiver here (p2p.py)
    want = [len(ops) for ops in make_schedule(schedule, p, m, v)]     # an F&B is one op
    assert world.run(many_microbatches, schedule, m, v, 640) == want


# -- measured bubbles ------------------------------------------------------------------

def clocked_step(schedule, m, v):
    """A pipelined step in real processes, timed on the logical clock: a forward
    costs 1, a backward 2 (B 1 and W 1 where split)."""
    p, r = dist.get_world_size(), dist.get_rank()
    chunks = _dense_chunks(schedule, v, 8)
    inputs = [backend.from_host(np.ones((2, 8))) for _ in range(m)]
    ops = make_schedule(schedule, p, m, v)[r]
    stats = run_pipeline(ops, chunks, m, inputs, [None] * m, activation_shape=(2, 8),
                         dtype="float64", op_costs=(1.0, 2.0), placement=placement(schedule))
    return stats.timeline, stats.peak_inflight


@pytest.fixture(scope="module")
def world4():
    w = Restarting(4)
    yield w
    w.world.close()


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_bubble_measured_in_processes_on_the_logical_clock_is_the_formula(world4, schedule):
    p, m = 4, 8
    v = chunks_per_rank(schedule, 2)
    results = world4.run(clocked_step, schedule, m, v)
    timelines = [timeline for timeline, _ in results]
    if schedule == "dualpipe_v":   # the README's idle of the busiest rank (dualpipe.py):
        # chunk costs F = W = 1/2, B = 1, F&B = F + B: (p - 1)(F&B + B - 3W)
        assert _busiest_idle(timelines) == pytest.approx(dualpipe_v_idle(p, 0.5, 1.0, 0.5))
    else:
        assert measured_bubble(timelines) == pytest.approx(_formula(schedule, p, m, v),
                                                           abs=1e-12)
    # the same numbers as the idealised run of the same orders
    ideal = simulate(make_schedule(schedule, p, m, v), v, 1.0, 2.0, placement=placement(schedule))
    assert [[(o, a, b) for o, a, b in row] for row in timelines] == ideal
    if schedule in ("gpipe", "1f1b"):
        peaks = [peak for _, peak in results]
        assert peaks == [peak_inflight_microbatches(p, m, schedule, r) for r in range(p)]


# -- what travels ------------------------------------------------------------------

def bytes_sent_in_a_step(schedule, m, v, width):
    """(bytes this rank sent during one step, one message's bytes)."""
    from minidist.comm.group import world_group
    p, r = dist.get_world_size(), dist.get_rank()
    chunks = _dense_chunks(schedule, v, width)
    inputs = [backend.from_host(np.ones((4, width))) for _ in range(m)]
    ops = make_schedule(schedule, p, m, v)[r]
    before = world_group().stats.bytes_sent
    run_pipeline(ops, chunks, m, inputs, [None] * m, activation_shape=(4, width),
                 dtype="float64", placement=placement(schedule))
    return world_group().stats.bytes_sent - before


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_each_rank_sends_an_activation_and_a_gradient_only_across_ranks(world, schedule):
    """Per micro-batch, piece s's activation goes to s + 1 and s + 1's gradient back:
    a message only where the two pieces sit on different ranks (the V placements'
    consecutive pieces on one rank hand over in memory, as torch's stages do)."""
    p, width = world.world_size, 16
    v, where = chunks_per_rank(schedule, 2), placement(schedule)
    m = 2 * p
    sent = [0] * p
    for s in range(p * v - 1):
        here = virtual_stage_rank(s, p, v, where)
        there = virtual_stage_rank(s + 1, p, v, where)
        if here != there:
            sent[here] += m        # activations forward
            sent[there] += m       # gradients back
    got = world.run(bytes_sent_in_a_step, schedule, m, v, width)
    assert got == [k * 4 * width * 8 for k in sent]


def virtual_stage_rank(s, p, v, where):
    """The rank holding piece s."""
    return next(r for r in range(p) for c in range(v) if virtual_stage(r, c, p, where) == s)
