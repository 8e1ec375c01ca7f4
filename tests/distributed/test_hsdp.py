"""HSDP (fully_shard on a 2-D mesh) trains a GPT, a Llama and an MoE Llama (its routers'
balancing loss included) as one process does.

Mesh (R, S) = (2, 2) and (2, 3): dim 0 replicates, dim 1 shards (torch's convention).
Every rank takes its rows of the same global batch; one process takes the whole batch.
Float64 AdamW steps with gradient clipping (the norm counts each piece once, not once
per replica); the parameters, gathered from their pieces, equal one process's to 1e-12.
Every parameter is placed (Replicate(), Shard(0)); the R ranks that hold the same piece
hold the same bits after each step (the all-reduce's postcondition). CommDebugMode per
step and unit: one all-gather in forward (one more in backward for a resharded block's
recompute), one reduce-scatter and one all-reduce in backward.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist import backend
from minidist.backend import get_backend
from tests.distributed.worlds import world_fixture

world = world_fixture([4, 6])
TOL, STEPS, PER, LENGTH = 1e-12, 2, 2, 8


def _model(case):
    from minidist.nn import GPT, GPTConfig, Llama, LlamaConfig
    if case["model"] == "gpt":
        return GPT(GPTConfig(block_size=LENGTH, vocab_size=11, n_layer=2, n_head=2, n_embd=8,
                             dtype="float64", seed=case["seed"]))
    # the MoE layers balance each rank's rows (moe_balance="micro_batch"), so one process
    # runs the ranks' rows as micro-batches (one_process)
    moe = dict(num_local_experts=3, num_experts_per_tok=2, moe_intermediate_size=6,
               n_shared_experts=1, router_aux_loss_coef=0.01,
               moe_balance="micro_batch") if case["model"] == "moe_llama" else {}
    return Llama(LlamaConfig(vocab_size=11, hidden_size=16, intermediate_size=20,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=LENGTH, dtype="float64",
                             seed=case["seed"], **moe))


def _blocks(case, model):
    return model.blocks if case["model"] == "gpt" else model.model.layers


def _batches(case, n):
    rng = np.random.default_rng(case["seed"])
    idx = rng.integers(0, 11, (STEPS, n * PER, LENGTH))
    return idx, rng.integers(0, 11, (STEPS, n * PER, LENGTH))


def train(case, model, parts):
    """STEPS clipped AdamW steps on the rows ``parts`` (a list of slices, run in turn as
    micro-batches, each loss divided by their number) of each step's batch;
    CommDebugMode's counts."""
    from minidist import backend
    from minidist.distributed.tensor.debug import CommDebugMode
    from minidist.optim import AdamW, clip_grad_norm_
    opt = AdamW(model.parameters(), lr=1e-2)
    idx, tgt = _batches(case, case["n"])
    counts = []
    for s in range(STEPS):
        with CommDebugMode() as comm:
            for rows in parts:
                _, loss = model(backend.from_host(idx[s, rows]),
                                backend.from_host(tgt[s, rows]))
                (loss * (1.0 / len(parts))).backward()
        counts.append(comm.get_phase_counts())
        clip_grad_norm_(model.parameters(), max_norm=0.05)
        opt.step()
        opt.zero_grad()
    return counts


def parameters_of(state):
    """The DTensors of a sharded state dict: its parameters, the buffers left out."""
    return {n: d for n, d in state.items() if hasattr(d, "full_tensor")}


def hsdp_case(case):
    """This rank's run under HSDP: (counts per step, whole parameters, local pieces,
    placements as text, mesh coordinate)."""
    import minidist.distributed as dist
    from minidist import backend
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.fsdp import fully_shard, sharded_state_dict
    mesh = init_device_mesh(backend.device_type(), case["mesh"], mesh_dim_names=("dp_replicate", "dp_shard"))
    model = _model(case)
    for block in _blocks(case, model):
        fully_shard(block, mesh=mesh, reshard_after_forward=case["reshard"])
    fully_shard(model, mesh=mesh)
    r = dist.get_rank()
    counts = train(case, model, [slice(r * PER, (r + 1) * PER)])
    state = parameters_of(sharded_state_dict(model))
    whole = {k: backend.to_host(d.full_tensor().data).copy() for k, d in state.items()}
    local = {k: backend.to_host(d.to_local().data).copy() for k, d in state.items()}
    placements = {k: [repr(p) for p in d.placements] for k, d in state.items()}
    return counts, whole, local, placements, mesh.get_coordinate()


