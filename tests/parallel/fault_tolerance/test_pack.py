"""The healing buffer (pack.py) gives back every array bit for bit, with its dtype and
shape (empty and 0-d ones too), at an aligned offset, and every plain value exactly;
the arrays it gives back own their memory. The oracle: the arrays' own bytes."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from minidist import backend
from minidist.parallel.fault_tolerance.pack import ALIGN, pack_state, unpack_state

DTYPES = ["bool", "int8", "uint8", "int16", "int32", "int64", "uint64",
          "float16", "float32", "float64", "complex64", "complex128"]

host_arrays = st.sampled_from(DTYPES).flatmap(lambda dtype: hnp.arrays(
    dtype, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4),
    elements=hnp.from_dtype(np.dtype(dtype), allow_nan=True, allow_infinity=True)
    if dtype.startswith(("float", "complex")) else None))
plain = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()


@st.composite
def states(draw):
    """A state_dict-like tree: arrays (as the backend holds them) and plain values."""
    leaves = draw(st.lists(host_arrays.map(backend.from_host) | plain, max_size=6))
    split = draw(st.integers(0, len(leaves)))
    return {"model": dict(enumerate(leaves[:split])), "optim": (leaves[split:], {"step": 3})}


def _leaves(tree):
    if isinstance(tree, dict):
        return [x for v in tree.values() for x in _leaves(v)]
    if isinstance(tree, (list, tuple)):
        return [x for v in tree for x in _leaves(v)]
    return [tree]


@settings(max_examples=60, deadline=None)
@given(state=states())
def test_unpack_gives_back_every_array_bit_for_bit_and_every_plain_value(state):
    buffer, skeleton_bytes = pack_state(state)
    got = unpack_state(buffer, skeleton_bytes)
    sent, back = _leaves(state), _leaves(got)
    assert len(sent) == len(back)
    for a, b in zip(sent, back):
        if backend.is_array(a):
            a, b = backend.to_host(a), backend.to_host(b)
            assert (b.dtype, b.shape) == (a.dtype, a.shape)
            assert b.tobytes() == a.tobytes()                 # nan payloads, -0.0 too
        else:
            assert b == a and type(b) is type(a)
    assert int(buffer.size) % ALIGN == 0
    assert int(buffer.size) >= skeleton_bytes + sum(int(a.nbytes) for a in sent
                                                    if backend.is_array(a))


@settings(max_examples=20, deadline=None)
@given(state=states())
def test_the_unpacked_arrays_own_their_memory(state):
    buffer, skeleton_bytes = pack_state(state)
    got = [x for x in _leaves(unpack_state(buffer, skeleton_bytes)) if backend.is_array(x)]
    buffer[:] = 0                                  # the buffer gone: nothing changes
    again = [x for x in _leaves(unpack_state(*pack_state(state))) if backend.is_array(x)]
    for a, b in zip(got, again):
        assert backend.to_host(a).tobytes() == backend.to_host(b).tobytes()
        host = backend.to_host(a)
        assert math.prod(host.shape) == 0 or host.flags.c_contiguous


@pytest.mark.skipif(backend.get_backend() != "numpy", reason="ml_dtypes arrays are NumPy's")
@pytest.mark.parametrize("name", ["bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_ml_dtypes_arrays_come_back_as_themselves_not_as_raw_bytes(name):
    """bfloat16's dtype.str is '<V2' and float8's '<f1': the record names the dtype, so a
    healed bfloat16 moment is bfloat16 again, not void."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    sent = np.linspace(-3, 3, 10).astype(getattr(ml_dtypes, name)).reshape(2, 5)
    back = unpack_state(*pack_state({"m": sent}))["m"]
    assert back.dtype == sent.dtype and back.tobytes() == sent.tobytes()


@settings(max_examples=20, deadline=None)
@given(state=states())
def test_unpacked_views_are_each_arrays_own_bytes_of_the_buffer(state):
    """copy=False (what a healed replica loads): each array a view of the buffer, bit
    for bit the packed one, and no two share a byte (writing one leaves the rest)."""
    buffer, skeleton_bytes = pack_state(state)
    sent = [x for x in _leaves(state) if backend.is_array(x)]
    got = [x for x in _leaves(unpack_state(buffer, skeleton_bytes, copy=False))
           if backend.is_array(x)]
    for a, b in zip(got, sent):
        assert backend.to_host(a).tobytes() == backend.to_host(b).tobytes()
    buffer[skeleton_bytes:] = 255                  # every array's bytes, through the buffer
    for a in got:
        assert all(byte == 255 for byte in backend.to_host(a).tobytes())
    for i, a in enumerate(got):
        if a.size:
            a.reshape(-1).view("uint8")[:] = 0     # one array's bytes; the others keep theirs
            others = [x for j, x in enumerate(got) if j != i]
            assert all(byte == 255 for x in others for byte in backend.to_host(x).tobytes())
            a.reshape(-1).view("uint8")[:] = 255


def test_numpy_scalars_come_back_as_the_same_scalars():
    """A step or a loss scale kept as a NumPy scalar: neither a plain value marshal
    writes nor an array; it travels as a 0-d array and comes back its own type."""
    sent = {"step": np.int64(7), "scale": np.float64(2.0 ** 16), "half": np.float16(0.1)}
    back = unpack_state(*pack_state(sent))
    for key, value in sent.items():
        assert type(back[key]) is type(value) and back[key].tobytes() == value.tobytes()


def test_a_value_the_buffer_cannot_carry_is_refused_naming_where_it_is():
    class Sampler:
        pass
    with pytest.raises(TypeError, match=r"state\['data'\]\[1\]\['sampler'\] is a Sampler"):
        pack_state({"model": {}, "data": [3, {"sampler": Sampler()}]})
