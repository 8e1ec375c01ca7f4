"""parallelize_llama over every dimension: a drawn layout of at most 8 ranks over
dp_replicate, dp_shard, cp, tp and pp (and ep for the MoE Llama) trains the Llama, dense
or MoE with its balancing loss, to the parameters of one process (float64, 1e-12), under
every pipeline schedule, with the whole model's gradient clipping; the loss each rank
returns and the norm each clips by are one process's. The oracle runs the same
micro-batches (micro-batch j = every data shard's j-th rows) one after the other.

Also: ParallelDims' usage errors, and the groups of the mesh it builds (the flattened
dp_cp, dp_shard_cp and ep, the one EP borrows from dp_shard x cp)."""
import math

import numpy as np
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from minidist import backend
from minidist.nn import Llama, LlamaConfig
from minidist.optim import AdamW, clip_grad_norm_
from minidist.parallel.compose.parallel_dims import ParallelDims, ParallelDimsError, degrees_of
from tests.distributed.worlds import worlds_fixture

worlds = worlds_fixture(timeout=30.0, run_timeout=120.0)   # a world per drawn size

STEPS, T, VOCAB, LR = 2, 8, 16, 0.01
MAX_NORM = 0.05          # below every step's gradient norm here: each step is clipped
DIMS = ("dp_replicate", "dp_shard", "cp", "tp", "pp")


def _config(case):
    moe = dict(num_local_experts=4, num_experts_per_tok=2,
               router_aux_loss_coef=0.02) if case["moe"] else {}
    layers = 4 if case["schedule"] in ("interleaved", "zb_v", "dualpipe_v") else 2  # 2 chunks a rank
    return LlamaConfig(vocab_size=VOCAB, hidden_size=8, intermediate_size=8,
                       num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=T, dtype="float64", seed=case["seed"],
                       checkpoint=case.get("checkpoint", False),
                       moe_bias_rate=1e-300 if "skipped" in case else 0.0, **moe)


def _rows(case):
    """(data shards, micro-batches, rows per micro-batch and shard)."""
    return case["dims"]["dp_replicate"] * case["dims"]["dp_shard"], case["m"], 2


def _batches(case):
    rng = np.random.default_rng(case["seed"])
    dp, m, mb = _rows(case)
    return [(rng.integers(0, VOCAB, (dp * m * mb, T)), rng.integers(0, VOCAB, (dp * m * mb, T)))
            for _ in range(STEPS)]


def _freeze(model, case):
    """``model`` with the parameters named in ``case["frozen"]`` (if any) frozen, and the
    expert ``case["skipped"]`` (if any) kept from every token by its selection bias."""
    for name, q in model.named_parameters():
        q.requires_grad = name not in case.get("frozen", ())
    if "skipped" in case:
        from minidist.nn.moe import routers
        for moe in routers(model):    # (the config's rate too small to move it by a bit)
            moe.expert_bias[case["skipped"]] = -1e9
    return model


def train_single(case):
    """One process, micro-batch j holding every data shard's j-th rows: the parameters,
    and per step the loss and the clipped norm."""
    model = _freeze(Llama(_config(case)), case)
    opt = AdamW(model.parameters(), lr=LR)
    dp, m, mb = _rows(case)
    losses, norms = [], []
    for idx, tgt in _batches(case):
        rows = m * mb
        total = 0.0
        for j in range(m):
            sel = np.concatenate([np.arange(d * rows + j * mb, d * rows + (j + 1) * mb)
                                  for d in range(dp)])
            _, loss = model(backend.from_host(idx[sel]), backend.from_host(tgt[sel]))
            (loss / m).backward()
            total += float(loss.item()) / m
        norms.append(clip_grad_norm_(model.parameters(), MAX_NORM) if case["clip"] else None)
        opt.step()
        opt.zero_grad()
        losses.append(total)
    return {n: backend.to_host(q.data) for n, q in model.named_parameters()}, losses, norms


def train_parallel(case, dense):
    """Every rank: its share trained -> (max |piece - dense piece|, losses, norms)."""
    from minidist.parallel import parallelize_llama
    dims = ParallelDims(**case["dims"])
    dense_model = _freeze(Llama(_config(case)), case)
    model = parallelize_llama(dense_model, dims.build_mesh(), dims, case["m"],
                              case["schedule"], sequence_parallel=case["sp"],
                              max_grad_norm=MAX_NORM if case["clip"] else None,
                              cp_kind=case["cp_kind"])
    opt = AdamW(model.parameters(), lr=LR)
    losses, norms = [], []
    for idx, tgt in _batches(case):
        losses.append(model.train_step(backend.from_host(idx), backend.from_host(tgt), opt))
        norms.append(model.last_grad_norm)
    want = model.shard_of({n: backend.from_host(a) for n, a in dense.items()})
    got = model.named_parameters()
    err = max(float(np.abs(backend.to_host(got[n].data) - backend.to_host(want[n])).max(
        initial=0.0)) for n in got)                    # (an FSDP piece may hold no rows)
    return err, losses, norms