def one_process(case):
    from minidist import backend
    model = _model(case)
    n = case["n"]
    parts = ([slice(r * PER, (r + 1) * PER) for r in range(n)] if case["model"] == "moe_llama"
             else [slice(None)])
    train(case, model, parts)
    return {k: backend.to_host(p.data).copy() for k, p in model.named_parameters()}


MESHES = {4: [(2, 2)], 6: [(2, 3)]}


@pytest.mark.parametrize("model", ["gpt", "llama", "moe_llama"])
@settings(max_examples=1, deadline=None)
@given(data=st.data(), reshard=st.booleans(), seed=st.integers(0, 99))
def test_hsdp_trains_like_one_process(world, model, data, reshard, seed):
    n = world.world_size
    mesh = data.draw(st.sampled_from(MESHES[n]))
    case = dict(model=model, reshard=reshard, seed=seed, n=n, mesh=mesh)
    ref = one_process(case)
    results = world.run(hsdp_case, case)
    layers, units = 2, 3                               # a unit per block, and the root
    for counts, whole, _, placements, _ in results:
        for c in counts:
            assert c["forward"] == {"all_gather_into_tensor": units}, c
            assert c["backward"] == {"reduce_scatter_tensor": units, "all_reduce": units,
                                     **({"all_gather_into_tensor": layers}
                                        if reshard and model != "moe_llama" else {})}, c
        for name, value in whole.items():
            assert placements[name] == ["Replicate()", "Shard(dim=0)"], placements[name]
            diff = float(np.abs(value - ref[name]).max())
            assert diff <= TOL, f"{name}: {diff:.2e} ({case})"
    by_piece = {}                                      # shard coordinate -> local pieces
    for _, _, local, _, (_, s) in results:
        first = by_piece.setdefault(s, local)
        for name in local:
            assert local[name].tobytes() == first[name].tobytes(), (s, name)


def bad_input_case():
    """fully_shard on a 3-D mesh, and reshard_after_forward=4 on a (2, 2) mesh (4 does not
    divide the 2 ranks that shard): the errors' messages."""
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.fsdp import fully_shard
    from minidist.nn import Linear
    messages = []
    for shape, reshard in (((2, 2, 1), True), ((2, 2), 4)):
        mesh = init_device_mesh(backend.device_type(), shape, mesh_dim_names=("a", "b", "c")[:len(shape)])
        try:
            fully_shard(Linear(4, 4), mesh=mesh, reshard_after_forward=reshard)
            messages.append(None)
        except ValueError as e:
            messages.append(str(e))
    return messages


def test_a_three_dimensional_mesh_and_a_bad_group_size_are_refused_with_the_fix(world):
    if world.world_size != 4:
        pytest.skip("one world is enough")
    for three_d, group in world.run(bad_input_case):
        assert three_d is not None and "2-D mesh (HSDP" in three_d, three_d
        assert "mesh['dp_replicate', 'dp_shard']" in three_d
        assert group is not None and "must divide the 2 ranks that shard" in group, group


def torch_shaped_case(case):
    """torch_dtensor.fsdp's run in minidist: the same Linears, rows and SGD steps."""
    import minidist.distributed as dist
    from minidist import backend
    from minidist.autograd import Tensor
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.fsdp import fully_shard, sharded_state_dict
    from minidist.distributed.tensor.debug import CommDebugMode
    from minidist.nn import Linear, Sequential
    from minidist.optim import SGD
    names = ("dp_replicate", "dp_shard")[-len(case["mesh"]):]
    mesh = init_device_mesh(backend.device_type(), tuple(case["mesh"]), mesh_dim_names=names)
    layers = []
    for w, b in case["weights"]:
        layer = Linear(w.shape[1], w.shape[0], dtype="float64")
        layer.weight.data[...], layer.bias.data[...] = backend.from_host(w), backend.from_host(b)
        layers.append(layer)
    model = Sequential(*layers)
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt, counts = SGD(model.parameters(), lr=case["lr"]), []
    for x in case["inputs"]:
        with CommDebugMode() as comm:
            y = model(Tensor(backend.from_host(x[case["rows"][dist.get_rank()]])))
            (y * y).mean().backward()
        counts.append(comm.get_comm_counts())
        opt.step()
        opt.zero_grad()
    state = parameters_of(sharded_state_dict(model))
    return ({n: [repr(p) for p in d.placements] for n, d in state.items()},
            {n: backend.to_host(d.to_local().data).copy() for n, d in state.items()},
            counts,
            {n: backend.to_host(d.full_tensor().data).copy() for n, d in state.items()})


