"""Async TP's fused ops equal the plain collective-then-matmul, forward and backward; the
TP GPT and Llama with ``async_tp`` train to one process's parameters, also under a
GradScaler and a gradient clip; a split the ring cannot make is refused clearly.

The oracle of the fused ops is the plain path in the same world: sequence parallelism's
all-gather (reduce-scatter) of mappings.py and a Tensor matmul, through autograd. The
gathered A is the plain one bit for bit; the products within 1e-12 in float64 (BLAS
rounds a row block's product by another kernel than the whole matrix's; a reduce-scatter
adds in ring order). Drawn: the world (2-4 ranks), the rank of A, the gather / scatter
axis (the contraction axis included), the shard lengths, the number of B's, sum or avg.
"""
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.distributed.worlds import worlds_fixture

worlds = worlds_fixture()      # a world per drawn size, kept for the module
TOL = 1e-12


def _tensor(a, grad=True):
    from minidist import backend
    from minidist.autograd import Tensor
    return Tensor(backend.from_host(np.ascontiguousarray(a)), requires_grad=grad)


def _host(t):
    from minidist import backend
    return backend.to_host(t.data if hasattr(t, "data") else t)


def _gather_case(case):
    """Fused all-gather-matmul against gather_from_sp then matmul, with every gradient."""
    import minidist.distributed as dist
    from minidist.distributed._symmetric_memory.async_tp import fused_all_gather_matmul
    from minidist.parallel.tensor.mappings import gather_from_sp
    n, r = dist.get_world_size(), dist.get_rank()
    rng = np.random.default_rng(case["seed"])
    shape, dim = list(case["shape"]), case["dim"] % len(case["shape"])
    shape[dim] *= n
    a_all = rng.standard_normal(shape)
    k = a_all.shape[-1]
    bs = [rng.standard_normal((k, case["cols"] + i)) for i in range(case["n_b"])]
    d_ys = [rng.standard_normal(a_all.shape[:-1] + (b.shape[1],)) for b in bs]
    d_a = rng.standard_normal(a_all.shape)
    shard = np.split(a_all, n, axis=dim)[r]
    results = []
    for fused in (True, False):
        x, ws = _tensor(shard), [_tensor(b) for b in bs]
        if fused:
            a, ys = fused_all_gather_matmul(x, ws, case["dim"],
                                            bidirectional=case.get("bidi", False))
        else:
            a = gather_from_sp(x, axis=dim)
            ys = [a @ w for w in ws]
        total = (a * _tensor(d_a, False)).sum()
        for y, d in zip(ys, d_ys):
            total = total + (y * _tensor(d, False)).sum()
        total.backward()
        results.append([_host(a)] + [_host(y) for y in ys] + [_host(x.grad)]
                       + [_host(w.grad) for w in ws])
    fused, plain = results
    return {"a_bitwise": bool((fused[0] == plain[0]).all()),
            "rest": max(float(np.abs(f - p).max()) for f, p in zip(fused[1:], plain[1:]))}


def _scatter_case(case):
    """Fused matmul-reduce-scatter against matmul then reduce_scatter_to_sp."""
    import minidist.distributed as dist
    from minidist.distributed._symmetric_memory.async_tp import fused_matmul_reduce_scatter
    from minidist.parallel.tensor.mappings import reduce_scatter_to_sp
    n, r = dist.get_world_size(), dist.get_rank()
    rng = np.random.default_rng(case["seed"] + r)                   # each rank its summand
    shape, dim = list(case["shape"]), case["dim"] % len(case["shape"])
    cols = case["cols"] * (n if dim == len(shape) - 1 else 1)
    if dim < len(shape) - 1:
        shape[dim] *= n
    a, b = rng.standard_normal(shape), rng.standard_normal((shape[-1], cols))
    d_z = rng.standard_normal(np.split(np.zeros(a.shape[:-1] + (cols,)), n, axis=dim)[0].shape)
    results = []
    for fused in (True, False):
        x, w = _tensor(a), _tensor(b)
        if fused:
            z = fused_matmul_reduce_scatter(x, w, case["op"], case["dim"],
                                            bidirectional=case.get("bidi", False))
        else:
            z = reduce_scatter_to_sp(x @ w, axis=dim)
            z = z * (1.0 / n) if case["op"] == "avg" else z
        (z * _tensor(d_z, False)).sum().backward()
        results.append([_host(z), _host(x.grad), _host(w.grad)])
    return max(float(np.abs(f - p).max()) for f, p in zip(*results))


