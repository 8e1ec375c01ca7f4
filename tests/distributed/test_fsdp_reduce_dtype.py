"""fully_shard's reduce_dtype through minidist's emulated formats.

The reduce-scatter in bf16 / fp16 / fp8 gives, bit for bit, what ml_dtypes (and
NumPy's float16) give for the same values: each rank's gradient rounded to the
format, the partial sums added in float32 and rounded in rank order, the mean
divided in float32 and rounded; each rank keeps torch.chunk's piece of the result.
Under fully_shard, a bf16 reduce gives float64 master gradients whose values are bf16
numbers within bf16's rounding of one process's gradients.
"""
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist import backend
from tests.distributed.test_fully_shard import policy_backward
from tests.distributed.worlds import world_fixture

world = world_fixture([2, 3])
ORACLE_DTYPE = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16,
                "float8_e4m3fn": ml_dtypes.float8_e4m3fn}


def _inputs(seed, rank, shapes, dtype):
    rng = np.random.default_rng([seed, rank])
    return [(rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 2)).astype(dtype)
            for shape in shapes]


def reduce_case(seed, shapes, dtype, fmt):
    from minidist.comm.group import world_group
    from minidist.distributed.fsdp.reduce_format import reduce_scatter_dim0_in_format
    from minidist.precision import get_format
    group = world_group()
    grads = [backend.from_host(a) for a in _inputs(seed, group.rank, shapes, dtype)]
    pieces = reduce_scatter_dim0_in_format(grads, "avg", group, get_format(fmt))
    return [backend.to_host(p) for p in pieces]


def _oracle(per_rank, fmt, r):
    """Rank r's piece of the rounded mean, by the format's own dtype."""
    low = ORACLE_DTYPE[fmt]
    acc = per_rank[0].astype(low)
    for g in per_rank[1:]:
        acc = (acc.astype(np.float32) + g.astype(low).astype(np.float32)).astype(low)
    mean = (acc.astype(np.float32) / len(per_rank)).astype(low)
    n = len(per_rank)
    c = -(-mean.shape[0] // n)                                   # torch.chunk's pieces
    return mean[r * c:(r + 1) * c].astype(np.float64)


@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 999), rows=st.lists(st.integers(1, 7), min_size=1, max_size=3),
       dtype=st.sampled_from(["float32", "float64"]),
       fmt=st.sampled_from(["bfloat16", "float16", "float8_e4m3fn"]))
def test_reduce_scatter_in_a_format_gives_the_formats_bits(world, seed, rows, dtype, fmt):
    n = world.world_size
    shapes = [(k, 3) if i % 2 else (k,) for i, k in enumerate(rows)]
    results = world.run(reduce_case, seed, shapes, dtype, fmt)
    inputs = [_inputs(seed, r, shapes, dtype) for r in range(n)]
    for r, pieces in enumerate(results):
        for t, piece in enumerate(pieces):
            expected = _oracle([inputs[s][t] for s in range(n)], fmt, r)
            assert piece.dtype == np.dtype(dtype)
            np.testing.assert_array_equal(piece.astype(np.float64), expected,
                                          err_msg=f"rank {r}, tensor {t}, {fmt}")


def bf16_training_case(policy):
    """One backward of a float64 GPT under fully_shard with ``policy``; per parameter:
    the gradient's dtype, whether its values are bf16 numbers, and the largest error
    against one process over the largest gradient."""
    from minidist.distributed.fsdp import sharded_state_dict
    from minidist.precision import quantize
    theirs, model = policy_backward(policy)
    out = {}
    for name, d in sharded_state_dict(model).items():
        grad = d.grad.full_tensor().data
        exact = bool((backend.to_host(quantize(grad, "bf16")) == backend.to_host(grad)).all())
        host = backend.to_host(grad)
        out[name] = (str(grad.dtype), exact,
                     float(np.abs(host - theirs[name]).max() / np.abs(theirs[name]).max()))
    return out


def test_fully_shard_reduces_in_bf16_to_bf16_values_of_the_gradients(world):
    for found in world.run(bf16_training_case, {"reduce_dtype": "bfloat16"}):
        for name, (dtype, exact, err) in found.items():
            assert dtype == "float64" and exact, name
            assert err <= 2.0 ** -6, (name, err)       # a few bf16 roundings (8 bits)
        assert max(err for _, _, err in found.values()) > 0.0
    for found in world.run(bf16_training_case, {"param_dtype": "bfloat16"}):
        for name, (dtype, exact, err) in found.items():
            assert dtype == "float64", name
            assert err <= 2.0 ** -3, (name, err)       # the weights rounded to bf16


def test_a_dtype_no_format_names_is_refused():
    from minidist.distributed.fsdp import MixedPrecisionPolicy
    with pytest.raises(ValueError, match="unknown dtype 'bfloat17'"):
        MixedPrecisionPolicy(reduce_dtype="bfloat17").check()
    MixedPrecisionPolicy(param_dtype="float32", reduce_dtype="bf16").check()
