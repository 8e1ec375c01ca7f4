"""A 2-D step on a 2 x 2 mesh, (dp, tp): the GPT's MLPs (and, by gpt_tp_plan, the whole
model: attention head by head, embedding and head by vocabulary) tensor-parallel over
"tp" by a plan, every block and the root fully_shard over "dp". It trains to the same
parameters as one process on the whole batch (float64, 1e-12): each dp row takes half
the batch."""
import numpy as np

from minidist import backend
from tests.distributed.worlds import world_fixture

world = world_fixture([4])
TOL = 1e-12


def fsdp_tp_case(seed, whole=False, clip=None):
    """Errors of the trained parameters against one process; ``clip``: (max_norm,
    norm_type) for clip_grad_norm_ before each step, then also the norms returned."""
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.fsdp import fully_shard, sharded_state_dict
    from minidist.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                      gpt_tp_plan, parallelize_module)
    from minidist.nn import GPT, GPTConfig
    from minidist.optim import AdamW, clip_grad_norm_
    mesh = init_device_mesh(backend.device_type(), (2, 2), mesh_dim_names=("dp", "tp"))
    cfg = GPTConfig(block_size=8, vocab_size=12, n_layer=2, n_head=2, n_embd=8,
                    dtype="float64", seed=seed)
    single, model = GPT(cfg), GPT(cfg)
    plan = {"blocks.*.mlp.c_fc": ColwiseParallel(), "blocks.*.mlp.c_proj": RowwiseParallel()}
    if whole:   # attention head by head, the embedding and head by vocabulary too
        plan = gpt_tp_plan(cfg, 2)
    parallelize_module(model, mesh["tp"], plan)
    for block in model.blocks:
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    opts = [AdamW(single.parameters(), lr=1e-2), AdamW(model.parameters(), lr=1e-2)]
    rng = np.random.default_rng(seed)
    row = mesh.get_local_rank("dp")
    norms = []
    for _ in range(2):
        idx, tgt = rng.integers(0, 12, (4, 8)), rng.integers(0, 12, (4, 8))
        _, loss = single(backend.from_host(idx), backend.from_host(tgt))
        loss.backward()
        _, loss = model(*(backend.from_host(a[2 * row:2 * row + 2]) for a in (idx, tgt)))
        loss.backward()
        if clip is not None:     # the pieces' norm is the whole model's (optim/clip.py)
            norms.append([clip_grad_norm_(m.parameters(), *clip) for m in (single, model)])
        for opt in opts:
            opt.step()
            opt.zero_grad()
    errors = {}
    theirs = dict(single.named_parameters())
    modules = dict(model.named_modules())
    for name, d in sharded_state_dict(model).items():
        local = d.full_tensor()                         # gathered over dp: my tp piece
        owner, attr = name.rsplit(".", 1)
        layout = modules[owner].__dict__.get("_dtensor_placements", {}).get(attr)
        full = backend.to_host(theirs[name].data)
        if layout is not None:                          # cut over tp like the plan did
            _, (placement,), shape = layout
            if not placement.is_replicate():            # (c_attn: its (3, C, C) stack)
                full = np.split(full.reshape(shape), 2, axis=placement.dim)
                full = full[mesh.get_local_rank("tp")].reshape(local.shape)
        errors[name] = float(np.abs(backend.to_host(local.data) - full).max())
    return errors if clip is None else (errors, norms)


def test_fsdp_times_tp_on_a_2x2_mesh_trains_like_one_process(world):
    for errors in world.run(fsdp_tp_case, 3):
        assert max(errors.values()) <= TOL, errors


def test_fsdp_times_the_whole_gpt_tp_plan_trains_like_one_process(world):
    for errors in world.run(fsdp_tp_case, 4, True):
        assert max(errors.values()) <= TOL, errors


def test_clip_grad_norm_of_the_pieces_is_the_whole_models(world):
    """clip_grad_norm_(model.parameters()) on this rank's pieces (cut over tp by the
    plan, then over dp by fully_shard) returns the norm of the whole model's gradient
    on every rank and clips by it, as torch's does for DTensor parameters."""
    for norm_type in (2.0, float("inf"), 1.5):
        for errors, norms in world.run(fsdp_tp_case, 5, True, (0.05, norm_type)):
            assert max(errors.values()) <= TOL, (norm_type, errors)
            for whole, pieces in norms:
                assert abs(pieces - whole) <= 1e-12 * whole, (norm_type, norms)
