"""The planner: every layout it reports can run, its terms are the calc functions they
cite, its costs move the way they must, and it searches the whole space."""
import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.calc import activations, comm, gpt, memory, pipeline
from minidist.calc.planner import layouts, model, presets
from minidist.calc.planner.layouts import Layout
from minidist.calc.planner.memory import memory_per_gpu, stage_params
from minidist.calc.planner.search import plan, score
from minidist.calc.planner.time import step_time

pytestmark = pytest.mark.host_only  # the planner's arithmetic: no backend array (tests/conftest.py)

H100 = presets.CLUSTERS["h100-nvlink-ib"]
TINY_NODE = dataclasses.replace(H100, memory=40e9)


@st.composite
def small_problems(draw):
    heads = draw(st.sampled_from([4, 8, 16]))
    kv = draw(st.sampled_from([h for h in (1, 2, 4, 8, 16) if heads % h == 0]))
    spec = presets.ModelSpec("t", draw(st.integers(2, 12)), heads * 64, heads, kv,
                             draw(st.sampled_from([2, 3, 4])) * heads * 64, 32000)
    gpus = draw(st.sampled_from([1, 2, 4, 8, 16, 24, 32]))
    seq = draw(st.sampled_from([1024, 2048, 4096]))
    sequences = draw(st.sampled_from([8, 16, 32, 48]))
    return spec, gpus, presets.TrainingSetup(sequences * seq, seq)


@settings(max_examples=25, deadline=None)
@given(small_problems())
def test_every_reported_layout_multiplies_to_the_gpus_and_breaks_no_rule(problem):
    spec, gpus, setup = problem
    result = plan(spec, H100, gpus, setup, top=50, max_micro_batch=4)
    for scored in result.best:
        lay = scored.layout
        assert lay.dp * lay.tp * lay.pp * lay.cp == gpus
        assert spec.heads % lay.tp == 0 and spec.kv_heads % lay.tp == 0
        assert layouts.violations(spec, setup, lay, gpus, H100.gpus_per_node) == []
        assert scored.memory.total <= H100.memory
        assert layouts.microbatches(lay, setup) * lay.dp * lay.micro_batch == setup.sequences


@settings(max_examples=10, deadline=None)
@given(small_problems())
def test_the_best_is_the_fastest_of_the_whole_space(problem):
    spec, gpus, setup = problem
    result = plan(spec, H100, gpus, setup, top=1, max_micro_batch=2)
    every = list(layouts.enumerate_layouts(spec, setup, gpus, H100.gpus_per_node, 2))
    assert result.evaluated == len(every)
    scored = [score(spec, setup, lay, H100, gpus) for lay in every]
    feasible = [s for s in scored if s.feasible]
    assert len(feasible) == len(every) - sum(result.excluded.values())
    if feasible:
        assert result.best[0].time.total == min(s.time.total for s in feasible)


LLAMA = presets.MODELS["llama3-70b"]
SETUP = presets.TrainingSetup(512 * 4096, 4096)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_more_gpus_in_the_zero_group_never_raise_per_gpu_state(stage):
    previous = None
    for dp in (1, 2, 4, 8, 16, 32):
        lay = Layout(dp, 8, 4, zero=stage, schedule="1f1b")
        m = memory_per_gpu(LLAMA, SETUP, lay)
        state = m.parameters + m.gradients + m.optimizer
        if previous is not None:
            assert state <= previous
            if stage == 0:
                assert state == previous
        previous = state


def test_more_microbatches_never_raise_the_1f1b_bubble():
    previous = None
    for sequences in (8, 16, 32, 64, 128, 256):
        setup = presets.TrainingSetup(sequences * 4096, 4096)
        t = step_time(LLAMA, setup, Layout(1, 8, 8, schedule="1f1b"), H100)
        ratio = t.bubble / t.compute
        if previous is not None:
            assert ratio <= previous
        previous = ratio


