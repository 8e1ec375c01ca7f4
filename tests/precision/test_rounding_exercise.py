"""quantize under the properties that grade exercise 35.18 (one suite, two subjects)."""
import types

import pytest

from minidist.exercises.grading import run_property
from minidist.exercises.rounding import ROUNDING
from minidist.precision.rounding import quantize

# the subject gets arrays of the active backend, as quantize does
LIBRARY = types.SimpleNamespace(round_to_bf16=lambda x: quantize(x, "bf16"),
                                round_to_fp16=lambda x: quantize(x, "fp16"))


@pytest.mark.parametrize("prop", ROUNDING.properties, ids=lambda p: p.name)
def test_quantize_holds_the_exercise_property(prop):
    result = run_property(prop, LIBRARY)
    assert result.passed, "\n".join(result.lines())
