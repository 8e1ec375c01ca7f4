"""DualPipeV as data: its dependencies, torch's order, the README's bubble and memory.

No processes here: test_pipeline.py and test_pipeline_llama.py run it in real
processes (gradients and AdamW step equal to one process's).
"""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.calc import dualpipe_v_exact_idle, dualpipe_v_idle
from minidist.parallel.pipeline.op import Op, Overlap, plain_ops, rank_and_chunk
from minidist.parallel.pipeline.schedule import make_schedule, simulate


def _held(ops):
    """Most micro-batch chunks a rank holds at once, each from its F to its W."""
    held = peak = 0
    for op in plain_ops(ops):
        held += {"F": 1, "B": 0, "W": -1}[op.kind]
        peak = max(peak, held)
    return peak


@settings(max_examples=20, deadline=None)
@given(p=st.integers(2, 4), extra=st.integers(0, 6))
def test_dualpipe_v_runs_f_b_w_once_per_chunk_in_a_dependency_order(p, extra):
    m = 2 * p + extra
    schedule = make_schedule("dualpipe_v", p, m)
    simulate(schedule, 2, placement="v")       # raises on a broken or deadlocking order
    for ops in schedule:
        assert sorted((o.kind, o.microbatch, o.chunk) for o in plain_ops(ops)) == sorted(
            (k, i, c) for k in "FBW" for i in range(m) for c in (0, 1))
    overlaps = [op for ops in schedule for op in ops if isinstance(op, Overlap)]
    assert overlaps and all(o.forward.chunk != o.backward.chunk for o in overlaps)


def _busiest_idle(p, m, f, b, w, fb):
    """Idle time of the busiest rank on the ideal clock, from the step's first op
    anywhere to its last, for chunk costs F, B (full backward), W, F&B."""
    schedule = make_schedule("dualpipe_v", p, m)
    # simulate takes whole-stage costs, a chunk being half of one
    timings = simulate(schedule, 2, 2 * f, 2 * b, 2 * w, placement="v", overlapped_cost=2 * fb)
    first = min(start for row in timings for _, start, _ in row)
    last = max(end for row in timings for _, _, end in row)
    return max((last - first) - sum(end - start for _, start, end in row) for row in timings)


@settings(max_examples=20, deadline=None)
@given(p=st.integers(2, 4), extra=st.integers(0, 6), t=st.floats(0.5, 3.0),
       saved=st.floats(0.0, 1.0))
def test_dualpipe_v_bubble_is_the_readmes_p_minus_1_times_fb_plus_b_minus_3w(p, extra, t,
                                                                             saved):
    """The README's figure's costs: F = W = t, B = 2t (a full backward), F&B = F + B
    minus what the overlap ``saved`` (up to an F): the busiest rank idles
    (PP/2 - 1)(F&B + B - 3W)."""
    f, b, w = t, 2 * t, t
    fb = f + b - saved * f
    idle = _busiest_idle(p, 2 * p + extra, f, b, w, fb)
    assert idle == pytest.approx((p - 1) * (fb + b - 3 * w), abs=1e-9)
    assert idle == pytest.approx(dualpipe_v_idle(p, f, b, w, fb), abs=1e-9)


@settings(max_examples=40, deadline=None)
@given(p=st.integers(2, 4), extra=st.integers(0, 4), w=st.floats(0.25, 4.0),
       ratio=st.floats(0.0, 1.0), saved=st.floats(0.0, 1.0))
def test_dualpipe_v_bubble_is_the_readmes_with_unequal_costs_where_2b_is_f_plus_3w(
        p, extra, w, ratio, saved):
    """F != W, B = (F + 3W)/2, F/W anywhere in [(p-1)/(p+1), (p+1)/(p-1)] and F&B
    from B + (p-1)(F - W)/2 (at least B) to F + B: calc.dualpipe_v_idle's conditions,
    under which the README's formula is the busiest rank's idle time exactly."""
    low, high = (p - 1) / (p + 1), (p + 1) / (p - 1)
    f = w * (low + ratio * (high - low))
    b = (f + 3 * w) / 2
    least = b + max(0.0, (p - 1) * (f - w) / 2)
    fb = least + saved * (f + b - least)
    idle = _busiest_idle(p, 2 * p + extra, f, b, w, fb)
    assert idle == pytest.approx((p - 1) * (fb + b - 3 * w), abs=1e-9)
    assert idle == pytest.approx(dualpipe_v_idle(p, f, b, w, fb), abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 5), extra=st.integers(0, 4),
       costs=st.tuples(*[st.floats(0.05, 10.0)] * 3), saved=st.floats(0.0, 1.0))
