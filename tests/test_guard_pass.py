"""The guard pass draws half of each property test's examples (tests/conftest.py)."""
import pytest
from hypothesis import given, settings, strategies as st

from halving import halve_examples

pytestmark = pytest.mark.host_only   # settings objects only: no backend array


@pytest.mark.parametrize("asked,drawn", [(40, 20), (7, 3), (3, 2), (2, 2), (1, 1)])
def test_a_property_tests_examples_are_halved_but_never_below_two(asked, drawn):
    @settings(max_examples=asked)
    @given(st.integers())
    def prop(x):
        pass
    halve_examples(prop)
    assert prop._hypothesis_internal_use_settings.max_examples == drawn


def test_a_plain_test_is_left_alone():
    def plain():
        pass
    halve_examples(plain)
    assert not hasattr(plain, "_hypothesis_internal_use_settings")
