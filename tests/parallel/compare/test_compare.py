"""compare: a layout equal to one process reports 0 ulps; a planted bug is found and named with
its tensor, step and rank; bf16 against float32 is told as rounding; --assert-equal exits 1
past the tolerance and usage errors exit 2 naming the fix.

One world of 2 ranks for the module (tp=2, pp=2, dp=2 each run on it); the GPT has 4
layers of width 16 on 4 x 8 characters, 2 or 3 steps: each case takes seconds.
"""
import pytest

from minidist.comm import World
from minidist.parallel.compare import (BUG, REORDERED, ROUNDING, Plant, RunSpec, Tolerance,
                                       compare, parse_layout)
from minidist.parallel.compare.command import CORPUS, corpus_batches

SCALED = "blocks.1.mlp.c_fc.weight"


@pytest.fixture(scope="module")
def world2():
    w = World(2, timeout=30.0, run_timeout=120.0)
    yield w
    w.close()


def _spec(steps, dtype="float64"):
    vocab, batches = corpus_batches(str(CORPUS), steps, 4, 8, seed=0)
    return RunSpec(batches, vocab, "gpt", dtype)


@pytest.mark.parametrize("model, layout", [("gpt", "pp=2"), ("gpt", "pp=2 schedule=gpipe"),
                                           ("gpt", "pp=2 schedule=zb_v"), ("llama", "pp=2"),
                                           ("moe_llama", "pp=2"), ("gpt", "dp=1")])
def test_a_layout_whose_sums_are_the_same_is_0_ulps_from_one_process_at_every_step(
        world2, model, layout):
    """A pipeline of one micro-batch (and a layout of degree 1) adds every sum in one
    process's order: the stages only hand activations and gradients over. So every loss,
    gradient and parameter is one process's to the last bit, step after step."""
    vocab, batches = corpus_batches(str(CORPUS), 3, 4, 8, seed=0)
    report = compare(RunSpec(batches, vocab, model), parse_layout(layout),
                     parse_layout("single"), Tolerance(bitwise=True), worlds={2: world2})
    assert [line.ulps for line in report.steps] == [0, 0, 0]
    assert report.parting is None


@pytest.mark.parametrize("layout", ["tp=2", "pp=2 schedule=gpipe mb=2", "dp=2", "dp_shard=2"])
def test_a_layout_that_reduces_over_ranks_parts_by_a_reordered_sum_only(world2, layout):
    """Row-parallel products and the softmax's denominator summed over tp, micro-batches'
    gradients accumulated, data shards' gradients averaged: the same terms in another
    order, so within the tolerance and told as a reordered sum where bits differ."""
    spec = _spec(3)
    report = compare(spec, parse_layout(layout), parse_layout("single"), worlds={2: world2})
    assert report.steps[0].ulps <= 4 and max(line.ulps for line in report.steps) <= 4
    assert report.parting is None
    exact = compare(spec, parse_layout(layout), parse_layout("single"), Tolerance(bitwise=True),
                    worlds={2: world2})
    assert (exact.parting.step, exact.parting.cause) == (0, REORDERED)


@pytest.mark.parametrize("model, layout", [("llama", "cp=2"), ("moe_llama", "dp_shard=2 ep=2"),
                                           ("moe_llama", "pp=2 schedule=gpipe"),
                                           ("moe_llama", "cp=2 ep=2")])
def test_a_composed_layout_equals_one_process_within_the_tolerance(world2, model, layout):
    """Context and expert parallelism, and a pipeline carrying the balancing loss, which
    the 3D entry point did not compose: no tensor parts from one process."""
    vocab, batches = corpus_batches(str(CORPUS), 2, 4, 8, seed=0)
    report = compare(RunSpec(batches, vocab, model), parse_layout(layout),
                     parse_layout("single"), worlds={2: world2})
    assert report.parting is None and max(line.ulps for line in report.steps) <= 4


def test_two_four_rank_layouts_of_the_moe_llama_part_nowhere():
    vocab, batches = corpus_batches(str(CORPUS), 2, 4, 8, seed=1)
    report = compare(RunSpec(batches, vocab, "moe_llama"), parse_layout("pp=2 cp=2"),
                     parse_layout("dp_shard=2 tp=2 ep=2"))
    assert report.parting is None and max(line.ulps for line in report.steps) <= 4


def double_one_gradient(step, rank, named):
    """The planted bug: on rank 1, from step 1, one gradient scaled by 2."""
    if rank == 1 and step >= 1 and SCALED in named:
        named[SCALED].grad *= 2


def skip_the_all_reduce(model, rank):
    """The planted bug: the replicas never average their gradients (skipped on one rank
    only, the other would wait in its all-reduce until the world's timeout names it)."""
    model.replica.sync_gradients = lambda: None


def test_a_gradient_doubled_on_one_rank_is_named_with_its_step_and_rank(world2):
    report = compare(_spec(3), parse_layout("dp=2"), parse_layout("single"),
                     plant_a=Plant(on_grads=double_one_gradient), worlds={2: world2})
    part = report.parting
    assert (part.step, part.kind, part.name, part.rank, part.cause) == (
        1, "gradient", SCALED, 1, BUG)


