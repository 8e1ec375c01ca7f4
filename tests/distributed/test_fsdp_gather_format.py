"""fully_shard's parameter all-gather in a low-precision format moves the format's bytes
and gives the values of the plain math, bit for bit: bfloat16 / float16 gathers equal the
whole parameter rounded by ml_dtypes (NumPy's float16) in half the bytes of float32; the
float8 gather equals each rank's torch.chunk piece scaled by its power-of-two scale,
cast to e4m3fn by ml_dtypes and scaled back. Drawn: worlds 2 and 3, parameter shapes
(uneven rows, some ranks without any), magnitudes, float32 / float64 parameters."""
import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist import backend
from tests.distributed.worlds import world_fixture

world = world_fixture([2, 3])
LOW = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def _params(seed, shapes, dtype):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(s) * 10.0 ** rng.integers(-3, 3)).astype(dtype) for s in shapes]


def gather_case(seed, shapes, dtype, policy):
    """(the gathered parameters, bytes this rank sent) for the policy's format."""
    from minidist.comm.group import world_group
    from minidist.distributed.fsdp import MixedPrecisionPolicy
    from minidist.distributed.fsdp.gather_format import gather_pieces
    group = world_group()
    n, r = group.size, group.rank
    fulls = _params(seed, shapes, dtype)
    pieces = [backend.from_host(np.array_split(f, [min(len(f), k * -(-len(f) // n))
                                                   for k in range(1, n)])[r]) for f in fulls]
    before = group.stats.bytes_sent
    policy = dict(policy)
    async_op = policy.pop("async", False)
    got = gather_pieces(pieces, [f.shape[0] for f in fulls], group,
                        MixedPrecisionPolicy(**policy), async_op=async_op)
    got = got.wait() if hasattr(got, "wait") else got
    return [backend.to_host(g) for g in got], group.stats.bytes_sent - before


def _float8_oracle(full, n):
    """Each torch.chunk piece scaled by its power of two, cast to e4m3fn, scaled back."""
    c = -(-full.shape[0] // n)
    out = []
    for r in range(n):
        piece = full[r * c:(r + 1) * c]
        amax = float(np.abs(piece).max()) if piece.size else 0.0
        s = 1.0 if amax == 0.0 else 2.0 ** math.floor(math.log2(448.0 / amax))
        out.append((piece * s).astype(ml_dtypes.float8_e4m3fn).astype(full.dtype) / s)
    return np.concatenate(out)


@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 999), rows=st.lists(st.integers(1, 7), min_size=1, max_size=3),
       dtype=st.sampled_from(["float32", "float64"]),
       fmt=st.sampled_from(["bfloat16", "float16", "float8"]))
def test_low_precision_gather_equals_the_formats_rounding_bit_for_bit(world, seed, rows, dtype,
                                                                      fmt):
    n = world.world_size
    shapes = [(k, 3) if i % 2 else (k,) for i, k in enumerate(rows)]
    policy = {"float8_all_gather": True} if fmt == "float8" else {"param_dtype": fmt}
    fulls = _params(seed, shapes, dtype)
    for got, _ in world.run(gather_case, seed, shapes, dtype, policy):
        for g, full in zip(got, fulls):
            want = (_float8_oracle(full, n) if fmt == "float8"
                    else full.astype(LOW[fmt]).astype(dtype))
            assert g.dtype == full.dtype and np.array_equal(g, want, equal_nan=True), (g, want)


def test_low_precision_gathers_send_the_formats_bytes(world):
    """bfloat16: half the bytes of float32; float8: a quarter, plus each rank's 4-byte
    scale per parameter on each of the ring's N - 1 steps."""
    n, shapes = world.world_size, [(12, 4), (6,)]
    base = [b for _, b in world.run(gather_case, 1, shapes, "float32", {})]
    bf16 = [b for _, b in world.run(gather_case, 1, shapes, "float32",
                                    {"param_dtype": "bfloat16", "async": True})]
    fp8 = [b for _, b in world.run(gather_case, 1, shapes, "float32",
                                   {"float8_all_gather": True})]
    for b, half, quarter in zip(base, bf16, fp8):
        assert half * 2 == b, (half, b)
        assert quarter == b // 4 + (n - 1) * 4 * len(shapes), (quarter, b)


def test_float8_all_gather_with_a_low_param_dtype_is_refused():
    from minidist.distributed.fsdp import MixedPrecisionPolicy
    with pytest.raises(ValueError, match="float8_all_gather gathers e4m3 codes"):
        MixedPrecisionPolicy(param_dtype="bfloat16", float8_all_gather=True).check()
