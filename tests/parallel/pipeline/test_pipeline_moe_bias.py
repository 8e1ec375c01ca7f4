"""DeepSeek-V3's loss-free balancing through a pipeline: each stage's MoE layers nudge
their bias by the loads of every micro-batch of the step (not the last one alone), so
a GPT trained with 1F1B, GPipe or DualPipeV (two chunks per rank) on 2 ranks keeps one process's biases and reaches
its parameters on the same global batch (float64, 3 AdamW steps, 1e-12)."""
import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.distributed.worlds import worlds_fixture

STEPS, MB, T, VOCAB = 3, 2, 4, 11

worlds = worlds_fixture(slot_bytes=4096)


def _model(case):
    from minidist.nn import GPT, GPTConfig
    layers = 4 if case["schedule"] == "dualpipe_v" else 2      # a layer per piece
    return GPT(GPTConfig(block_size=T, vocab_size=VOCAB, n_layer=layers, n_head=2, n_embd=8,
                         tie_weights=False, moe_every=1, n_expert=4, moe_top_k=2, moe_aux_coef=0.0,
                         moe_bias_rate=case["rate"], dtype="float64", seed=case["seed"],
                         checkpoint=case["checkpoint"]))


def train(case, pipelined):
    """Parameters and biases after STEPS steps: one process on the whole batch, or this
    stage's (its own parameters and MoE layers)."""
    import minidist.distributed as dist
    from minidist import backend
    from minidist.optim import AdamW
    from minidist.parallel.pipeline.executor import run_pipeline
    from minidist.parallel.pipeline.gpt import pieces_of_rank, split_gpt
    from minidist.parallel.pipeline.schedule import chunks_per_rank, make_schedule, placement
    model, m = _model(case), case["m"]
    rng = np.random.default_rng(case["seed"])
    params, moes = list(model.parameters()), model.moe_layers()
    if pipelined:
        p, r = dist.get_world_size(), dist.get_rank()
        v, where = chunks_per_rank(case["schedule"]), placement(case["schedule"])
        chunks = pieces_of_rank(split_gpt(model, p, v), r, p, where)
        mine = [x for chunk in chunks for x in chunk.modules()]
        params = [q for q in params if any(q is c for ch in chunks for c in ch.parameters())]
        moes = [moe for moe in moes if any(moe is x for x in mine)]
    opt = AdamW(params, lr=0.02)
    for _ in range(STEPS):
        idx = rng.integers(0, VOCAB, (m * MB, T))
        tgt = np.roll(idx, -1, axis=1)
        if pipelined:
            run_pipeline(make_schedule(case["schedule"], p, m)[r], chunks, m,
                         [backend.from_host(a) for a in np.split(idx, m)],
                         [backend.from_host(a) for a in np.split(tgt, m)],
                         activation_shape=(MB, T, 8), dtype="float64", placement=where)
        else:
            model(backend.from_host(idx), backend.from_host(tgt))[1].backward()
        opt.step()
        opt.zero_grad()
        model.update_moe_bias()
    names = {id(q): n for n, q in model.named_parameters()}
    out = {names[id(q)]: backend.to_host(q.data).copy() for q in params}
    index = {id(moe): i for i, moe in enumerate(model.moe_layers())}
    out.update({f"bias{index[id(moe)]}": backend.to_host(moe.expert_bias).copy() for moe in moes})
    return out


@settings(max_examples=3, deadline=None)
@example(schedule="dualpipe_v", m=4, rate=0.1, checkpoint="selective", seed=3)
@given(schedule=st.sampled_from(["1f1b", "gpipe"]), m=st.integers(2, 4),
       rate=st.sampled_from([0.01, 0.1]), checkpoint=st.booleans(), seed=st.integers(0, 100))
def test_bias_balancing_counts_every_micro_batch_of_a_pipeline(worlds, schedule, m, rate,
                                                               checkpoint, seed):
    case = dict(schedule=schedule, m=m, rate=rate, checkpoint=checkpoint, seed=seed)
    want = train(case, False)
    for stage, got in enumerate(worlds(2).run(train, case, True)):
        assert got.keys() <= want.keys() and any(k.startswith("bias") for k in got)
        for name, value in got.items():
            diff = np.abs(value - want[name]).max()
            assert diff <= 1e-12, f"stage {stage} {name}: {diff:.2e}; {case}"
