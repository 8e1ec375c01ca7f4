"""minidist.calc.activations against Korthikanti et al. 2022 (eq. 1, Table 2), GPT-3 175B."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.calc import (activation_memory_per_layer, activation_memory_per_layer_terms,
                           minidist_layer_activation_bytes)
from minidist.calc.units import GB

pytestmark = pytest.mark.host_only  # a cost model: no backend array (tests/conftest.py)

S, B, H, A, L = 2048, 1, 12288, 96, 96          # GPT-3 175B, one sequence per micro-batch
SBH = S * B * H


def test_eq_1_gpt3_is_sbh_times_34_plus_5as_over_h_and_275_gb_in_all():
    per_layer = activation_memory_per_layer(S, B, H, A)
    assert per_layer == SBH * (34 + 5 * A * S / H)
    assert L * per_layer / GB == pytest.approx(275.4, abs=0.05)


@pytest.mark.parametrize("t", [1, 2, 8])
def test_table_2_every_row_for_gpt3(t):
    scores = 5 * A * S / (H * t)
    rows = {
        (False, "none"): 10 + 24 / t + scores,           # tensor parallel (baseline)
        (True, "none"): 34 / t + scores,                 # tensor + sequence parallel
        (False, "selective"): 10 + 24 / t,               # tensor parallel + selective
        (True, "selective"): 34 / t,                     # tensor + sequence + selective
    }
    for (sp, recompute), coefficient in rows.items():
        got = activation_memory_per_layer(S, B, H, A, tp=t, sequence_parallel=sp,
                                          recompute=recompute)
        assert got == pytest.approx(SBH * coefficient, rel=1e-12)
    assert activation_memory_per_layer(S, B, H, A, tp=t, recompute="full") == 2 * SBH


def test_gpt3_with_t8_and_sequence_parallelism_keeps_34_gb_and_selective_10_gb():
    both = activation_memory_per_layer(S, B, H, A, tp=8, sequence_parallel=True)
    assert L * both / GB == pytest.approx(34.43, abs=0.01)
    selective = activation_memory_per_layer(S, B, H, A, tp=8, sequence_parallel=True,
                                            recompute="selective")
    assert L * selective / GB == pytest.approx(10.27, abs=0.01)


def test_the_terms_of_eq_1_add_up_and_the_scores_are_most_of_gpt3():
    terms = activation_memory_per_layer_terms(S, B, H, A)
    assert sum(terms.values()) == activation_memory_per_layer(S, B, H, A)
    scores = terms["attention scores, mask, dropout output"]
    assert scores / sum(terms.values()) == pytest.approx(80 / 114)


def test_an_unknown_recompute_mode_is_an_error():
    with pytest.raises(ValueError, match="recompute"):
        activation_memory_per_layer(S, B, H, A, recompute="some")
    with pytest.raises(ValueError, match="heads"):
        activation_memory_per_layer(S, B, H, 0)


dims = dict(s=st.integers(1, 4096), b=st.integers(1, 16), h=st.integers(1, 16384),
            a=st.integers(1, 128), t=st.integers(1, 64))


@given(**dims)
def test_tensor_and_sequence_parallel_at_t1_is_no_parallelism(s, b, h, a, t):
    plain = activation_memory_per_layer(s, b, h, a)
    for sp in (False, True):
        assert activation_memory_per_layer(s, b, h, a, tp=1, sequence_parallel=sp) == \
            pytest.approx(plain, rel=1e-12)


@given(**dims, sp=st.booleans())
def test_full_recomputation_is_the_floor_and_selective_equals_flash(s, b, h, a, t, sp):
    kw = dict(tp=t, sequence_parallel=sp)
    full = activation_memory_per_layer(s, b, h, a, recompute="full", **kw)
    selective = activation_memory_per_layer(s, b, h, a, recompute="selective", **kw)
    none = activation_memory_per_layer(s, b, h, a, **kw)
    flash = activation_memory_per_layer(s, b, h, a, flash=True, **kw)
    assert full < selective <= none
    assert flash == pytest.approx(selective, rel=1e-12)
    # sequence parallelism never keeps more than tensor parallelism alone
    assert none <= activation_memory_per_layer(s, b, h, a, tp=t) * (1 + 1e-12)


@given(**dims)
def test_minidist_layer_drops_exactly_the_score_term_with_flash(s, b, h, a, t):
    naive = minidist_layer_activation_bytes(s, b, h, a)
    flash = minidist_layer_activation_bytes(s, b, h, a, flash=True)
    assert naive - flash == 4 * (a * s * s * b - s * b * h - a * s * b)
    assert minidist_layer_activation_bytes(s, b, h, a, recompute="full") == 4 * s * b * h
