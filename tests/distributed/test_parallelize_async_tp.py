"""``parallelize_module(..., async_tp=True)`` (torchtitan's enable_async_tp): the GPT and
the Llama under their sequence-parallel plans train as without it (float64, 1e-12: the
rings add in ring order), their sequence-parallel gathers and reduce-scatters fused into
rings (fewer of them in CommDebugMode's count: the rings move by point-to-point); a plan
with nothing to fuse is refused, and so is a forward under autocast (the ring multiplies
in the parameters' dtype). Drawn: the model, the seed."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist import backend
from tests.distributed.worlds import world_fixture

world = world_fixture([2])
TOL = 1e-12


def _model(kind, seed, t):
    from minidist.distributed.tensor.parallel import gpt_tp_plan, llama_tp_plan
    from minidist.nn import GPT, GPTConfig, Llama, LlamaConfig
    if kind == "gpt":
        cfg = GPTConfig(block_size=2 * t, vocab_size=3 * t, n_layer=2, n_head=t, n_embd=4 * t,
                        dtype="float64", seed=seed)
        return GPT(cfg), gpt_tp_plan(cfg, t, sequence_parallel=True), cfg.vocab_size
    cfg = LlamaConfig(vocab_size=3 * t, hidden_size=4 * t, intermediate_size=6 * t,
                      num_hidden_layers=2, num_attention_heads=t, num_key_value_heads=t,
                      max_position_embeddings=2 * t, dtype="float64", seed=seed)
    return Llama(cfg), llama_tp_plan(cfg, t, sequence_parallel=True), cfg.vocab_size


def train(kind, seed, async_tp):
    """(this rank's parameters after 2 AdamW steps, the losses, the collectives counted)."""
    import minidist.distributed as dist
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.tensor.debug import CommDebugMode
    from minidist.distributed.tensor.parallel import parallelize_module
    from minidist.optim import AdamW
    t = dist.get_world_size()
    model, plan, vocab = _model(kind, seed, t)
    mesh = init_device_mesh(backend.device_type(), (t,), mesh_dim_names=("tp",))
    parallelize_module(model, mesh["tp"], plan, async_tp=async_tp)
    opt = AdamW(model.parameters(), lr=1e-2)
    rng = np.random.default_rng(seed)
    losses = []
    with CommDebugMode() as comm:
        for _ in range(2):
            idx = backend.from_host(rng.integers(0, vocab, (2, 2 * t)))
            _, loss = model(idx, backend.from_host(rng.integers(0, vocab, (2, 2 * t))))
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
    params = {k: backend.to_host(p.data).copy() for k, p in model.named_parameters()}
    return params, losses, comm.get_total_counts()


@settings(max_examples=2, deadline=None)
@given(kind=st.sampled_from(["gpt", "llama"]), seed=st.integers(0, 1000))
def test_async_tp_plans_train_as_the_plain_plans(world, kind, seed):
    plain, fused = world.run(train, kind, seed, False), world.run(train, kind, seed, True)
    for (want, want_losses, want_calls), (got, losses, calls) in zip(plain, fused):
        assert np.allclose(losses, want_losses, rtol=0, atol=TOL), (losses, want_losses)
        for name, value in got.items():
            assert np.abs(value - want[name]).max() <= TOL, (kind, name)
        assert calls < want_calls, (calls, want_calls)     # the fused pairs left the count


def refuse():
    import minidist.distributed as dist
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.tensor.parallel import gpt_tp_plan, parallelize_module
    from minidist.nn import GPT, GPTConfig
    t = dist.get_world_size()
    cfg = GPTConfig(block_size=2 * t, vocab_size=3 * t, n_layer=1, n_head=t, n_embd=4 * t)
    mesh = init_device_mesh(backend.device_type(), (t,), mesh_dim_names=("tp",))
    with pytest.raises(ValueError, match="needs sequence parallelism"):
        parallelize_module(GPT(cfg), mesh["tp"], gpt_tp_plan(cfg, t), async_tp=True)
    from minidist.precision.autocast import autocast
    model = parallelize_module(GPT(cfg), mesh["tp"], gpt_tp_plan(cfg, t, sequence_parallel=True),
                               async_tp=True)
    with pytest.raises(ValueError, match="under autocast parallelize without async_tp"):
        with autocast("bf16"):
            model(backend.from_host(np.zeros((1, 2 * t), dtype=np.int64)))
    return True


def test_async_tp_without_sequence_parallelism_or_under_autocast_is_refused(world):
    assert all(world.run(refuse))
