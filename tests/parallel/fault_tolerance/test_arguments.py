"""Bad input is refused with a message naming it: a quorum dimension the mesh lacks, more
replicas required than the world has, an optimizer over arrays that are not the model's;
and the healing skeleton carries every plain value back exactly."""

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import minidist.distributed as dist
from minidist import backend
from minidist.distributed.device_mesh import init_device_mesh
from minidist.nn import Linear
from minidist.optim import SGD
from minidist.parallel.fault_tolerance import Manager, OptimizerWrapper
from minidist.parallel.fault_tolerance.pack import (decode_skeleton, encode_skeleton,
                                                   join_state, split_state)


@pytest.fixture
def one_process():
    dist.init_process_group()
    yield
    dist.destroy_process_group()


def _manager(**kw):
    return Manager(lambda state: None, lambda: {}, **kw)


def test_a_quorum_dimension_not_in_the_mesh_is_refused(one_process):
    mesh = init_device_mesh(backend.device_type(), (1,), mesh_dim_names=("dp_shard",))
    with pytest.raises(ValueError, match="'dp_replicate' is not a dimension of the mesh"):
        _manager(mesh=mesh, replicate_dim="dp_replicate")


def test_a_quorum_dimension_without_a_mesh_is_refused(one_process):
    with pytest.raises(ValueError, match="replicate_dim='dp_replicate' names a dimension of "
                                         "a mesh, but no mesh was given"):
        _manager(replicate_dim="dp_replicate")


def test_more_replicas_required_than_the_world_has_is_refused(one_process):
    with pytest.raises(ValueError, match="min_replica_size=2 must be between 1 and the 1"):
        _manager(min_replica_size=2)
    with pytest.raises(ValueError, match="num_replicas=3 must be between"):
        _manager(num_replicas=3)


def test_an_optimizer_over_other_parameters_is_refused(one_process):
    model, other = Linear(2, 2, dtype="float64"), Linear(2, 2, dtype="float64")
    optimizer = SGD(list(model.parameters()) + list(other.parameters()), lr=0.1)
    with pytest.raises(ValueError, match=r"parameters \[2, 3\] .* not parameters of the model"):
        OptimizerWrapper(_manager(), optimizer, model)


def test_the_wrapper_has_torchfts_surface_the_wrapped_optimizers_own(one_process):
    """param_groups, state, defaults and add_param_group reach the wrapped optimizer
    (torchft's OptimizerWrapper); a closure, which would recompute the gradients after
    the quorum averaged them, is refused."""
    from minidist.optim import Optimizer
    model = Linear(2, 2, dtype="float64")
    inner = SGD([model.weight], lr=0.1)
    optimizer = OptimizerWrapper(_manager(), inner, model)
    assert isinstance(optimizer, Optimizer)
    assert optimizer.param_groups is inner.param_groups
    assert optimizer.state is inner.state and optimizer.defaults is inner.defaults
    optimizer.add_param_group({"params": [model.bias], "lr": 0.5})
    assert inner.param_groups[1]["params"] == [model.bias]
    assert optimizer.state_dict()["param_groups"] == inner.state_dict()["param_groups"]
    with pytest.raises(ValueError, match="takes no closure"):
        optimizer.step(lambda: None)


plain = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner)
    | st.dictionaries(st.integers() | st.text(), inner, max_size=3), max_leaves=8)


@given(state=plain)
@example(state={"best": float("inf"), 3: (float("-inf"), 1e-310)})
def test_the_healing_skeleton_brings_every_plain_value_back_exactly(state):
    arrays = []
    skeleton = split_state(state, arrays)
    assert join_state(decode_skeleton(encode_skeleton(skeleton)), arrays) == state