shapes = st.lists(st.integers(1, 3), min_size=2, max_size=3)


@settings(max_examples=8, deadline=None)
@given(n=st.integers(2, 4), shape=shapes, data=st.data(), n_b=st.integers(1, 2),
       cols=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_fused_all_gather_matmul_equals_gather_then_matmul(worlds, n, shape, data, n_b,
                                                            cols, seed):
    dim = data.draw(st.integers(-len(shape), len(shape) - 1), label="gather_dim")
    case = dict(shape=shape, dim=dim, n_b=n_b, cols=cols, seed=seed)
    for result in worlds(n).run(_gather_case, case):
        assert result["a_bitwise"] and result["rest"] <= TOL, (case, result)


@settings(max_examples=8, deadline=None)
@given(n=st.integers(2, 4), shape=shapes, data=st.data(), op=st.sampled_from(["sum", "avg"]),
       cols=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_fused_matmul_reduce_scatter_equals_matmul_then_reduce_scatter(worlds, n, shape, data,
                                                                        op, cols, seed):
    dim = data.draw(st.integers(-len(shape), len(shape) - 1), label="scatter_dim")
    case = dict(shape=shape, dim=dim, op=op, cols=cols, seed=seed)
    for err in worlds(n).run(_scatter_case, case):
        assert err <= TOL, (case, err)


def _uni_and_bi(case):
    """Forward outputs of the one-way and the two-way all-gather-matmul, bit for bit?"""
    import minidist.distributed as dist
    from minidist import backend
    from minidist.distributed._symmetric_memory.ring_matmul import ring_all_gather_matmul
    rng = np.random.default_rng(case["seed"] + dist.get_rank())
    shard = rng.standard_normal(case["shape"])
    k = shard.shape[-1] * (dist.get_world_size() if case["dim"] in (-1, len(shard.shape) - 1) else 1)
    bs = [backend.from_host(rng.standard_normal((k, 2)))]
    one, two = (ring_all_gather_matmul(backend.from_host(shard), bs, case["dim"], None, bidi)
                for bidi in (False, True))
    return all(np.array_equal(backend.to_host(u), backend.to_host(b))
               for u, b in zip([one[0]] + one[1], [two[0]] + two[1]))


@settings(max_examples=4, deadline=None)
@example(n=3, shape=[2, 3], pick=0, op="sum", cols=2, seed=1)       # one hop each way
@example(n=4, shape=[2, 1, 3], pick=5, op="avg", cols=1, seed=2)    # two hops and one
@given(n=st.integers(2, 4), shape=shapes, pick=st.integers(0, 5),
       op=st.sampled_from(["sum", "avg"]), cols=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_bidirectional_rings_equal_the_plain_collective_then_matmul(worlds, n, shape, pick, op,
                                                                   cols, seed):
    """Each chunk sent both ways round (floor(N/2) steps): the same math, forward and
    backward; the gather's outputs are the one-way ring's bit for bit."""
    dim = pick % (2 * len(shape)) - len(shape)                # any axis, counted either way
    case = dict(shape=shape, dim=dim, n_b=1, cols=cols, seed=seed, op=op, bidi=True)
    for result in worlds(n).run(_gather_case, case):
        assert result["a_bitwise"] and result["rest"] <= TOL, (case, result)
    for err in worlds(n).run(_scatter_case, case):
        assert err <= TOL, (case, err)
    assert all(worlds(n).run(_uni_and_bi, case)), case


def _refusals():
    """The messages of each split the ring cannot make, on this rank."""
    import minidist.distributed as dist
    from minidist.distributed._symmetric_memory.async_tp import (fused_all_gather_matmul,
                                                   fused_matmul_reduce_scatter)
    r, found = dist.get_rank(), {}
    tries = {
        "uneven_shards": lambda: fused_all_gather_matmul(_tensor(np.ones((2, 2 + r, 4))),
                                                         [_tensor(np.ones((4, 3)))], 1),
        "uneven_scatter": lambda: fused_matmul_reduce_scatter(
            _tensor(np.ones((2, 5, 4))), _tensor(np.ones((4, 3))), "sum", 1),
        "bad_dim": lambda: fused_all_gather_matmul(_tensor(np.ones((2, 4))),
                                                   [_tensor(np.ones((4, 3)))], 2),
    }
    for name, attempt in tries.items():
        try:
            attempt()
        except ValueError as e:
            found[name] = str(e)
    return found


def test_splits_the_ring_cannot_make_are_refused_clearly(worlds):
    for found in worlds(2).run(_refusals):
        assert "equal shard" in found["uneven_shards"], found
        assert "length 5 does not split into 2 equal chunks" in found["uneven_scatter"], found
        assert "gather_dim=2 is not an axis" in found["bad_dim"], found


def test_async_tp_without_sequence_parallelism_is_refused():
    from minidist.nn import GPTConfig
    from minidist.parallel import TensorParallelGPT
    with pytest.raises(ValueError, match="turn sequence_parallel on"):
        TensorParallelGPT(GPTConfig(block_size=4, vocab_size=8, n_layer=1, n_head=2,
                                    n_embd=8), async_tp=True)


def _model(kind, seed, parallel):
    from minidist.nn import GPT, GPTConfig, Llama, LlamaConfig
    from minidist.parallel import TensorParallelGPT, TensorParallelLlama
    if kind == "gpt":
        cfg = GPTConfig(block_size=8, vocab_size=16, n_layer=2, n_head=4, n_embd=16,
                        dtype="float64", seed=seed)
        return TensorParallelGPT(cfg, None, True, async_tp=True) if parallel else GPT(cfg)
    cfg = LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=20, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4,
                      max_position_embeddings=8, dtype="float64", seed=seed)
    return TensorParallelLlama(cfg, None, True, async_tp=True) if parallel else Llama(cfg)


def _train(kind, seed, parallel):
    """(this rank's parameters after 2 AdamW steps, the dense model's sliced alike)."""
    from minidist import backend
    from minidist.optim import AdamW
    from minidist.parallel.tensor.layers import shard_state_dict
    model = _model(kind, seed, parallel)
    opt = AdamW(model.parameters(), lr=0.01)
    rng = np.random.default_rng(seed)
    for _ in range(2):
        idx = rng.integers(0, 16, (2, 8))
        _, loss = model(backend.from_host(idx), backend.from_host(np.roll(idx, -1, axis=1)))
        loss.backward()
        opt.step()
        opt.zero_grad()
    return {k: backend.to_host(p.data).copy() for k, p in model.named_parameters()}


def _shards(kind, seed, dense):
    from minidist import backend
    from minidist.parallel.tensor.layers import shard_state_dict
    full = {k: backend.from_host(v) for k, v in dense.items()}
    return {k: backend.to_host(v)
            for k, v in shard_state_dict(_model(kind, seed, True), full).items()}


@settings(max_examples=3, deadline=None)
@given(kind=st.sampled_from(["gpt", "llama"]), n=st.sampled_from([2, 4]),
       seed=st.integers(0, 100))
def test_tp_models_with_async_tp_train_to_one_process(worlds, kind, n, seed):
    dense = _train(kind, seed, False)
    world = worlds(n)
    wants = world.run(_shards, kind, seed, dense)
    for rank, params in enumerate(world.run(_train, kind, seed, True)):
        for name, want in wants[rank].items():
            diff = np.abs(params[name] - want).max()
            assert diff <= TOL, f"rank {rank} {name}: {diff:.2e} ({kind}, seed {seed})"


def _user_message_in_flight(seed):
    """A user's own message (tag 703, a shard's shape) posted before the ring and received
    after it: (the ring's output equals the plain gather's, the message arrived intact)."""
    import minidist.distributed as dist
    from minidist import backend
    from minidist.distributed._symmetric_memory.ring_matmul import ring_all_gather_matmul
    n, r = dist.get_world_size(), dist.get_rank()
    rng = np.random.default_rng(seed)
    shards = rng.standard_normal((n, 2, 3))
    b = rng.standard_normal((3, 2))
    mine, inbox = backend.from_host(shards[r]), backend.from_host(np.zeros((2, 3)))
    sent = dist.isend(backend.from_host(-shards[r]), (r + 1) % n, tag=703)
    a_full, (y,) = ring_all_gather_matmul(mine, [backend.from_host(b)], 0)
    dist.irecv(inbox, (r - 1) % n, tag=703).wait()
    sent.wait()
    return (np.array_equal(backend.to_host(a_full), shards.reshape(-1, 3))
            and np.array_equal(backend.to_host(inbox), -shards[(r - 1) % n]))


def test_the_ring_takes_no_users_message_whatever_its_tag(worlds):
    assert all(worlds(3).run(_user_message_in_flight, 5))


def _traced_rings(folder):
    """Rank 0's count of ring steps in the trace of one all-gather-matmul and one
    matmul-reduce-scatter, one way round and both ways; and whether the traces are valid."""
    import os

    import minidist.distributed as dist
    from minidist import trace
    from minidist.backend import xp
    from minidist.distributed._symmetric_memory.ring_matmul import (
        TRACK, ring_all_gather_matmul, ring_matmul_reduce_scatter)
    from minidist.trace.check import check
    n = dist.get_world_size()
    steps, valid = {}, True
    for bidi in (False, True):
        path = os.path.join(folder, f"ring{int(bidi)}.json")
        with trace.record(path):
            ring_all_gather_matmul(xp.ones((2, 3)), [xp.ones((3, 2))], 0, None, bidi)
            ring_matmul_reduce_scatter(xp.ones((2 * n, 3)), xp.ones((3, 2)), 0, None,
                                       bidirectional=bidi)
        dist.barrier()
        loaded = trace.load(path)
        tracks = {(e["pid"], e["tid"]) for e in loaded["traceEvents"] if e.get("ph") == "M"
                  and e.get("name") == "thread_name" and e["args"]["name"] == TRACK}
        steps[bidi] = sum(1 for e in loaded["traceEvents"] if e.get("ph") == "X"
                          and (e["pid"], e["tid"]) in tracks) // n
        valid = valid and not check(loaded)
    return steps, valid


def test_the_rings_take_n_minus_1_steps_one_way_and_n_over_2_both_ways(worlds, tmp_path):
    """Read off the trace's row of chunks in flight, for N = 4: 3 steps each one way
    round, 2 both ways (the reduce-scatter's two arcs side by side, not one after the other)."""
    for steps, valid in worlds(4).run(_traced_rings, str(tmp_path)):
        assert valid and steps == {False: 3 + 3, True: 2 + 2}, steps


def _scaled_clipped(kind, seed, parallel, batches, inf_at=None):
    """AdamW under a GradScaler and a clip of the whole model's norm, one step per batch
    of ``batches`` (indices into one stream of batches); at step ``inf_at`` an inf in
    rank 1's piece of one sliced weight's gradient. The parameters after the last step."""
    from minidist import backend
    import minidist.distributed as dist
    from minidist.autograd.pieces import piece_layout
    from minidist.optim import AdamW, clip_grad_norm_
    from minidist.precision import GradScaler
    model = _model(kind, seed, parallel)
    opt, scaler = AdamW(model.parameters(), lr=0.01), GradScaler(init_scale=2.0 ** 8)
    rng = np.random.default_rng(seed)
    stream = [rng.integers(0, 16, (2, 8)) for _ in range(max(batches) + 1)]
    for step, b in enumerate(batches):
        idx = stream[b]
        _, loss = model(backend.from_host(idx), backend.from_host(np.roll(idx, -1, axis=1)))
        scaler.scale(loss).backward()
        if step == inf_at and dist.get_rank() == 1:
            sliced = next(p for p in model.parameters() if piece_layout(p) is not None)
            sliced.grad.reshape(-1)[0] = np.inf
        scaler.unscale_(opt)
        clip_grad_norm_(model.parameters(), 0.05)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    return {k: backend.to_host(p.data).copy() for k, p in model.named_parameters()}


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")   # clipping the inf step
@pytest.mark.parametrize("kind", ["gpt", "llama"])
def test_async_tp_under_a_grad_scaler_and_a_clip_trains_to_one_process(worlds, kind):
    """The clip's norm and the scaler's inf check reach over the tensor-parallel pieces:
    the run equals one process's with the same scaler and clip (1e-12), and an inf in
    one rank's piece alone skips the step on every rank (the run equals the one without
    that step)."""
    world, seed = worlds(2), 7
    dense = _scaled_clipped(kind, seed, False, [0, 1, 2])
    wants = world.run(_shards, kind, seed, dense)
    clean = world.run(_scaled_clipped, kind, seed, True, [0, 1, 2])
    skipped = world.run(_scaled_clipped, kind, seed, True, [0, 1, 1, 2], 1)
    for rank in range(2):
        for name, want in wants[rank].items():
            assert np.abs(clean[rank][name] - want).max() <= TOL, (rank, name)
            assert np.array_equal(skipped[rank][name], clean[rank][name]), (rank, name)