def test_a_skipped_all_reduce_is_named_at_the_first_gradient(world2):
    report = compare(_spec(2), parse_layout("dp=2"), parse_layout("single"),
                     plant_a=Plant(on_model=skip_the_all_reduce), worlds={2: world2})
    part = report.parting
    assert (part.step, part.kind, part.name, part.cause) == (0, "gradient", "wte.weight", BUG)
    assert part.rank in (0, 1)


def freeze_scaled(model, rank):
    """requires_grad=False for SCALED: it gets no gradient and does not move."""
    params = model.named_parameters()
    dict(params)[SCALED].requires_grad = False


@pytest.mark.parametrize("layout, frozen_in", [("single", "a"), ("single", "b"),
                                               ("dp_shard=2", "a")])
def test_a_parameter_frozen_in_one_layout_parts_at_its_gradient(world2, layout, frozen_in):
    """The gradient present on one side only is the first tensor that parts (it was left
    out, and the parameter it moved was named instead)."""
    plant = Plant(on_model=freeze_scaled)
    report = compare(_spec(2), parse_layout(layout), parse_layout("single"),
                     plant_a=plant if frozen_in == "a" else None,
                     plant_b=plant if frozen_in == "b" else None, worlds={2: world2})
    part = report.parting
    assert (part.step, part.kind, part.name, part.cause) == (0, "gradient", SCALED, BUG)


def _loss_planted(change):
    """A plant that makes the model's forward return ``change(loss)`` for its loss."""
    def plant(model, rank):
        forward = model.forward

        def wrong(*args):
            logits, loss = forward(*args)
            return logits, change(loss)
        object.__setattr__(model, "forward", wrong)
    return plant


scale_the_loss = _loss_planted(lambda loss: loss * 2)     # a wrong averaging: grads x 2 too
offset_the_loss = _loss_planted(lambda loss: loss + 1.0)  # a constant: the gradients right


@pytest.mark.parametrize("plant", [scale_the_loss, offset_the_loss], ids=["scaled", "offset"])
def test_a_loss_that_parts_is_named_first_at_its_step(plant):
    """The loss is checked before the gradients: a doubled loss was named at the first
    gradient in module order, and a loss wrong by a constant (its gradients right) not at
    all ("equal within the tolerance")."""
    report = compare(_spec(2), parse_layout("single"), parse_layout("single"),
                     plant_a=Plant(on_model=plant))
    part = report.parting
    assert (part.step, part.kind, part.name, part.rank, part.cause) == (0, "loss", "", None, BUG)
    assert part.max_abs == abs(report.steps[0].loss_a - report.steps[0].loss_b) > 0.5


def test_bf16_against_float32_is_told_as_rounding():
    report = compare(_spec(1, "float32"), parse_layout("single amp=bf16"),
                     parse_layout("single"))
    assert report.parting.cause == ROUNDING and report.steps[0].ulps > 0


def test_assert_equal_exits_1_past_the_tolerance(capsys):
    from minidist.cli import main
    args = ["compare", "--a", "single amp=bf16", "--dtype", "float32", "--steps", "1"]
    assert main(args) == 0
    assert main(args + ["--assert-equal"]) == 1
    assert "cause: rounding" in capsys.readouterr().out


@pytest.mark.parametrize("layout, extra, words", [
    ("dq=2", [], ["unknown 'dq=2'", "dp_replicate", "tp", "pp"]),
    ("tp=2", ["--world-size", "8"], ["2 ranks", "world size 8", "multiply to 8"]),
    ("cp=2", [], ["cp needs a model with rotary positions", "--model llama"]),
    ("cp=2", ["--model", "llama", "--block", "6"], ["2 x cp = 4 chunks, and 6 tokens"]),
    ("dp_shard=2 ep=2", [], ["ep=2: the model has no MoE layers"]),
    ("dp_shard=2 ep=4", ["--model", "moe_llama"], ["ep=4 borrows", "divide 2"]),
    ("pp=2 mb=2", ["--model", "moe_llama"], ["route other micro-batches together",
                                             "balancing loss"]),
    ("tp=two", [], ["whole number"]),
    ("tp=3", [], ["n_head=2 is not divisible by the tensor-parallel size 3"]),
])
def test_usage_errors_exit_2_naming_the_fix(capsys, layout, extra, words):
    from minidist.cli import main
    assert main(["compare", "--a", layout] + extra) == 2
    err = capsys.readouterr().err
    for word in words:
        assert word in err, (word, err)


def test_show_sharding_prints_which_ranks_hold_which_block_before_the_report(capsys):
    """tp=2 cuts c_attn by heads (each rank its rows of q, k and v), pp=2 keeps block 0 on
    the first stage; an unknown name exits 2 naming some that exist."""
    from minidist.cli import main
    args = ["compare", "--a", "pp=2 tp=2", "--steps", "1", "--show-sharding"]
    assert main(args + ["blocks.0.attn.c_attn.weight"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:5] == ["blocks.0.attn.c_attn.weight (48, 16)",
                       "block                     ranks",
                       "[0:8+16:24+32:40, 0:16]   0",
                       "[8:16+24:32+40:48, 0:16]  1",
                       "not held by               2, 3"]
    assert main(args + ["blocks.0.nope"]) == 2
    assert "no parameter 'blocks.0.nope'" in capsys.readouterr().err
