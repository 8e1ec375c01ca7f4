"""The pipeline cuts a Llama as it cuts a GPT (split_gpt: embed_tokens with the first
piece, norm and lm_head with the last): every schedule, zero-bubble included, gives
the gradients and the AdamW step of one process (float64, 1e-12). Drawn: the stages
(2 or 3 ranks), the schedule, chunks per rank, micro-batches and their size, GQA and
tied embeddings."""
import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

import minidist.distributed as dist
from minidist import backend
from minidist.nn import Llama, LlamaConfig
from minidist.optim import AdamW
from minidist.parallel.pipeline.executor import run_pipeline
from minidist.parallel.pipeline.gpt import pieces_of_rank, split_gpt, sync_tied_gradients
from minidist.parallel.pipeline.schedule import (SCHEDULES, chunks_per_rank, make_schedule,
                                                 placement)
from tests.distributed.worlds import worlds_fixture

T = 4


worlds = worlds_fixture(slot_bytes=4096)


def _config(case, pieces):
    return LlamaConfig(vocab_size=11, hidden_size=8, intermediate_size=12,
                       num_hidden_layers=pieces + case["extra_layers"], num_attention_heads=2,
                       num_key_value_heads=case["kv"], tie_word_embeddings=case["tie"],
                       max_position_embeddings=T, dtype="float64", seed=case["seed"])


def _batch(case):
    rng = np.random.default_rng(case["seed"])
    shape = (case["m"] * case["mb"], T)
    return rng.integers(0, 11, shape), rng.integers(0, 11, shape)


def pipeline_llama_step(case):
    """Every rank: its pieces through one pipelined step, then AdamW -> grads, losses, params."""
    p, r = dist.get_world_size(), dist.get_rank()
    v, m, where = case["v"], case["m"], placement(case["schedule"])
    model = Llama(_config(case, p * v))
    chunks = pieces_of_rank(split_gpt(model, p, v), r, p, where)
    idx, tgt = (np.split(a, m) for a in _batch(case))
    ops = make_schedule(case["schedule"], p, m, v)[r]
    stats = run_pipeline(ops, chunks, m, [backend.from_host(a) for a in idx],
                         [backend.from_host(a) for a in tgt],
                         activation_shape=(case["mb"], T, 8), dtype="float64", placement=where)
    sync_tied_gradients(model, chunks)
    mine = [(n, q) for n, q in model.named_parameters()
            if any(q is c for chunk in chunks for c in chunk.parameters())]
    grads = {n: backend.to_host(q.grad) for n, q in mine}
    AdamW([q for _, q in mine], lr=0.01).step()
    return grads, stats.losses, {n: backend.to_host(q.data) for n, q in mine}


def single_process_step(case, pieces):
    model = Llama(_config(case, pieces))
    idx, tgt = _batch(case)
    _, loss = model(backend.from_host(idx), backend.from_host(tgt))
    loss.backward()
    grads = {n: backend.to_host(q.grad) for n, q in model.named_parameters()}
    AdamW(model.parameters(), lr=0.01).step()
    return grads, float(loss.data), {n: backend.to_host(q.data) for n, q in model.named_parameters()}


@settings(max_examples=3, deadline=None)
@example(p=3, schedule="dualpipe_v", v_want=2, m_factor=2, mb=2, extra_layers=1, kv=1,
         tie=True, seed=7)
@given(p=st.sampled_from([2, 3]), schedule=st.sampled_from(SCHEDULES), v_want=st.integers(2, 3), m_factor=st.integers(1, 3),
       mb=st.integers(1, 2), extra_layers=st.integers(0, 1), kv=st.sampled_from([1, 2]),
       tie=st.booleans(), seed=st.integers(0, 2**16))
def test_every_schedule_trains_a_llama_as_one_process(worlds, p, schedule, v_want, m_factor,
                                                      mb, extra_layers, kv, tie, seed):
    v = chunks_per_rank(schedule, v_want)
    m_factor = max(m_factor, 2) if schedule == "dualpipe_v" else m_factor    # m >= 2p
    case = dict(schedule=schedule, v=v, m=p * m_factor, mb=mb, extra_layers=extra_layers,
                kv=kv, tie=tie, seed=seed)
    results = worlds(p).run(pipeline_llama_step, case)
    want, loss, want_stepped = single_process_step(case, p * v)
    got, stepped = {}, {}
    for grads, _, params in results:
        for name, g in grads.items():
            if name in got:      # the tied matrix: on the first and the last stage alike
                assert np.array_equal(got[name], g)
            got[name], stepped[name] = g, params[name]
    assert set(got) == set(want)
    for name in want:
        assert np.abs(got[name] - want[name]).max() <= 1e-12, (case, name)
        assert np.abs(stepped[name] - want_stepped[name]).max() <= 1e-12, (case, name)
    losses = [np.mean(ls) for _, ls, _ in results if ls]
    assert len(losses) == 1 and abs(losses[0] - loss) <= 1e-12
