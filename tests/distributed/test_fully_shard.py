"""fully_shard (FSDP2) trains a GPT as one process does and as ZeRO-3 does.

Every rank takes its micro-batch of the same global batch; one process takes the
whole batch. Float64 AdamW steps; the parameters (gathered from their Shard(0)
pieces) equal one process's to 1e-12 and ZeRO-3's to 1e-12 (bit for bit at two
ranks, where every sum of two is the same sum). CommDebugMode: per step and unit
(each block, and the root) one all-gather of all its parameters in forward, one
more in backward for a block's recompute with reshard_after_forward, and one
reduce-scatter. Every element lives on one rank; a rank holds at most a row
of padding more per parameter than P / N.
"""
import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from minidist import backend
from tests.distributed.worlds import world_fixture

world = world_fixture([2, 3])
TOL = 1e-12
BATCH = 6


def fsdp_case(case):
    import minidist.distributed as dist
    from minidist.distributed.fsdp import fully_shard, sharded_state_dict
    from minidist.distributed.tensor.debug import CommDebugMode
    from minidist.nn import GPT, GPTConfig
    from minidist.optim import AdamW
    from minidist.parallel import Zero3
    n, r = dist.get_world_size(), dist.get_rank()
    cfg = GPTConfig(block_size=8, vocab_size=11, n_layer=case["layers"], n_head=2, n_embd=8,
                    dtype="float64", seed=case["seed"])
    single, fsdp, zero_model = GPT(cfg), GPT(cfg), GPT(cfg)
    for block in fsdp.blocks:
        fully_shard(block, reshard_after_forward=case["reshard"])
    fully_shard(fsdp)
    zero = Zero3(zero_model, AdamW, lr=1e-2)
    opts = {"single": AdamW(single.parameters(), lr=1e-2),
            "fsdp": AdamW(fsdp.parameters(), lr=1e-2)}
    rng = np.random.default_rng(case["seed"])
    per = BATCH // n
    counts = []
    for _ in range(case["steps"]):
        idx, tgt = rng.integers(0, 11, (BATCH, 8)), rng.integers(0, 11, (BATCH, 8))
        mine = [backend.from_host(a[r * per:(r + 1) * per]) for a in (idx, tgt)]
        _, loss = single(backend.from_host(idx), backend.from_host(tgt))
        loss.backward()
        with CommDebugMode() as comm:
            _, loss = fsdp(*mine)
            loss.backward()
        counts.append(comm.get_phase_counts())
        _, loss = zero(*mine)
        loss.backward()
        for opt in opts.values():
            opt.step()
            opt.zero_grad()
        zero.step()
        zero.zero_grad()
    theirs = {k: backend.to_host(p.data) for k, p in single.named_parameters()}
    zero3 = {k: backend.to_host(v) for k, v in zero.full_state_dict().items()}
    ours = {k: backend.to_host(d.full_tensor().data) for k, d in sharded_state_dict(fsdp).items()}
    local_elems = sum(p.data.size for p in fsdp.parameters())
    zero_elems = sum(s.data.size for s in zero.shards)
    shapes = [(p.shape[0], p.data.size // p.shape[0]) for p in single.parameters()]
    return (ours, theirs, zero3, counts, local_elems, zero_elems, single.num_parameters(),
            shapes)


@settings(max_examples=2, deadline=None)
@given(layers=st.integers(1, 2), steps=st.integers(1, 2), reshard=st.booleans(),
       seed=st.integers(0, 99))
def test_fully_shard_trains_like_one_process_and_zero3(world, layers, steps, reshard, seed):
    n = world.world_size
    case = dict(layers=layers, steps=steps, reshard=reshard, seed=seed)
    pieces = []
    results = world.run(fsdp_case, case)
    n_params, shapes = results[0][6], results[0][7]
    for ours, single, zero3, counts, local_elems, zero_elems, _, _ in results:
        for name, value in ours.items():
            np.testing.assert_allclose(value, single[name], rtol=TOL, atol=TOL, err_msg=name)
            np.testing.assert_allclose(value, zero3[name], rtol=TOL, atol=TOL, err_msg=name)
            if n == 2:
                assert value.tobytes() == zero3[name].tobytes(), name
        units = layers + 1       # every block, and the root (wte = lm_head, wpe, ln_f)
        for c in counts:
            assert c["forward"] == {"all_gather_into_tensor": units}
            assert c["backward"] == {"reduce_scatter_tensor": units,
                                     **({"all_gather_into_tensor": layers} if reshard else {})}
        pieces.append(local_elems)
    # every element lives on exactly one rank: P in all, about P / N each (ZeRO-3: ceil(P_unit
    # / N) per unit); a rank holds at most one row of padding more per parameter
    assert sum(pieces) == n_params
    assert max(pieces) <= sum(-(-rows // n) * width for rows, width in shapes)


def backward_both(single, model, rng, syncs):
    """A backward per item of ``syncs`` (gradient sync on or off for ``model``): one
    process on a whole drawn batch, the sharded model on this rank's rows of it."""
    import minidist.distributed as dist
    n, r = dist.get_world_size(), dist.get_rank()
    per = BATCH // n
    for sync in syncs:
        idx, tgt = rng.integers(0, 11, (BATCH, 8)), rng.integers(0, 11, (BATCH, 8))
        _, loss = single(backend.from_host(idx), backend.from_host(tgt))
        loss.backward()
        model.set_requires_gradient_sync(sync)
        _, loss = model(*(backend.from_host(a[r * per:(r + 1) * per]) for a in (idx, tgt)))
        loss.backward()


def accumulation_case(seed):
    """Two micro-batches, the first with gradient sync off: the gradients equal one
    process's accumulated over the two whole micro-batches; one reduce-scatter per unit."""
    from minidist.distributed.fsdp import fully_shard, sharded_state_dict
    from minidist.distributed.tensor.debug import CommDebugMode
    from minidist.nn import GPT, GPTConfig
    cfg = GPTConfig(block_size=8, vocab_size=11, n_layer=1, n_head=2, n_embd=8,
                    dtype="float64", seed=seed)
    single, model = GPT(cfg), GPT(cfg)
    fully_shard(model.blocks[0])
    fully_shard(model)
    rng = np.random.default_rng(seed)
    with CommDebugMode() as comm:
        backward_both(single, model, rng, (False, True))
    theirs = {k: backend.to_host(p.grad) for k, p in single.named_parameters()}
    errors = {}
    for name, d in sharded_state_dict(model).items():
        grad = d.grad.full_tensor()
        errors[name] = float(np.abs(backend.to_host(grad.data) - theirs[name]).max())
    return errors, comm.get_comm_counts()


def test_gradient_accumulation_without_sync_reduces_once(world):
    for errors, counts in world.run(accumulation_case, 5):
        assert max(errors.values()) <= TOL, errors
        assert counts["reduce_scatter_tensor"] == 2          # the block and the root, once


def policy_backward(policy: dict):
    """One backward of a float64 one-block GPT in one process and under fully_shard
    with ``MixedPrecisionPolicy(**policy)`` (this rank's share of the same batch):
    (the one process's gradients on the host, the sharded model)."""
    import minidist.distributed as dist
    from minidist.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from minidist.nn import GPT, GPTConfig
    n, r = dist.get_world_size(), dist.get_rank()
    cfg = GPTConfig(block_size=8, vocab_size=11, n_layer=1, n_head=2, n_embd=8,
                    dtype="float64", seed=3)
    single, model = GPT(cfg), GPT(cfg)
    fully_shard(model.blocks[0], mp_policy=MixedPrecisionPolicy(**policy))
    fully_shard(model, mp_policy=MixedPrecisionPolicy(**policy))
    rng = np.random.default_rng(3)
    idx, tgt = rng.integers(0, 11, (BATCH, 8)), rng.integers(0, 11, (BATCH, 8))
    _, loss = single(backend.from_host(idx), backend.from_host(tgt))
    loss.backward()
    per = BATCH // n
    _, loss = model(*(backend.from_host(a[r * per:(r + 1) * per]) for a in (idx, tgt)))
    loss.backward()
    return {k: backend.to_host(p.grad) for k, p in single.named_parameters()}, model


def mixed_precision_case(policy):
    """A float64 GPT under fully_shard with a MixedPrecisionPolicy: the gradients' pieces
    stay float64 (the master), their values those of float32 compute / reduction."""
    from minidist.distributed.fsdp import sharded_state_dict
    theirs, model = policy_backward(policy)
    out = {}
    for name, d in sharded_state_dict(model).items():
        grad = backend.to_host(d.grad.full_tensor().data)
        out[name] = (str(d.grad.dtype), float(np.abs(grad - theirs[name]).max()))
    return out


def test_mixed_precision_policy_keeps_float64_master_gradients(world):
    for policy, tol in (({"param_dtype": "float32"}, 1e-5), ({"reduce_dtype": "float32"}, 1e-6),
                        ({}, TOL)):
        for found in world.run(mixed_precision_case, policy):
            for name, (dtype, err) in found.items():
                assert dtype == "float64", (policy, name)
                assert err <= tol, (policy, name, err)
            if policy:   # float32 somewhere: not the float64 bits
                assert max(err for _, err in found.values()) > 0.0, policy


def autocast_grads(reshard, policy):
    """The gradients of two fully_shard MLP units and the root, forward under a
    precision policy that has closed by backward."""
    import minidist
    import minidist.distributed as dist
    from minidist.autograd import Tensor
    from minidist.distributed.fsdp import fully_shard, sharded_state_dict
    from minidist.nn import MLP, Sequential
    from minidist.precision import DelayedScaling, autocast, fp8_autocast
    minidist.manual_seed(0)
    model = Sequential(MLP(8, 16, generator=backend.Generator(1)),
                       MLP(8, 16, generator=backend.Generator(2)))
    for unit in model:
        fully_shard(unit, reshard_after_forward=reshard)
    fully_shard(model)
    rng = np.random.default_rng(dist.get_rank())
    x = Tensor(backend.from_host(rng.standard_normal((4, 8)).astype("float32")))
    with autocast("bf16") if policy == "bf16" else fp8_autocast(DelayedScaling()):
        y = model(x)
    (y * y).sum().backward()
    return {n: backend.to_host(d.grad.full_tensor().data)
            for n, d in sharded_state_dict(model).items()}


def test_a_resharded_unit_recomputes_under_the_forwards_precision_policy(world):
    """reshard_after_forward=True recomputes each unit in backward, after the autocast
    (or FP8) block has closed: the recompute re-enters the policy the forward ran under
    (autograd/recompute.py), so the gradients are the bits of keeping the weights."""
    for policy in ("bf16", "fp8"):
        kept, resharded = world.run(autocast_grads, False, policy), world.run(autocast_grads,
                                                                              True, policy)
        for a, b in zip(kept, resharded):
            for name in a:
                np.testing.assert_array_equal(b[name], a[name], err_msg=f"{policy} {name}")


def scaler_case(bad_rank):
    """One GradScaler step on fully_shard pieces, an inf put into rank ``bad_rank``'s
    piece only: (whether this rank's parameters changed, the new scale)."""
    import minidist.distributed as dist
    from minidist.autograd import Tensor
    from minidist.distributed.fsdp import fully_shard
    from minidist.nn import MLP, Sequential
    from minidist.optim import SGD
    from minidist.precision import GradScaler
    model = Sequential(MLP(8, 16, generator=backend.Generator(1)),
                       MLP(8, 16, generator=backend.Generator(2)))
    for unit in model:
        fully_shard(unit)
    fully_shard(model)
    opt, scaler = SGD(model.parameters(), lr=0.1), GradScaler(init_scale=8.0)
    x = Tensor(backend.from_host(np.ones((2, 8), dtype="float32")))
    scaler.scale(model(x).sum()).backward()
    params = list(model.parameters())
    if dist.get_rank() == bad_rank:
        params[-1].grad[...] = np.inf
    before = [backend.to_host(p.data).copy() for p in params]
    scaler.step(opt)
    scaler.update()
    changed = any(not np.array_equal(backend.to_host(p.data), b) for p, b in zip(params, before))
    return changed, scaler.get_scale()


def test_an_inf_in_one_ranks_piece_makes_every_rank_skip_the_step(world):
    """GradScaler on fully_shard's pieces max-combines found_inf over the mesh (as torch's
    for DTensor gradients): a rank whose own pieces are finite skips the step too."""
    for bad_rank in (None, world.world_size - 1):
        for changed, scale in world.run(scaler_case, bad_rank):
            assert changed == (bad_rank is None)
            assert scale == (8.0 if bad_rank is None else 4.0)


def frozen_case(case):
    """A GPT with its position embedding (the root unit's) and a block's first norm
    frozen (``requires_grad=False`` before fully_shard), trained in one process and under
    fully_shard: (whole parameters, their requires_grad, whether each piece has a .grad)."""
    from minidist.distributed.fsdp import fully_shard, sharded_state_dict
    from minidist.nn import GPT, GPTConfig
    from minidist.optim import AdamW
    cfg = GPTConfig(block_size=8, vocab_size=11, n_layer=1, n_head=2, n_embd=8,
                    dtype="float64", seed=case["seed"])
    single, model = GPT(cfg), GPT(cfg)
    for m in (single, model):
        for name, p in m.named_parameters():
            p.requires_grad = name not in FROZEN
    fully_shard(model.blocks[0], reshard_after_forward=case["reshard"])
    fully_shard(model)
    opts = [AdamW(m.parameters(), lr=1e-2, weight_decay=0.1) for m in (single, model)]
    rng = np.random.default_rng(case["seed"])
    backward_both(single, model, rng, (False, True) if case["accumulate"] else (True,))
    has_grad = {k: p.grad is not None for k, p in model.named_parameters()}
    for opt in opts:
        opt.step()
    theirs = {k: backend.to_host(p.data) for k, p in single.named_parameters()}
    ours = {k: backend.to_host(d.full_tensor().data) for k, d in sharded_state_dict(model).items()}
    trains = {k: p.requires_grad for k, p in model.named_parameters()}
    return ours, theirs, trains, has_grad


FROZEN = ("wpe.weight", "blocks.0.ln_1.weight", "blocks.0.ln_1.bias")


@settings(max_examples=2, deadline=None)
@given(reshard=st.booleans(), accumulate=st.booleans(), seed=st.integers(0, 99))
@example(reshard=True, accumulate=True, seed=0)     # the block's backward recomputes
@example(reshard=False, accumulate=False, seed=1)
def test_a_frozen_parameter_stays_frozen_and_the_rest_train_as_one_process(world, reshard,
                                                                          accumulate, seed):
    """A piece keeps its parameter's requires_grad: a frozen one gets no gradient, so
    AdamW (with weight decay) leaves it as it was, as in one process; it was a trainable
    piece before, moved by 2e-2 in one step."""
    case = dict(reshard=reshard, accumulate=accumulate, seed=seed)
    for ours, theirs, trains, has_grad in world.run(frozen_case, case):
        for name, value in ours.items():
            assert trains[name] == (name not in FROZEN), name
            assert has_grad[name] == (name not in FROZEN), name
            np.testing.assert_allclose(value, theirs[name], rtol=TOL, atol=TOL, err_msg=name)
            if name in FROZEN:
                assert value.tobytes() == theirs[name].tobytes(), name


def split_tie_case(split):
    """Shard a tied GPT's embedding and output layer in two units (as ``split`` says)."""
    from minidist.distributed.fsdp import fully_shard
    from minidist.nn import GPT, GPTConfig
    model = GPT(GPTConfig(block_size=8, vocab_size=11, n_layer=1, n_head=2, n_embd=8,
                          dtype="float64"))
    try:
        for name in split:
            fully_shard(getattr(model, name))
        fully_shard(model)
    except ValueError as e:
        return str(e)
    return None


def test_a_tied_weight_cut_by_two_units_is_refused(world):
    """The tied wte / lm_head sharded apart (the head alone, then the root; or each
    alone) would be two copies stepped apart: one process's weights were 4e-2 away
    after two AdamW steps. fully_shard refuses the second cut and says to shard the
    modules that share it in one unit."""
    for split in (["lm_head"], ["wte", "lm_head"]):
        for message in world.run(split_tie_case, split):
            assert message is not None and "tied weights" in message, split
            assert "in one unit" in message
