"""A hook's saved memory: loaded as a copy, refused when it does not fit.

The resumed runs that equal the uninterrupted ones bit for bit are in test_topk.py and
test_hooks.py (``*_resumed_from_its_state_dict_*``)."""
import numpy as np
import pytest


def test_a_loaded_state_owns_its_arrays_and_takes_int_bucket_indices():
    from minidist import backend
    from minidist.parallel.data.topk import TopKState
    residual = backend.from_host(np.arange(3.0))
    saved = TopKState(None, density=0.5, error_dict={0: residual}).state_dict()
    saved["error_dict"] = {"0": saved["error_dict"][0]}      # a format that keeps str keys
    state = TopKState(None)
    state.load_state_dict(saved)
    assert state.density == 0.5 and list(state.error_dict) == [0]
    residual[0] = 7.0
    assert backend.to_host(state.error_dict[0]).tolist() == [0.0, 1.0, 2.0]


def test_a_state_dict_of_another_hook_is_refused_naming_the_missing_fields():
    from minidist.parallel.data.powersgd import PowerSGDState
    from minidist.parallel.data.topk import TopKState
    with pytest.raises(ValueError, match=r"no \['matrix_approximation_rank'"):
        PowerSGDState(None).load_state_dict(TopKState(None).state_dict())


def test_a_residual_of_another_size_than_its_bucket_is_refused_naming_the_bucket():
    from minidist import backend
    from minidist.parallel.data.hook_state import add_residual
    buf = backend.from_host(np.zeros(4))
    with pytest.raises(ValueError, match=r"residual of bucket 2 has shape \(3,\), the bucket "
                                         r"\(4,\).*bucketed differently"):
        add_residual({2: backend.from_host(np.zeros(3))}, 2, buf)