def test_dualpipe_v_busiest_idle_is_calcs_exact_six_chain_formula_for_any_costs(
        p, extra, costs, saved):
    """Any F, I (B's input half), W and max(F, B) <= F&B <= F + B: the simulated
    idle is calc.dualpipe_v_exact_idle, which the README's formula is not in general."""
    f, i, w = costs
    b = i + w
    fb = max(f, b) + saved * (f + b - max(f, b))
    idle = _busiest_idle(p, 2 * p + extra, f, b, w, fb)
    assert idle == pytest.approx(dualpipe_v_exact_idle(p, f, b, w, fb), rel=1e-9, abs=1e-9)


def test_dualpipe_v_readme_formula_is_off_outside_its_conditions():
    """p = 3, F = 2, B = 3, W = 1, F&B = 4 (2B != F + 3W): 7 idle, not the README's 8."""
    assert _busiest_idle(3, 6, 2, 3, 1, 4) == pytest.approx(7.0)
    assert dualpipe_v_idle(3, 2, 3, 1, 4) == pytest.approx(8.0)
    assert dualpipe_v_exact_idle(3, 2, 3, 1, 4) == pytest.approx(7.0)


@settings(max_examples=20, deadline=None)
@given(p=st.integers(2, 4), extra=st.integers(0, 6))
def test_dualpipe_v_holds_at_most_pp_plus_1_chunk_activations(p, extra):
    schedule = make_schedule("dualpipe_v", p, 2 * p + extra)
    assert max(_held(ops) for ops in schedule) <= 2 * p + 1    # PP + 1, PP = 2p pieces


def _torch_order(p, m):
    """torch's ScheduleDualPipeV.pipeline_order for p ranks, built on stand-in stages,
    in minidist's ops: F -> F, I -> B, W -> W, a full backward -> B then W,
    OVERLAP_F_B -> Overlap(F, B)."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    stage_mod = pytest.importorskip("torch.distributed.pipelining.stage")

    class StandIn(stage_mod._PipelineStageBase):
        """Just the fields the schedule reads; no module, no communication."""
        _create_grad_recv_info = _prepare_backward_infra = _prepare_forward_infra = None

        def __init__(self, index, rank):
            self.stage_index, self.num_stages = index, 2 * p
            self.group_size, self.group_rank, self.submod = p, rank, None

        is_first = property(lambda self: self.stage_index == 0)
        is_last = property(lambda self: self.stage_index == 2 * p - 1)

    def ops_of(action):
        kind = action.computation_type.name
        if kind == "OVERLAP_F_B":
            f, b = (ops_of(sub)[0] for sub in action.sub_actions)
            return [Overlap(f, b)]
        chunk = rank_and_chunk(action.stage_index, p, "v")[1]
        mb = action.microbatch_index
        plain = {"FORWARD": "F", "BACKWARD_INPUT": "B", "BACKWARD_WEIGHT": "W",
                 "FULL_BACKWARD": "BW"}[kind]
        return [Op(k, mb, chunk) for k in plain]

    order = []
    for r in range(p):
        run = schedules.ScheduleDualPipeV([StandIn(r, r), StandIn(2 * p - 1 - r, r)], m,
                                          loss_fn=lambda out, target: out)
        order.append([op for action in run.pipeline_order[r] for op in ops_of(action)])
    return order


@pytest.mark.parametrize("p,m", [(2, 4), (2, 7), (3, 6), (3, 9), (4, 8), (4, 11)])
def test_dualpipe_v_equals_torchs_schedule_dualpipe_v_order(p, m):
    order = _torch_order(p, m)
    ours = make_schedule("dualpipe_v", p, m)
    for r in range(p):
        # torch's F&B holds a full backward; ours names its B (its W is inside the op)
        assert ours[r] == order[r], r


def test_dualpipe_v_refuses_too_few_microbatches_and_other_than_two_chunks():
    with pytest.raises(ValueError, match=r"at least 2p = 6 micro-batches for 3 ranks, got 5"):
        make_schedule("dualpipe_v", 3, 5)
    for odd in (1, 3):
        with pytest.raises(ValueError, match=r"exactly 2 chunks \(pipeline stages\) per rank"):
            make_schedule("dualpipe_v", 2, 8, odd)
