"""The cost models, observed: minidist's GPT keeps and computes what calc says it does."""
import pytest

from minidist.calc import (activation_memory_per_layer, minidist_layer_activation_bytes,
                           training_flops_per_iteration)
from minidist.nn.cost_probe import layer_saved_bytes, step_matmul_flops

POINTS = [(64, 32, 4), (128, 64, 2)]        # (s, h, a)


@pytest.mark.parametrize("s,h,a", POINTS)
@pytest.mark.parametrize("attention", ["naive", "flash"])
def test_saved_bytes_per_block_equal_the_specialised_model(s, h, a, attention):
    got = layer_saved_bytes(s, 2, h, a, attention=attention)
    assert got == minidist_layer_activation_bytes(s, 2, h, a, flash=attention == "flash")


@pytest.mark.parametrize("s,h,a", POINTS)
def test_flash_drops_the_attention_score_term_and_checkpointing_keeps_the_input(s, h, a):
    naive = layer_saved_bytes(s, 2, h, a)
    flash = layer_saved_bytes(s, 2, h, a, attention="flash")
    # naive keeps P, a s^2 b float32s; flash keeps O and the logsumexp instead
    assert naive - flash == 4 * (a * s * s * 2 - s * 2 * h - a * s * 2)
    full = activation_memory_per_layer(s, 2, h, a, recompute="full", bytes_per_element=4)
    assert layer_saved_bytes(s, 2, h, a, checkpoint=True) == full


@pytest.mark.parametrize("s,h,a", POINTS)
@pytest.mark.parametrize("checkpoint", [False, True])
def test_matmul_flops_per_step_are_eq_3_and_flash_adds_its_recomputed_scores(s, h, a,
                                                                            checkpoint):
    b, layers, vocab = 2, 2, 65
    want = training_flops_per_iteration(b, s, layers, h, vocab, recompute=checkpoint)
    naive = step_matmul_flops(b, s, layers, h, a, vocab, checkpoint=checkpoint)
    assert naive == pytest.approx(want, rel=1e-12)
    flash = step_matmul_flops(b, s, layers, h, a, vocab, attention="flash",
                              checkpoint=checkpoint)
    # one Q K^T more per layer in flash's backward (single tile at these lengths)
    assert flash - naive == layers * 2 * b * s * s * h
    assert abs(flash / want - 1) < 0.10
