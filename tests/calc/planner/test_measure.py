"""``minidist plan --measure``: this machine as a cluster, and the predictions beside runs.

The run test checks the table's structure and that every row ran; no test here asserts
how close a measured time is to the prediction (timings depend on the machine's load).
"""
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.calc import activations
from minidist.calc.planner import machine, memory, presets, time
from minidist.calc.planner.layouts import Layout, violations
from minidist.cli import main


@settings(max_examples=30, deadline=None)
@given(eff=st.floats(0.05, 1.0), overhead=st.floats(0.0, 0.05), per_rank=st.sampled_from([4, 8]),
       ranks=st.sampled_from([1, 2, 4]))
def test_fit_compute_recovers_the_efficiency_and_overhead_that_made_the_times(
        eff, overhead, per_rank, ranks):
    spec = machine.scaled_gpt(layers=3, hidden=64, heads=2, seq=32, vocab=100)
    setup = presets.TrainingSetup(per_rank * ranks * 32, 32, "fp32")
    peak = 1e10
    from minidist.calc.planner import model
    flops = per_rank * 32 * model.model_flops_per_token(spec, 32)
    times = [(b, flops / (peak * eff) + spec.layers * (per_rank // b) * overhead)
             for b in (1, per_rank)]
    got_eff, got_overhead = machine.fit_compute(spec, setup, ranks, peak, times)
    assert got_eff == pytest.approx(eff, rel=1e-9)
    assert got_overhead == pytest.approx(overhead, rel=1e-9, abs=1e-15)


@settings(max_examples=30, deadline=None)
@given(t1=st.floats(1e-3, 1.0), t2=st.floats(1e-3, 1.0))
def test_fit_compute_never_gives_a_rate_above_peak_or_a_negative_overhead(t1, t2):
    """Noisy calibration times (any pair) still give 0 < efficiency <= 1 and c >= 0."""
    spec = machine.scaled_gpt(layers=2, hidden=32, heads=2, seq=16, vocab=64)
    setup = presets.TrainingSetup(8 * 16, 16, "fp32")
    eff, overhead = machine.fit_compute(spec, setup, 2, 1e9, [(1, t1), (4, t2)])
    assert 0 < eff <= 1 + 1e-12 and overhead >= 0


def test_fit_compute_takes_a_micro_batch_larger_than_a_ranks_share():
    """8 sequences on 8 ranks calibrated at micro-batch 2: each rank runs one micro-batch
    of its one sequence (bench_compose's defaults divided by zero here)."""
    spec = machine.scaled_gpt(layers=2, hidden=32, heads=2, seq=16, vocab=64)
    setup = presets.TrainingSetup(8 * 16, 16, "fp32")
    eff, overhead = machine.fit_compute(spec, setup, 8, 1e9, [(1, 0.01), (2, 0.01)])
    assert 0 < eff <= 1 + 1e-12 and overhead >= 0


@settings(max_examples=20, deadline=None)
@given(seq=st.sampled_from([8, 16, 64]), batch=st.integers(1, 4), heads=st.sampled_from([1, 2, 4]),
       recompute=st.sampled_from(["none", "full"]))
def test_minidist_layer_bytes_at_tp1_is_the_calc_formula(seq, batch, heads, recompute):
    """What the Block saves (calc's formula), + 4 sbh its graph holds without recomputation."""
    spec = machine.scaled_gpt(hidden=16 * heads, heads=heads, seq=seq)
    held = 0 if recompute == "full" else 4 * 4 * seq * batch * spec.hidden
    assert memory.minidist_layer_bytes(spec, seq, batch, recompute=recompute) == \
        activations.minidist_layer_activation_bytes(seq, batch, spec.hidden, heads,
                                                    recompute=recompute) + held


def test_minidist_layer_bytes_splits_only_the_tensor_parallel_parts():
    spec = machine.scaled_gpt(hidden=64, heads=4, seq=32)
    whole = memory.minidist_layer_bytes(spec, 32, 2)
    half = memory.minidist_layer_bytes(spec, 32, 2, tp=2)
    sbh, sb = 32 * 2 * 64, 32 * 2
    assert whole - half == pytest.approx(4 * (16 * sbh + 4 * 32 * sb) / 2
                                         - 4 * memory.TP_HELD_SBH * sbh)


@settings(max_examples=4, deadline=None)
@given(seq=st.sampled_from([64, 128]), batch=st.integers(2, 4), heads=st.sampled_from([2, 4]))
def test_minidist_layer_bytes_is_what_a_block_holds_after_its_forward(seq, batch, heads):
    """The oracle: what one nn.gpt.Block's forward leaves held (tracemalloc's count on the
    CPU, CuPy's memory pool on a GPU)."""
    import tracemalloc
    from minidist import backend
    from minidist.autograd.tensor import Tensor
    from minidist.nn.gpt import Block, GPTConfig
    hidden = 32 * heads
    block = Block(GPTConfig(block_size=seq, n_embd=hidden, n_head=heads), backend.Generator(0))
    x = Tensor(backend.Generator(1).normal((batch, seq, hidden), dtype="float32"),
               requires_grad=True)
    tracemalloc.start()
    try:
        before = backend.memory_in_use()
        y = block(x)
        held = backend.memory_in_use() - before - y.data.nbytes
    finally:
        tracemalloc.stop()
    spec = machine.scaled_gpt(hidden=hidden, heads=heads, seq=seq)
    assert memory.minidist_layer_bytes(spec, seq, batch) == pytest.approx(held, rel=0.1)


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_every_runnable_layout_uses_the_ranks_and_keeps_the_rules(ranks):
    spec = machine.scaled_gpt()
    setup = presets.TrainingSetup(8 * 128, 128, "fp32")
    cluster = machine.this_machine(ranks, 1e10, 0.5, 1e-3, 1e9)
    found = machine.runnable(spec, setup, ranks, 8)
    assert found
    for layout in found:
        assert layout.dp * layout.tp * layout.pp == ranks
        assert not violations(spec, setup, layout, ranks, cluster.gpus_per_node)
        if layout.tp > 1 or layout.pp > 1:      # what ThreeDParallelGPT runs
            assert layout.zero == 0 and layout.recompute == "none"


def test_a_tp_group_across_nodes_is_excluded_but_still_priced_and_picked():
    spec = machine.scaled_gpt()
    setup = presets.TrainingSetup(16 * 128, 128, "fp32")
    cluster = machine.this_machine(4, 1e10, 0.5, 1e-3, 2e9, 0.2e9, node_size=2)
    scored = machine.predictions(spec, setup, cluster, 4, 8)
    across = [s for s in scored if s.layout.tp == 4]
    assert across and all(not s.feasible and "spans nodes" in s.reasons[0] for s in across)
    assert all(s.time.total > 0 and s.memory.total > 0 for s in across)
    rows = machine.pick(scored)
    assert not rows[-1].feasible and all(s.feasible for s in rows[:-1])


def test_fp32_moves_twice_the_bytes_of_mixed_precision():
    spec = machine.scaled_gpt()
    cluster = machine.this_machine(2, 1e10, 0.5, 0.0, 1e9, latency=0.0)
    layout = Layout(1, 2, 1, micro_batch=2, zero=0, schedule="none")
    mixed = time.step_time(spec, presets.TrainingSetup(1024, 128, "mixed"), layout, cluster)
    fp32 = time.step_time(spec, presets.TrainingSetup(1024, 128, "fp32"), layout, cluster)
    assert fp32.tp == pytest.approx(2 * mixed.tp)


def test_layer_overhead_adds_layers_times_microbatches():
    spec = machine.scaled_gpt()
    setup = presets.TrainingSetup(8 * 128, 128, "fp32")
    layout = Layout(2, 1, 1, micro_batch=1, zero=0, schedule="none")
    free = machine.this_machine(2, 1e10, 0.5, 0.0, 1e9)
    costly = machine.this_machine(2, 1e10, 0.5, 0.01, 1e9)
    extra = time.step_time(spec, setup, layout, costly).compute - \
        time.step_time(spec, setup, layout, free).compute
    assert extra == pytest.approx(spec.layers * 4 * 0.01)      # m = 8 / (2 x 1) = 4


def _row(predicted_s, measured_s):
    spec = machine.scaled_gpt()
    setup = presets.TrainingSetup(8 * 128, 128, "fp32")
    cluster = machine.this_machine(2, 1e10, 0.5, 0.0, 1e9)
    scored = machine.score(spec, setup, Layout(2, 1, 1, zero=0, schedule="none"), cluster)
    t = scored.time
    import dataclasses
    scored = dataclasses.replace(scored, time=dataclasses.replace(
        t, compute=predicted_s, bubble=0, tp=0, cp=0, ep=0, pp=0, dp=0))
    return machine.Row(scored, measured_s, 1.0)


def test_order_counts_only_pairs_the_prediction_separates():
    rows = [_row(1.0, 1.2), _row(1.01, 1.1), _row(2.0, 1.9), _row(3.0, 1.5)]
    assert not machine.order_holds(rows)
    # (1.0, 1.01) is a tie; of the other five pairs only (2.0, 3.0) ran the other way
    assert machine.pairs_in_order(rows) == (4, 5)
    in_order = [_row(1.0, 0.5), _row(1.5, 0.6), _row(2.0, 0.7)]
    assert machine.order_holds(in_order) and machine.pairs_in_order(in_order) == (3, 3)


def test_measure_runs_every_row_and_prints_them_side_by_side(capsys):
    # a memory limit between the tiny layouts' predictions, so that one is excluded
    spec = machine.scaled_gpt(layers=2, hidden=32, heads=2, seq=16, vocab=64)
    setup = presets.TrainingSetup(4 * 16, 16, "fp32")
    cluster = machine.this_machine(2, 1e10, 0.5, 0.0, 1e9)
    needs = sorted(s.memory.total for s in machine.predictions(spec, setup, cluster, 2, 8))
    limit = (needs[-1] + needs[-2]) / 2 if needs[-1] > needs[-2] else needs[-1] * 0.999
    assert main(["plan", "--measure", "--layers", "2", "--hidden", "32", "--heads", "2",
                 "--vocab", "64", "--seq", "16", "--batch-tokens", str(4 * 16),
                 "--steps", "1", "--rounds", "1", "--ranks", "2", "--link-gbps", "1",
                 "--memory", str(limit)]) == 0
    out = capsys.readouterr().out
    assert "calibration: matmul" in out and "efficiency" in out
    rows = [line for line in out.splitlines() if re.match(r"\s+(\d+|x) dp\d", line)]
    assert 3 <= len(rows) <= 8
    assert sum(line.split()[0] == "x" for line in rows) == 1      # the excluded one ran
    assert "excluded by the planner (out of memory: predicted" in out
    for line in rows:
        numbers = [float(x.rstrip("%")) for x in line.split()[10:]]
        predicted_s, measured_s, _, predicted_mb, measured_mb, _, rank = numbers
        assert predicted_s > 0 and measured_s > 0 and predicted_mb > 0 and measured_mb > 0
        assert 1 <= rank <= len(rows)
    assert sorted(int(line.split()[-1]) for line in rows) == list(range(1, len(rows) + 1))
    assert "peak memory within 10%" in out and "measured order of the predicted top" in out
    assert re.search(r"in the predicted order: \d+/\d+", out)


@pytest.mark.parametrize("argv,reason", [
    (["--ranks", "2", "--batch-tokens", "48", "--seq", "16"], "divides over --ranks"),
    (["--heads", "3", "--hidden", "32"], "must divide --hidden"),
    (["--ranks", "4", "--node-size", "3"], "must divide --ranks"),
])
def test_measure_usage_errors(argv, reason, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["plan", "--measure", *argv])
    assert exit_.value.code == 2
    assert reason in capsys.readouterr().err