@st.composite
def layouts(draw, moe: bool):
    """Degrees of 1 or 2 on each dimension, at most 8 ranks; ep as EP may borrow."""
    dims = {d: draw(st.sampled_from([1, 2])) for d in DIMS}
    assume(math.prod(dims.values()) <= 8)
    eps = [e for e in (1, 2, 4) if e % dims["cp"] == 0 and (dims["dp_shard"] * dims["cp"]) % e == 0]
    dims["ep"] = draw(st.sampled_from(eps)) if moe else 1
    return dims


def _check(worlds, case):
    dense, losses, norms = train_single(case)
    world = math.prod(case["dims"][d] for d in DIMS)
    for err, got_losses, got_norms in worlds(world).run(train_parallel, case, dense):
        assert err <= 1e-12, (case, err)
        for want, got in zip(losses, got_losses):             # the whole batch's loss
            assert abs(got - want) <= 1e-12, (case, losses, got_losses)
        for want, got in zip(norms, got_norms):               # the whole model's norm
            assert want is None or abs(got - want) <= 1e-12 * want, (case, norms, got_norms)


def _case(dims, moe, schedule="1f1b", m=2, sp=False, clip=True, cp_kind="ring", seed=0):
    full = {d: 1 for d in DIMS + ("ep",)}
    full.update(dims)
    if full["tp"] * full["cp"] > 2:   # Ulysses: tp x cp must divide the 2 key/value heads
        cp_kind = "ring"
    return dict(dims=full, moe=moe, schedule=schedule, m=m, sp=sp, clip=clip,
                cp_kind=cp_kind, seed=seed)


SCHEDULES = ["gpipe", "1f1b", "interleaved", "zb_v"]


@settings(max_examples=4, deadline=None)
@given(dims=layouts(moe=False), schedule=st.sampled_from(SCHEDULES), m=st.sampled_from([1, 2]),
       sp=st.booleans(), clip=st.booleans(), cp_kind=st.sampled_from(["ring", "ulysses"]),
       seed=st.integers(0, 100))
@example(dims=dict(dp_replicate=1, dp_shard=2, cp=2, tp=2, pp=1, ep=1), schedule="1f1b", m=1,
         sp=False, clip=True, cp_kind="ring", seed=1)
@example(dims=dict(dp_replicate=2, dp_shard=1, cp=1, tp=2, pp=2, ep=1), schedule="interleaved",
         m=2, sp=True, clip=True, cp_kind="ring", seed=2)
def test_composed_dense_llama_trains_as_one_process(worlds, dims, schedule, m, sp, clip,
                                                    cp_kind, seed):
    case = _case(dims, False, schedule, m, sp and dims["tp"] > 1, clip, cp_kind, seed)
    _check(worlds, case)


@settings(max_examples=4, deadline=None)
@given(dims=layouts(moe=True), schedule=st.sampled_from(SCHEDULES), m=st.sampled_from([1, 2]),
       clip=st.booleans(), cp_kind=st.sampled_from(["ring", "ulysses"]),
       seed=st.integers(0, 100))
@example(dims=dict(dp_replicate=1, dp_shard=2, cp=2, tp=1, pp=2, ep=4), schedule="1f1b", m=2,
         clip=True, cp_kind="ring", seed=3)
@example(dims=dict(dp_replicate=2, dp_shard=1, cp=1, tp=2, pp=2, ep=1), schedule="zb_v", m=2,
         clip=True, cp_kind="ring", seed=4)
@example(dims=dict(dp_replicate=1, dp_shard=2, cp=1, tp=2, pp=1, ep=2), schedule="gpipe", m=2,
         clip=True, cp_kind="ring", seed=5)
def test_composed_moe_llama_trains_as_one_process_balancing_loss_included(
        worlds, dims, schedule, m, clip, cp_kind, seed):
    _check(worlds, _case(dims, True, schedule, m, False, clip, cp_kind, seed))


