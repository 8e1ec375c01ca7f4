"""Derive exercises: calc reproduces every worked number, and answers are graded at its precision."""
import pytest

from minidist.exercises.derive import DERIVE


@pytest.mark.parametrize("ex", DERIVE, ids=lambda ex: ex.id)
def test_calc_reproduces_the_worked_number(ex):
    assert abs(ex.value() - float(ex.worked)) <= ex.tolerance() * 2, (ex.value(), ex.worked)
    assert ex.grade(float(ex.worked))[0]


@pytest.mark.parametrize("ex", DERIVE, ids=lambda ex: ex.id)
def test_a_wrong_turn_is_named(ex):
    for what, wrong in ex.mistakes.items():
        right, message = ex.grade(wrong())
        assert not right and what in message, message


def test_zero_stage_1_answer_names_the_unsharded_optimizer():
    ex = next(e for e in DERIVE if e.id == "1.2")
    assert ex.grade(29.3)[0] and ex.grade(29.31)[0] and not ex.grade(29.5)[0]
    assert "optimizer state unsharded" in ex.grade(112)[1]
