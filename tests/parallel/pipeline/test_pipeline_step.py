"""A pipeline's optimizer step is the whole model's: the stages decide together.

Each stage holds other parameters, so whatever one process decides from all the
gradients (GradScaler's skip on an inf / NaN, clipping by the gradient norm) must be
decided from every stage's. In a 2-rank world (two stages, 1F1B over two
micro-batches, a float64 GPT):

- GradScaler, built plainly (no ``found_inf_reduce``): when the last stage's gradient
  holds an inf, the first stage skips its step too and both halve the scale, as one
  process skips the whole step (the stage parameters are registered by run_pipeline,
  so the flag is max-combined over the pipeline group).
- ``optim.clip_grad_norm_`` over one stage's parameters is refused with a message
  naming ``parallel.clip_grad_norm_`` (the stage's own norm is not the model's); the
  latter equals one process (tests/parallel/test_clip.py).
"""
import numpy as np
import pytest

import minidist.distributed as dist
from minidist import backend
from minidist.nn import GPT, GPTConfig
from minidist.optim import AdamW
from minidist.parallel.pipeline import (make_schedule, pieces_of_rank, pipeline_parameters,
                                        run_pipeline, split_gpt, sync_tied_gradients)
from tests.distributed.worlds import world_fixture

M, MB, T = 2, 2, 4     # micro-batches, rows each, tokens
world = world_fixture([2])


def _stage(seed=0, tie=True):
    """This rank's stage of a small GPT after one pipelined forward and backward."""
    p, r = dist.get_world_size(), dist.get_rank()
    cfg = GPTConfig(block_size=T, vocab_size=11, n_layer=2, n_head=2, n_embd=8,
                    tie_weights=tie, dtype="float64", seed=seed)
    model = GPT(cfg)
    chunks = pieces_of_rank(split_gpt(model, p), r, p)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, cfg.vocab_size, (M * MB, T))
    tgt = rng.integers(0, cfg.vocab_size, (M * MB, T))
    run_pipeline(make_schedule("1f1b", p, M)[r], chunks, M,
                 [backend.from_host(a) for a in np.split(idx, M)],
                 [backend.from_host(a) for a in np.split(tgt, M)],
                 activation_shape=(MB, T, cfg.n_embd), dtype="float64")
    sync_tied_gradients(model, chunks)
    return model, chunks


def overflow_on_the_last_stage():
    """The last stage's gradient holds an inf (an fp16 overflow there); a plain
    GradScaler steps each stage -> (did this stage's parameters change, scale after)."""
    from minidist.precision import GradScaler
    model, chunks = _stage()
    params = pipeline_parameters(chunks)
    if dist.get_rank() == dist.get_world_size() - 1:
        params[-1].grad[(0,) * params[-1].grad.ndim] = np.inf
    before = [backend.to_host(q.data).copy() for q in params]
    opt, scaler = AdamW(params, lr=0.01), GradScaler(init_scale=2.0 ** 10)
    scaler.step(opt)
    scaler.update()
    moved = any(not np.array_equal(b, backend.to_host(q.data)) for b, q in zip(before, params))
    return moved, scaler.get_scale()


def test_a_stage_that_overflows_makes_every_stage_skip_the_step(world):
    """One process skips the whole step; no stage may step on its own."""
    assert world.run(overflow_on_the_last_stage) == [(False, 2.0 ** 9)] * 2


def clip_one_stage():
    from minidist.optim import clip_grad_norm_
    _, chunks = _stage()
    with pytest.raises(ValueError, match=r"parallel\.clip_grad_norm_") as info:
        clip_grad_norm_(pipeline_parameters(chunks), 1.0)
    return str(info.value)


def test_clipping_one_stage_by_its_own_norm_is_refused(world):
    for message in world.run(clip_one_stage):
        assert "pipeline stage" in message
