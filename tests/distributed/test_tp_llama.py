"""The Llama under ``llama_tp_plan``: grouped-query attention with its key/value heads
split over the tensor-parallel ranks (q/k/v_proj column-parallel, o_proj row-parallel),
the SwiGLU MLP split, the embedding and head cut by vocabulary. It trains to the same
parameters as one process (float64, 1e-12) with the formula's collectives per step;
n_kv_head not divisible by t is a clear error, in the plan and in the attention."""
import copy

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist import backend
from tests.distributed.test_tp_gpt import TOL, _full, _host
from tests.distributed.worlds import world_fixture

world = world_fixture([2])


def llama_case(case):
    import minidist.distributed as dist
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.tensor.debug import CommDebugMode
    from minidist.distributed.tensor.parallel import (llama_tp_plan, loss_parallel,
                                                      parallelize_module)
    from minidist.nn import Llama, LlamaConfig
    from minidist.optim import AdamW
    t = dist.get_world_size()
    cfg = LlamaConfig(vocab_size=4 * t, hidden_size=8 * t, intermediate_size=6 * t,
                      num_hidden_layers=case["layers"], num_attention_heads=2 * t,
                      num_key_value_heads=t, dtype="float64", seed=case["seed"],
                      tie_word_embeddings=case["tied"])
    single = Llama(cfg)
    tp = copy.deepcopy(single)
    mesh = init_device_mesh(backend.device_type(), (t,), mesh_dim_names=("tp",))
    parallelize_module(tp, mesh["tp"], llama_tp_plan(cfg, t, case["sp"], case["loss"]))
    rng = np.random.default_rng(case["seed"])
    idx, tgt = (backend.from_host(rng.integers(0, cfg.vocab_size, (2, 2 * t))) for _ in "ab")
    counts = []
    for model in (single, tp):
        opt = AdamW(model.parameters(), lr=1e-2)
        for _ in range(2):
            with CommDebugMode() as comm, loss_parallel():
                _, loss = model(idx, tgt)
                opt.zero_grad()
                loss.backward()
            opt.step()
        counts.append(comm.get_phase_counts())
    theirs = dict(single.named_parameters())
    errors = {n: float(np.abs(_full(tp, n, p, theirs[n].shape) - _host(theirs[n])).max())
              for n, p in tp.named_parameters()}
    return errors, counts[1]


@settings(max_examples=3, deadline=None)
@given(layers=st.integers(1, 2), sp=st.booleans(), tied=st.booleans(), loss=st.booleans(),
       seed=st.integers(0, 99))
def test_llama_tp_plan_trains_like_one_process(world, layers, sp, tied, loss, seed):
    case = dict(layers=layers, sp=sp, tied=tied, loss=loss, seed=seed)
    L = layers
    # PrepareModuleInput gathers a layer's attention input and its MLP input once each:
    # f and g per layer for attention and for the MLP, as the GPT (and Megatron). The
    # head: its f, and the logits gathered (1 all-gather) or, for loss_parallel, left
    # sharded (3 all-reduces of B T numbers)
    head = {"all_reduce": 3} if loss else {"all_gather_into_tensor": 1}
    if sp:   # f: all-gather forward, reduce-scatter backward; g the reverse; RMSNorm
             # weights (used on T/t positions) all-reduced backward
        forward = {"all_gather_into_tensor": 2 * L + 1, "reduce_scatter_tensor": 2 * L + 1}
        backward = {"all_gather_into_tensor": 2 * L + 1, "reduce_scatter_tensor": 2 * L + 1,
                    "all_reduce": 2 * L + 1}
    else:
        forward, backward = {"all_reduce": 2 * L + 1}, {"all_reduce": 2 * L + 1}
    for name, n in head.items():
        forward[name] = forward.get(name, 0) + n
    want = {"forward": forward, "backward": backward}
    for errors, counts in world.run(llama_case, case):
        assert max(errors.values()) <= TOL, errors
        assert counts == want, counts


def kv_heads_case(_):
    """Two ways to cut one key/value head over two ranks: by the plan, and by hand."""
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.tensor.parallel import (ColwiseParallel, llama_tp_plan,
                                                      parallelize_module)
    from minidist.nn import Llama, LlamaConfig
    cfg = LlamaConfig(vocab_size=8, hidden_size=16, intermediate_size=8, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=1)
    messages = []
    try:
        llama_tp_plan(cfg, 2)
    except ValueError as e:
        messages.append(str(e))
    model = Llama(cfg)
    mesh = init_device_mesh(backend.device_type(), (2,))
    parallelize_module(model, mesh, {"model.layers.*.self_attn.k_proj": ColwiseParallel(),
                                     "model.layers.*.self_attn.v_proj": ColwiseParallel()})
    try:
        model(backend.from_host(np.zeros((1, 4), dtype=np.int64)))
    except ValueError as e:
        messages.append(str(e))
    cfg = LlamaConfig(vocab_size=8, hidden_size=16, intermediate_size=8, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2)
    model = Llama(cfg)      # only the queries split: rank 0's heads would meet wrong keys
    parallelize_module(model, mesh, {"model.layers.*.self_attn.q_proj": ColwiseParallel()})
    try:
        model(backend.from_host(np.zeros((1, 4), dtype=np.int64)))
    except ValueError as e:
        messages.append(str(e))
    return messages


def test_kv_heads_not_divisible_by_tp_is_a_clear_error(world):
    for plan_error, forward_error, half_plan_error in world.run(kv_heads_case, None):
        assert "num_key_value_heads=1" in plan_error and "tensor-parallel size 2" in plan_error
        assert "k_proj" in forward_error and "whole heads" in forward_error
        assert "split q_proj, k_proj and v_proj alike" in half_plan_error
