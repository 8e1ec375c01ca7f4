"""Gradient accumulation over a pipeline with a tied embedding: sync once, at the end.

The first and the last stage each hold W = wte = lm_head and get half of its gradient;
``sync_tied_gradients`` adds the two. Accumulating two batches (two ``run_pipeline``
calls) and syncing once gives one process's gradient of both (float64, 1e-12).
Syncing after each call added the other half again (a1 + b1 + a2 + (b1 + a2) + b2...):
now the second sync raises on both stages, and ``ParallelLlama.run_step`` called twice
before a step raises on every rank. World of 2 (two stages).
"""
import numpy as np

from minidist import backend
from tests.distributed.worlds import world_fixture

world = world_fixture([2])
TOL = 1e-12
M, MB, T = 2, 2, 4


def _gpt():
    from minidist.nn import GPT, GPTConfig
    return GPT(GPTConfig(block_size=T, vocab_size=11, n_layer=2, n_head=2, n_embd=8,
                         tie_weights=True, dtype="float64", seed=5))


def _batches():
    rng = np.random.default_rng(5)
    return [tuple(rng.integers(0, 11, (M * MB, T)) for _ in "it") for _ in range(2)]


def accumulate(sync_each):
    """Both batches through the pipeline, syncing after each (``sync_each``) or once
    after both -> the tied gradient, or the error."""
    import minidist.distributed as dist
    from minidist.parallel.pipeline.executor import run_pipeline
    from minidist.parallel.pipeline.gpt import pieces_of_rank, split_gpt, sync_tied_gradients
    from minidist.parallel.pipeline.schedule import make_schedule
    p, r = dist.get_world_size(), dist.get_rank()
    model = _gpt()
    chunks = pieces_of_rank(split_gpt(model, p), r, p)
    try:
        for idx, tgt in _batches():
            run_pipeline(make_schedule("1f1b", p, M)[r], chunks, M,
                         [backend.from_host(a) for a in np.split(idx, M)],
                         [backend.from_host(a) for a in np.split(tgt, M)],
                         activation_shape=(MB, T, 8), dtype="float64")
            if sync_each:
                sync_tied_gradients(model, chunks)
        if not sync_each:
            sync_tied_gradients(model, chunks)
    except RuntimeError as e:
        return str(e)
    return backend.to_host(model.lm_head.weight.grad)


def test_accumulating_then_syncing_once_gives_the_single_process_gradient(world):
    single = _gpt()
    for idx, tgt in _batches():
        _, loss = single(backend.from_host(idx), backend.from_host(tgt))
        loss.backward()
    want = backend.to_host(single.lm_head.weight.grad)
    for got in world.run(accumulate, False):
        assert float(np.abs(got - want).max()) <= TOL


def test_syncing_after_each_accumulated_batch_raises_on_both_stages(world):
    for message in world.run(accumulate, True):
        assert isinstance(message, str), "the second sync added the other half again"
        assert "synced already" in message and "zero_grad()" in message, message


def run_step_twice(zero_between):
    """ParallelLlama (pp=2, tied) run_step twice, with step and zero_grad between or
    not -> None, or the error."""
    from minidist.nn import Llama, LlamaConfig
    from minidist.optim import AdamW
    from minidist.parallel import ParallelDims, parallelize_llama
    cfg = LlamaConfig(vocab_size=12, hidden_size=8, intermediate_size=12, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True,
                      max_position_embeddings=T, dtype="float64", seed=5)
    dims = ParallelDims(pp=2)
    model = parallelize_llama(Llama(cfg), dims.build_mesh(), dims, M)
    opt = AdamW(model.parameters(), lr=0.01)
    idx, tgt = (backend.from_host(a) for a in _batches()[0])
    try:
        model.run_step(idx, tgt)
        if zero_between:
            opt.step()
            opt.zero_grad()
        model.run_step(idx, tgt)
    except RuntimeError as e:
        return str(e)
    return None


def test_run_step_twice_before_a_step_raises_on_every_rank(world):
    assert world.run(run_step_twice, True) == [None, None]
    for message in world.run(run_step_twice, False):
        assert message is not None and "zero_grad()" in message, message
