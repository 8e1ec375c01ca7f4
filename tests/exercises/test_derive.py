"""Derive exercises: calc reproduces every worked number, and answers are graded at its precision."""
import pytest

from minidist.exercises import DERIVE


@pytest.mark.parametrize("ex", DERIVE, ids=lambda ex: ex.id)
def test_calc_reproduces_the_worked_number(ex):
    assert abs(ex.value() - float(ex.worked)) <= ex.tolerance() * 2, (ex.value(), ex.worked)
    assert ex.grade(float(ex.worked))[0]


@pytest.mark.parametrize("ex", DERIVE, ids=lambda ex: ex.id)
def test_a_wrong_turn_is_named(ex):
    for what, wrong in ex.wrong_turns().items():
        right, message = ex.grade(wrong())
        assert not right and what in message, message


def test_every_workbook_derive_exercise_is_offered_once():
    ids = [ex.id for ex in DERIVE]
    assert len(ids) == len(set(ids))
    assert set(ids) == {"0.1", "0.2", "1.1", "1.2", "1.3", "1.4", "1.5", "2.1", "2.2", "2.3",
                        "3.1", "3.2", "3.3", "4.1", "4.2", "4.3", "5.1", "5.2", "5.3", "5.4",
                        "6.1", "6.2", "6.3", "6.5", "7.1", "7.2", "7.3", "7.4", "8.1", "8.3",
                        "8.5", "9.1", "9.2", "9.3", "9.4", "9.5", "9.6", "9.7", "9.9"}


@pytest.mark.parametrize("ex", [ex for ex in DERIVE if ex.printed], ids=lambda ex: ex.id)
def test_the_workbooks_printed_slip_is_refused_and_named(ex):
    """Where the workbook prints a wrong number, calc's value is not it, and that answer is told why."""
    assert abs(ex.value() - float(ex.printed)) > ex.tolerance()
    right, message = ex.grade(float(ex.printed))
    assert not right and ex.erratum in message, message


def test_zero_stage_1_answer_names_the_unsharded_optimizer():
    ex = next(e for e in DERIVE if e.id == "1.2")
    assert ex.grade(29.3)[0] and ex.grade(29.31)[0] and not ex.grade(29.5)[0]
    assert "optimizer state unsharded" in ex.grade(112)[1]
