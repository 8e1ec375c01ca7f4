"""The planner against layouts published for real models (Narayanan et al. 2021, Table 1;
the Llama 3 report, Table 4): each published layout fits, the planner predicts its
reported utilization within 0.06, and its own best is at most 1.5x faster."""
import pytest

from minidist.calc.planner.published import PUBLISHED, compare

pytestmark = pytest.mark.host_only  # the planner's arithmetic: no backend array (tests/conftest.py)

SPEED_FACTOR = 1.5      # the planner's best may beat the authors' layout by at most this
UTILIZATION_GAP = 0.06  # |predicted - reported|, as a fraction of peak


@pytest.mark.parametrize("entry", PUBLISHED, ids=lambda e: f"{e.model}-{e.gpus}")
def test_published_layout_fits_and_is_predicted_within_the_stated_bounds(entry):
    result = compare(entry)
    assert result.published.feasible, result.published.reasons
    assert abs(result.predicted - entry.utilization) <= UTILIZATION_GAP
    assert 1.0 <= result.speed_ratio <= SPEED_FACTOR
