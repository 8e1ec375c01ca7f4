"""auto's thresholds are fitted to a sweep (bench/_tune.py) and read from the file
``--tune`` writes (all_reduce.load_tuning): on times that follow the alpha-beta
model the fit makes auto the fastest at every size, and a burst of load in one
measurement does not move a threshold."""
import json
import os
import sys

import pytest

from minidist.comm.collectives import all_reduce, cost

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "bench"))
import _tune  # noqa: E402

pytestmark = pytest.mark.host_only  # a cost model: no backend array (tests/conftest.py)

SIZES = [1 << k for k in range(10, 27)]
MODELS = {"allgather": cost.oneshot_all_reduce, "recursive_doubling": cost.recursive_doubling_all_reduce,
          "ring": cost.ring_all_reduce, "direct": cost.direct_all_reduce}


def _model_times(worlds=(2,), alpha=10e-6, beta=5e9):
    """Every algorithm's alpha-beta time (direct's messages cost 3 alphas: a
    read pins pages); at one world size the crossings are exact thresholds."""
    return {(n, alg, m): f(m, n, alpha * (3 if alg == "direct" else 1), beta).seconds
            for n in worlds for alg, f in MODELS.items() for m in SIZES}


def test_fitted_thresholds_make_auto_the_fastest_on_alpha_beta_times():
    times = _model_times(worlds=(2, 4))
    thresholds, ratios = _tune.fit(times)
    assert max(ratios.values()) == pytest.approx(1.0)
    for (n, m), r in ratios.items():
        chosen = _tune.pick(n, m, *thresholds[n])
        assert times[(n, chosen, m)] == min(times[(n, a, m)] for a in MODELS)


def test_each_world_size_gets_the_thresholds_of_its_own_crossings():
    """World 4's ring costs more than world 2's on these times (a slower
    link): its crossings move, and the fit follows each world on its own."""
    times = {**_model_times(worlds=(2,)),
             **{k: t for k, t in _model_times(worlds=(4,), beta=1e9).items()}}
    thresholds, ratios = _tune.fit(times)
    assert thresholds[2] != thresholds[4]
    assert max(ratios.values()) == pytest.approx(1.0)


def test_one_slow_measurement_does_not_move_a_threshold():
    times = _model_times(worlds=(2, 4))
    calm, _ = _tune.fit(times)
    spiked = dict(times)
    spiked[(2, "allgather", 4096)] *= 10          # a burst of load elsewhere
    assert _tune.fit(spiked)[0] == calm


def test_load_tuning_sets_auto_per_world_size_and_refuses_unknown_names(tmp_path):
    saved = dict(all_reduce.THRESHOLDS)
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps(dict(worlds={
        "2": dict(GATHER_BYTES=1024, SMALL_BYTES=4096, DIRECT_BYTES=1 << 20),
        "4": dict(GATHER_BYTES=0, SMALL_BYTES=0, DIRECT_BYTES=1 << 62, TWOSHOT_BYTES=0),
        "16": dict(GATHER_BYTES=0, TWOSHOT_BYTES=1 << 20)}, run="a test")))
    try:
        all_reduce.load_tuning(str(path))
        assert all_reduce.choose("auto", 1024, 2) == "allgather"
        assert all_reduce.choose("auto", 2048, 2) == "recursive_doubling"
        assert all_reduce.choose("auto", 4096, 2) == "ring"
        assert all_reduce.choose("auto", 1 << 20, 2) == "direct"
        assert all_reduce.choose("auto", 1 << 20, 3) == "direct"     # world 2's entry
        for m in (1024, 1 << 20):
            assert all_reduce.choose("auto", m, 4) == "ring"
            assert all_reduce.choose("auto", m, 8) == "ring"        # world 4's entry
        assert all_reduce.choose("auto", (1 << 20) - 1, 16) == "twoshot"
        assert all_reduce.choose("auto", 1 << 20, 16) == "ring"     # world 4's others
        path.write_text(json.dumps(dict(worlds={"2": dict(GATHER=1)})))
        with pytest.raises(ValueError, match="unknown thresholds"):
            all_reduce.load_tuning(str(path))
    finally:
        all_reduce.THRESHOLDS.clear()
        all_reduce.THRESHOLDS.update(saved)
