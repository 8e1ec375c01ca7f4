"""ZeRO-3 takes the default GPT, whose embedding and output layer share one matrix:
the tied weight is gathered once per forward and reduce-scattered once per step, and
training equals one process on the whole batch."""
import numpy as np
import pytest

from minidist.comm import World

CFG = dict(block_size=8, vocab_size=11, n_layer=1, n_head=2, n_embd=8, dtype="float64")
BATCH, STEPS = 6, 3


def _data():
    rng = np.random.default_rng(0)
    idx = rng.integers(0, CFG["vocab_size"], (STEPS, BATCH, CFG["block_size"]))
    return idx, np.roll(idx, -1, axis=2)


def _train(distributed):
    import minidist.distributed as dist
    from minidist import backend
    from minidist.nn.gpt import GPT, GPTConfig
    from minidist.optim import AdamW
    from minidist.parallel import Zero3
    model = GPT(GPTConfig(**CFG))
    assert model.lm_head.weight is model.wte.weight
    rank, n = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    per = BATCH // n
    if distributed:
        zero = Zero3(model, AdamW, lr=0.01, max_grad_norm=1.0)
        dist.get_stats().reset()
    else:
        from minidist.optim import clip_grad_norm_
        opt = AdamW(model.parameters(), lr=0.01)
    idx, tgt = _data()
    for s in range(STEPS):
        x = backend.from_host(idx[s, rank * per:(rank + 1) * per])
        y = backend.from_host(tgt[s, rank * per:(rank + 1) * per])
        _, loss = (zero if distributed else model)(x, y)
        loss.backward()
        if distributed:
            zero.step()
            zero.zero_grad()
        else:
            clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
    if not distributed:
        return {k: backend.to_host(p.data).copy() for k, p in model.named_parameters()}
    calls = dist.get_stats().per_collective
    params = {k: backend.to_host(v).copy() for k, v in zero.full_state_dict().items()}
    n_units = len(zero.units)
    return params, calls, n_units, zero.shared.layout.numel


@pytest.mark.parametrize("n", [2, 3])
def test_zero3_trains_the_tied_gpt_as_one_process_does(n):
    ref = _train(False)
    with World(n, timeout=20.0, run_timeout=120.0) as world:
        results = world.run(_train, True)
    for params, calls, n_units, shared_numel in results:
        assert shared_numel == CFG["vocab_size"] * CFG["n_embd"]   # wte.weight, once
        assert set(params) == set(ref) - {"lm_head.weight"} or set(params) == set(ref)
        for k in params:
            assert np.max(np.abs(params[k] - ref[k])) <= 1e-12, k
        # per step: each unit reduce-scattered once, the shared weight once (not twice)
        assert calls["reduce_scatter"]["calls"] == STEPS * (n_units + 1)