def test_hsdp_matches_torch_fully_shard_on_a_2d_gloo_mesh(world):
    """The same Linears (7 and 3 rows: uneven pieces) under torch's FSDP2 and minidist's
    on a (2, 2) mesh: the same placements and local piece shapes, the same collectives per
    step (CommDebugMode: 4 all-gathers, 2 reduce-scatters, 2 all-reduces), the same
    parameters after two SGD steps (1e-12: torch sums in float64 and divides by 4 once,
    minidist averages in each collective)."""
    from oracles.optional import require
    require("torch")
    from tests.distributed import torch_dtensor
    if world.world_size != 4 or get_backend() != "numpy":
        pytest.skip("one world is enough; minidist's side runs under guard in the tests above")
    rng = np.random.default_rng(7)
    case = dict(mesh=(2, 2), lr=0.1, rows=[slice(2 * r, 2 * r + 2) for r in range(4)],
                weights=[(rng.standard_normal((7, 5)), rng.standard_normal(7)),
                         (rng.standard_normal((3, 7)), rng.standard_normal(3))],
                inputs=[rng.standard_normal((8, 5)) for _ in range(2)])
    theirs = torch_dtensor.run(4, "fsdp", [case])[0]
    ours = world.run(torch_shaped_case, case)
    for (placements, local, counts, whole), (t_place, t_local, t_counts, t_whole) in \
            zip(ours, theirs):
        assert placements == t_place
        assert {n: v.shape for n, v in local.items()} == {n: v.shape for n, v in t_local.items()}
        assert counts == t_counts
        for name in whole:
            np.testing.assert_allclose(whole[name], t_whole[name], rtol=TOL, atol=TOL)


def bf16_reduce_case(mesh_shape):
    """One backward of two Linears under HSDP with reduce_dtype="bfloat16": (this rank's
    whole float32 gradients from an unsharded copy, its gradient pieces under HSDP)."""
    import minidist.distributed as dist
    from minidist import backend
    from minidist.autograd import Tensor
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.fsdp import MixedPrecisionPolicy, fully_shard, sharded_state_dict
    from minidist.nn import Linear, Sequential

    def model():
        return Sequential(Linear(5, 7, generator=backend.Generator(1)),
                          Linear(7, 3, generator=backend.Generator(2)))
    mesh = init_device_mesh(backend.device_type(), mesh_shape, mesh_dim_names=("dp_replicate", "dp_shard"))
    whole, hsdp = model(), model()
    policy = MixedPrecisionPolicy(reduce_dtype="bfloat16")
    for layer in hsdp:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(hsdp, mesh=mesh, mp_policy=policy)
    x = np.random.default_rng(dist.get_rank()).standard_normal((2, 5)).astype("float32")
    for m in (whole, hsdp):
        y = m(Tensor(backend.from_host(x)))
        (y * y).mean().backward()
    grads = {n: backend.to_host(p.grad).copy() for n, p in whole.named_parameters()}
    pieces = {n: backend.to_host(d.grad.to_local().data).copy()
              for n, d in sharded_state_dict(hsdp).items()}
    return grads, pieces


def test_hsdp_reduces_in_bf16_rank_by_rank(world):
    """reduce_dtype="bfloat16" on a (2, S) mesh: each piece is the bf16 mean over the
    replica's S ranks (every partial sum rounded, rank order), then the bf16 mean of those
    over the 2 replicas, the same bits on every rank that holds the piece."""
    from minidist import backend
    from minidist.distributed.fsdp.reduce_format import round_sum
    from minidist.distributed.tensor.placement_types import shard_slice
    from minidist.precision import quantize
    from minidist.precision.formats import get_format
    n = world.world_size
    shape = (2, n // 2)
    results = world.run(bf16_reduce_case, shape)
    fmt, (R, S) = get_format("bfloat16"), shape
    for rank, (_, pieces) in enumerate(results):
        s = rank % S
        for name, piece in pieces.items():
            def mine(r, s_):                # rank (r, s_)'s rounded gradient, my rows
                whole = backend.from_host(results[r * S + s_][0][name])
                return shard_slice(quantize(whole, fmt), 0, S, s)
            replicas = [round_sum([mine(r, t) for t in range(S)], fmt, "avg") for r in range(R)]
            expected = backend.to_host(round_sum(replicas, fmt, "avg"))
            assert piece.tobytes() == expected.astype(piece.dtype).tobytes(), (rank, name)
