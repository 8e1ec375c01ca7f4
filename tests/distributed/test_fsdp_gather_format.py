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


STEPS, ROWS = 3, 2          # steps; rows per rank


def _scaler_data(n):
    rng = np.random.default_rng(5)
    return rng.standard_normal((STEPS, n * ROWS, 8)), rng.standard_normal((STEPS, n * ROWS, 8))


def _scaler_model():
    from minidist.nn import MLP, Sequential
    return Sequential(MLP(8, 16, dtype="float64", generator=backend.Generator(1)),
                      MLP(8, 16, dtype="float64", generator=backend.Generator(2)))


def _scaled_steps(model, opt, scaler, n, rows, before_forward=None, after_backward=None):
    """STEPS GradScaler steps of the mean squared error on ``rows`` of each step's batch;
    step 1's loss is made inf, so every rank skips it and halves the scale."""
    from minidist.autograd import Tensor
    x, y = _scaler_data(n)
    scales = []
    for s in range(STEPS):
        if before_forward:
            before_forward()
        out = model(Tensor(backend.from_host(x[s, rows])))
        diff = out - Tensor(backend.from_host(y[s, rows]))
        loss = (diff * diff).mean() * (float("inf") if s == 1 else 1.0)
        scaler.scale(loss).backward()
        if after_backward:
            after_backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        scales.append(scaler.get_scale())
    return scales


def scaler_gather_case(policy):
    """This rank's run: fully_shard units gathering in ``policy``'s format, SGD under a
    GradScaler: (the whole parameters, the scale after each step)."""
    import minidist.distributed as dist
    from minidist.distributed.fsdp import MixedPrecisionPolicy, fully_shard, sharded_state_dict
    from minidist.optim import SGD
    from minidist.precision import GradScaler
    model = _scaler_model()
    for unit in list(model) + [model]:
        fully_shard(unit, mp_policy=MixedPrecisionPolicy(**policy))
    opt, scaler = SGD(model.parameters(), lr=0.1), GradScaler(init_scale=2.0 ** 10)
    r, n = dist.get_rank(), dist.get_world_size()
    scales = _scaled_steps(model, opt, scaler, n, slice(r * ROWS, (r + 1) * ROWS))
    return ({k: backend.to_host(d.full_tensor().data) for k, d in
             sharded_state_dict(model).items()}, scales)


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")   # the inf step
def test_grad_scaler_with_low_precision_gathers_equals_one_process(world):
    """GradScaler x fully_shard's bfloat16 / float8 parameter gathers: the parameters equal
    one process whose forward uses each parameter rounded as the gather rounds it (the
    whole one to bf16; each rank's piece scaled to e4m3), its gradient reaching the
    float64 master, over the whole batch (1e-12); an inf step skipped on every rank."""
    from minidist.optim import SGD
    from minidist.precision import GradScaler
    n = world.world_size
    for fmt in ("bfloat16", "float8"):
        policy = {"float8_all_gather": True} if fmt == "float8" else {"param_dtype": fmt}
        model = _scaler_model()
        params = list(model.parameters())
        masters = []

        def rounded():                       # the gathered values, the masters kept aside
            masters[:] = [p.data.copy() for p in params]
            for p in params:
                full = backend.to_host(p.data)
                p.data = backend.from_host(_float8_oracle(full, n) if fmt == "float8" else
                                           full.astype(LOW[fmt]).astype(full.dtype))

        def restore():                        # the gradients stay, the masters come back
            for p, m in zip(params, masters):
                p.data = m
        opt, scaler = SGD(params, lr=0.1), GradScaler(init_scale=2.0 ** 10)
        scales = _scaled_steps(model, opt, scaler, n, slice(None), rounded, restore)
        ref = {k: backend.to_host(p.data) for k, p in model.named_parameters()}
        for whole, got_scales in world.run(scaler_gather_case, policy):
            assert got_scales == scales == [2.0 ** 10, 2.0 ** 9, 2.0 ** 9], (fmt, got_scales)
            for name, value in whole.items():
                diff = float(np.abs(value - ref[name]).max())
                assert diff <= 1e-12, (fmt, name, diff)


def gather_log_case(policy):
    """One forward and backward of fully_shard units gathering in ``policy``'s format: the
    log of its low-precision steps in order: "encode" (a unit's pieces), "gather" (the
    gather of codes issued) and "wait" (a gather's codes awaited)."""
    from minidist.autograd import Tensor
    from minidist.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from minidist.distributed.fsdp import gather_format, state
    log = []
    encode, gather = state.encode_pieces, state.gather_encoded
    wait = gather_format.EncodedGather.wait

    def logging_encode(*args):
        log.append("encode")
        return encode(*args)

    def logging_gather(*args):
        log.append("gather")
        return gather(*args)

    def logging_wait(self):
        log.append("wait")
        return wait(self)
    state.encode_pieces, state.gather_encoded = logging_encode, logging_gather
    gather_format.EncodedGather.wait = logging_wait
    try:
        model = _scaler_model()
        for unit in list(model) + [model]:
            fully_shard(unit, mp_policy=MixedPrecisionPolicy(**policy))
        x, _ = _scaler_data(2)
        (model(Tensor(backend.from_host(x[0]))) ** 2).mean().backward()
    finally:
        state.encode_pieces, state.gather_encoded = encode, gather
        gather_format.EncodedGather.wait = wait
    return log


@pytest.mark.parametrize("policy", [{"param_dtype": "bfloat16"}, {"float8_all_gather": True}])
def test_a_unit_is_encoded_once_a_step_its_backward_gathering_the_forwards_codes(world, policy):
    """The pieces do not change between forward and backward: each unit's forward encodes
    them (the 2 MLPs; the root holds no parameter of its own), and the backward's gathers
    of the 2 resharded units send those codes again: 2 encodes for 4 gathers."""
    for log in world.run(gather_log_case, policy):
        assert (log.count("encode"), log.count("gather")) == (2, 4), log


@pytest.mark.parametrize("policy", [{"param_dtype": "bfloat16"}, {"float8_all_gather": True}])
def test_the_next_units_codes_are_made_while_the_gather_before_is_in_flight(world, policy):
    """Unit 1's pieces are encoded after unit 0's gather is issued and before it is awaited
    (not between that wait and unit 0's compute); the backward sends the forward's codes."""
    for log in world.run(gather_log_case, policy):
        assert log == ["encode", "gather", "encode", "wait", "gather", "wait",   # forward
                       "gather", "wait", "gather", "wait"], log                  # backward
