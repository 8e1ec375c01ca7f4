"""A GPT whose MLPs are tensor-parallel by a plan (a dict of styles, as torchtitan writes
Llama's) trains to the same parameters as one process: float64, 1e-12, after k AdamW
steps. CommDebugMode counts one all-reduce per block forward and one backward."""
import copy

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist import backend
from tests.distributed.worlds import world_fixture

world = world_fixture([2, 4])
TOL = 1e-12


def gpt_case(case):
    import minidist.distributed as dist
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.tensor.debug import CommDebugMode
    from minidist.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                      parallelize_module, parameter_as_dtensor)
    from minidist.nn import GPT, GPTConfig
    from minidist.optim import AdamW
    t = dist.get_world_size()
    cfg = GPTConfig(block_size=8, vocab_size=11, n_layer=case["layers"], n_head=2,
                    n_embd=4 * t, dtype="float64", seed=case["seed"])
    single = GPT(cfg)
    tp = copy.deepcopy(single)
    mesh = init_device_mesh("cpu", (t,), mesh_dim_names=("tp",))
    plan = {"blocks.*.mlp.c_fc": ColwiseParallel(), "blocks.*.mlp.c_proj": RowwiseParallel()}
    parallelize_module(tp, mesh["tp"], plan)
    rng = np.random.default_rng(case["seed"])
    batches = [(backend.from_host(rng.integers(0, 11, (2, 8))),
                backend.from_host(rng.integers(0, 11, (2, 8)))) for _ in range(case["steps"])]
    counts = []
    for model in (single, tp):
        opt = AdamW(model.parameters(), lr=1e-2)
        for idx, targets in batches:
            with CommDebugMode() as comm:
                _, loss = model(idx, targets)
                opt.zero_grad()
                loss.backward()
            opt.step()
            if model is tp:
                counts.append(comm.get_phase_counts())
    errors = {}
    single_params = dict(single.named_parameters())
    for name, p in tp.named_parameters():
        owner_name, attr = name.rsplit(".", 1)
        owner = dict(tp.named_modules())[owner_name]
        if attr in owner.__dict__.get("_dtensor_placements", {}):
            full = parameter_as_dtensor(owner, attr).full_tensor()
        else:
            full = p
        errors[name] = float(np.abs(backend.to_host(full.data)
                                    - backend.to_host(single_params[name].data)).max())
    return errors, counts


@settings(max_examples=2, deadline=None)
@given(layers=st.integers(1, 2), steps=st.integers(1, 3), seed=st.integers(0, 99))
def test_tp_plan_gpt_trains_like_one_process(world, layers, steps, seed):
    for errors, counts in world.run(gpt_case, dict(layers=layers, steps=steps, seed=seed)):
        assert max(errors.values()) <= TOL, errors
        for c in counts:
            assert c == {"forward": {"all_reduce": layers}, "backward": {"all_reduce": layers}}