def test_each_term_is_the_calc_function_it_cites():
    lay = Layout(4, 8, 4, cp=2, zero=1, micro_batch=2, schedule="1f1b")
    m_micro = layouts.microbatches(lay, SETUP)
    mem = memory_per_gpu(LLAMA, SETUP, lay)
    dense, experts = stage_params(LLAMA, lay, "first")
    w, g, o = memory.model_state_bytes_split(lay.dp * lay.cp, 1)
    first = (dense * w, dense * g, dense * o)
    last_dense, _ = stage_params(LLAMA, lay, "last")
    last = (last_dense * w, last_dense * g, last_dense * o)
    assert (mem.parameters, mem.gradients, mem.optimizer) in (first, last)
    t = step_time(LLAMA, SETUP, lay, H100)
    assert t.bubble == t.compute * pipeline.bubble_fraction(4, m_micro, "1f1b")
    layers = LLAMA.layers // 4
    grads = 2 * sum(stage_params(LLAMA, lay, "middle"))     # the slowest stage: no embedding
    from minidist.calc.planner.time import all_reduce_seconds
    bucket = all_reduce_seconds(grads / layers, lay.dp * lay.cp, lay.tp, H100)
    backward = (t.compute / m_micro) * (2 / 3) / layers
    assert t.dp == comm.exposed_comm_seconds(layers, bucket, backward)


@pytest.mark.parametrize("t,sp,recompute,flash",
                         [(1, False, "none", False), (8, False, "none", False),
                          (8, True, "none", False), (8, True, "selective", False),
                          (4, True, "full", False), (2, False, "none", True)])
def test_a_gpt_layer_keeps_korthikantis_activations(t, sp, recompute, flash):
    spec = presets.MODELS["gpt3-175b"]
    ours = model.layer_activation_bytes(spec, 2048, 1, tp=t, sequence_parallel=sp,
                                        recompute=recompute, flash=flash)
    theirs = activations.activation_memory_per_layer(2048, 1, 12288, 96, tp=t,
                                                     sequence_parallel=sp,
                                                     recompute=recompute, flash=flash)
    assert ours == pytest.approx(theirs, rel=1e-12)


def test_a_gpts_flops_are_eq_3_and_its_parameters_eq_2():
    spec = presets.MODELS["gpt3-175b"]
    assert model.total_params(spec) == gpt.gpt_params(96, 12288, 51200, 2048)
    per_step = model.model_flops_per_token(spec, 2048) * 1536 * 2048
    assert per_step == pytest.approx(
        gpt.training_flops_per_iteration(1536, 2048, 96, 12288, 51200, recompute=False),
        rel=1e-12)
    full = (model.model_flops_per_token(spec, 2048)
            + model.recompute_flops_per_token(spec, 2048, "full")) * 1536 * 2048
    assert full == pytest.approx(
        gpt.training_flops_per_iteration(1536, 2048, 96, 12288, 51200), rel=1e-12)


@pytest.mark.parametrize("name,params", [("llama3-8b", 8_030_261_248),
                                         ("llama3-70b", 70_553_706_496),
                                         ("llama3-405b", 405_853_388_800)])
def test_llama3_parameter_counts_from_their_configs(name, params):
    spec = presets.MODELS[name]
    assert model.total_params(spec) + spec.hidden == params     # + the final RMSNorm


def test_when_nothing_fits_the_nearest_miss_says_by_how_much():
    tight = dataclasses.replace(H100, memory=1e9)
    result = plan(LLAMA, tight, 8, SETUP, max_micro_batch=1)
    assert not result.best
    assert result.nearest is not None
    assert any("out of memory" in r and "GB over" in r for r in result.nearest.reasons)


def test_layouts_read_back_from_their_short_form():
    lay = Layout(8, 4, 2, cp=2, ep=1, zero=3, micro_batch=2, recompute="full",
                 schedule="interleaved", virtual_stages=4)
    assert layouts.parse_layout(lay.short()) == lay
    with pytest.raises(ValueError, match="cannot read"):
        layouts.parse_layout("dp8 tp4 pp2 bogus")