FROZEN = ("model.embed_tokens.weight", "model.layers.0.input_layernorm.weight",
          "model.layers.1.self_attn.q_proj.weight", "model.layers.0.mlp.up_proj.weight",
          "model.layers.0.mlp.experts.1.up_proj.weight")


@pytest.mark.parametrize("dims, moe", [(dict(tp=2), False), (dict(dp_shard=2, ep=2), True)])
def test_frozen_parameters_stay_frozen_and_the_rest_trains_as_one_process(worlds, dims, moe):
    """A parameter frozen in the Llama stays frozen in its tensor-parallel twin, and a
    frozen expert takes no gradient: before, the twin trained the frozen ones (2e-2 away
    after two AdamW steps, the clipped norm another) and a frozen expert was decayed."""
    _check(worlds, {**_case(dims, moe), "frozen": FROZEN})


@pytest.mark.parametrize("dims", [dict(dp_shard=2, ep=2), dict(dp_replicate=2, dp_shard=2, ep=2)],
                         ids=["dp_shard2_ep2", "dp_replicate2_dp_shard2_ep2"])
def test_an_expert_no_token_reaches_trains_as_one_process(worlds, dims):
    """An expert the router never picks runs on zero rows in one process and under ep
    alike: a zero gradient, which AdamW's weight decay steps the same on both sides. The
    router's selection bias that keeps it out is the dense model's: parallelize_llama's
    twin took the weights only and routed with zeros (experts 4e-2 from one process)."""
    _check(worlds, {**_case(dims, True), "skipped": 1})


def _mesh_groups(dims):
    """Every rank: the ranks of each named (and flattened) dimension's group."""
    mesh = ParallelDims(**dims).build_mesh()
    names = ("pp", "dp_replicate", "dp_shard", "cp", "tp", "dp", "dp_shard_cp", "dp_cp", "ep",
             "dp_mod_ep")
    for name in names:       # the root mesh answers a flattened name as its sub-mesh does
        assert mesh.get_group(name) is mesh[name].get_group(), name
    return {name: list(mesh[name].get_group().ranks) for name in names}


def test_build_mesh_flattens_dp_cp_and_borrows_ep_from_dp_shard_times_cp(worlds):
    """8 ranks as pp=2 x dp_shard=2 x cp=2, ep=2: rank = 4 pp + 2 dp_shard + cp, so
    rank 5 (pp 1, dp_shard 0, cp 1) has dp_cp = dp_shard_cp = {4..7}, and ep = its cp
    pair {4, 5} (ep = cp: dp_shard_in_ep = 1), the experts' replicas over dp_shard {5, 7}."""
    groups = worlds(8).run(_mesh_groups, dict(dp_shard=2, cp=2, pp=2, ep=2))
    g = groups[5]
    assert g["pp"] == [1, 5] and g["cp"] == [4, 5] and g["dp_shard"] == [5, 7]
    assert g["dp_cp"] == g["dp_shard_cp"] == [4, 5, 6, 7]
    assert g["ep"] == [4, 5] and g["dp_mod_ep"] == [5, 7]
    assert g["tp"] == g["dp_replicate"] == [5]


@pytest.mark.parametrize("degrees, words", [
    (dict(dp_shard=2, tp=3), r"dp_shard=2 x cp=1 x tp=3 is 6 ranks, not the world size 4"),
    (dict(dp_shard=2, tp=2, ep=4), r"ep=4 .* must be a multiple of cp=1 and divide 2"),
    (dict(dp_shard=2, cp=2, ep=2, expert_parallel=2), r"unknown dimension 'expert_parallel'"),
    (dict(tp=0, dp_shard=4), r"tp=0: every degree is a whole number of at least 1"),
])
def test_parallel_dims_refuses_bad_degrees_naming_the_fix(degrees, words):
    with pytest.raises(ParallelDimsError, match=words):
        degrees_of(4, **degrees)


def test_parallel_dims_refuses_what_the_model_cannot_cut():
    cfg = LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=8, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, num_local_experts=6,
                      max_position_embeddings=12)
    with pytest.raises(ParallelDimsError, match=r"ep=4 does not divide the 6 experts"):
        ParallelDims(dp_shard=4, ep=4).check_model(cfg)
    with pytest.raises(ParallelDimsError, match=r"zigzag .* 2 x cp = 8 chunks, and 12 tokens"):
        ParallelDims(cp=4).check_model(cfg, seq_len=12)
    ParallelDims(cp=3, ep=3).check_model(cfg, seq_len=12)             # 6 chunks of 2
