"""The data-only format keeps every value bit for bit, with its type, and refuses
what it cannot hold, naming the key path."""
import hashlib
import io
import json
import math
import re
import struct
import zipfile

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from minidist import backend
from minidist.checkpoint import CheckpointError, load_file, save_file

# every dtype a state dict of this project holds, and ml_dtypes' narrow floats
DTYPES = ["float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8",
          "uint16", "uint32", "uint64", "bool", ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn,
          ml_dtypes.float8_e5m2]
if backend.get_backend() == "cupy":  # CuPy has no arrays of ml_dtypes' narrow floats
    DTYPES = DTYPES[:-3]


def identical(a, b, path="") -> None:
    """The oracle: same types, same structure, arrays with equal dtype, shape and bytes,
    floats with equal bits (so nan, -0.0 and inf count)."""
    if isinstance(a, np.generic):
        assert type(b) is type(a) and a.tobytes() == b.tobytes(), path
    elif backend.is_array(a) or isinstance(a, np.ndarray):
        assert backend.is_array(b), path                       # back on the backend
        a, b = backend.to_host(a), backend.to_host(b)
        assert (a.dtype, a.shape) == (b.dtype, b.shape), path
        assert a.tobytes() == b.tobytes(), path
    elif isinstance(a, dict):
        assert type(b) is dict and list(a) == list(b), path
        for k in a:
            identical(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(b) is type(a) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            identical(x, y, f"{path}[{i}]")
    elif isinstance(a, float):
        assert type(b) is float and struct.pack("<d", a) == struct.pack("<d", b), path
    else:
        assert type(b) is type(a) and a == b, path


@st.composite
def arrays(draw):
    """Any bit pattern of any dtype above (nan payloads, -0.0, inf, subnormals)."""
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
    n = int(np.prod(shape)) * dtype.itemsize
    raw = np.frombuffer(draw(st.binary(min_size=n, max_size=n)), dtype="uint8")
    if dtype == np.bool_:
        raw = raw & 1                                          # bools are 0 or 1
    return backend.from_host(raw.view(dtype).reshape(shape).copy())


def floats_by_bits():
    return st.integers(0, 2**64 - 1).map(lambda u: struct.unpack("<d", struct.pack("<Q", u))[0])


plain = st.one_of(st.none(), st.booleans(), st.text(max_size=8), st.integers(-2**130, 2**130),
                  floats_by_bits(), st.floats(allow_nan=True, allow_infinity=True))
scalars = arrays().filter(lambda a: a.size > 0).map(lambda a: backend.to_host(a).ravel()[0])
keys = st.one_of(st.text(max_size=6), st.integers(-3, 2**70), st.booleans(), st.none(),
                 st.tuples(st.integers(0, 3), st.text(max_size=3)))
trees = st.recursive(
    st.one_of(plain, arrays(), scalars),
    lambda children: st.one_of(st.lists(children, max_size=3),
                               st.tuples(children, children),
                               st.dictionaries(keys, children, max_size=3)),
    max_leaves=12)


@settings(max_examples=60, deadline=None)
@given(tree=trees)
def test_a_round_trip_keeps_every_value_bit_for_bit(tmp_path_factory, tree):
    path = str(tmp_path_factory.mktemp("ckpt") / "ckpt.npz")
    digest = save_file(path, dict(tree=tree))
    identical(dict(tree=tree), load_file(path, sha256=digest))


def test_optimizer_sampler_and_rng_states_round_trip(tmp_path):
    from minidist.autograd import Tensor
    from minidist.nn import Linear
    from minidist.optim import AdamW
    from minidist.optim import WarmupCosine
    from minidist.parallel import DistributedSampler
    from minidist.precision import GradScaler
    model = Linear(3, 2, dtype="float32", generator=backend.Generator(1))
    opt = AdamW(model.parameters(), lr=0.1, betas=(0.8, 0.9))
    schedule = WarmupCosine(opt, warmup_steps=2, total_steps=10)
    model(Tensor(backend.from_host(np.ones((2, 3), "float32")))).sum().backward()
    opt.step()
    schedule.step()
    gen = backend.Generator(7)
    gen.normal(5)                                      # the 128-bit words move past 2^53
    sampler = DistributedSampler(10, num_replicas=1, rank=0, seed=3)
    state = dict(model=dict(model.state_dict()), optimizer=opt.state_dict(),
                 sampler=sampler.state_dict(), rng=gen.get_state(),
                 extra=dict(step=4, scheduler=schedule.state_dict(),
                            scaler=GradScaler(init_scale=2.0 ** 15).state_dict()))
    save_file(str(tmp_path / "c.npz"), state)
    loaded = load_file(str(tmp_path / "c.npz"))
    identical(state, loaded)
    assert loaded["optimizer"]["param_groups"][0]["betas"] == (0.8, 0.9)   # a tuple still
    again = backend.Generator(0)
    again.set_state(loaded["rng"])
    assert np.array_equal(backend.to_host(again.normal(4)), backend.to_host(gen.normal(4)))


def test_the_file_is_json_and_npy_records(tmp_path):
    path = tmp_path / "c.npz"
    save_file(str(path), {"model": {"fc.weight": backend.from_host(np.eye(2))}, "step": 3})
    with zipfile.ZipFile(path) as z:
        index = json.loads(z.read("checkpoint.json"))
    assert index["structure"] == {"model": {"fc.weight": {"$array": 0}}, "step": 3}
    (record,) = index["records"]
    assert (record["name"], record["dtype"], record["shape"]) == \
        ("00000-model.fc.weight.npy", "float64", [2, 2])
    with np.load(path, allow_pickle=False) as f:           # NumPy reads it too
        assert np.array_equal(f["00000-model.fc.weight"], np.eye(2))


@pytest.mark.parametrize("value,where", [
    (lambda: 0, "['extra']['hook']"),
    ({1, 2}, "['extra']['hook']"),
    (b"bytes", "['extra']['hook']"),
    ([1, object()], "['extra']['hook'][1]"),
    (np.array([None], dtype=object), "['extra']['hook']"),
])
def test_a_value_a_checkpoint_cannot_hold_is_refused_naming_its_key_path(tmp_path, value,
                                                                          where):
    path = tmp_path / "c.npz"
    with pytest.raises(CheckpointError, match="cannot save .*" + re.escape(where)):
        save_file(str(path), dict(extra=dict(hook=value)))
    assert not path.exists()


def test_a_record_that_does_not_match_its_index_is_refused(tmp_path):
    path = tmp_path / "c.npz"
    save_file(str(path), dict(w=backend.from_host(np.arange(4.0))))
    with zipfile.ZipFile(path) as z:
        index, raw = z.read("checkpoint.json"), z.read("00000-w.npy")
    with zipfile.ZipFile(path, "w") as z:                  # same index, other bytes
        z.writestr("checkpoint.json", index)
        z.writestr("00000-w.npy", raw[:-8] + np.float64(math.pi).tobytes())
    with pytest.raises(CheckpointError, match="00000-w.npy does not match its sha256"):
        load_file(str(path))


@pytest.mark.parametrize("shape", [[2**40], [3, 1]])
def test_a_record_header_that_disagrees_with_the_index_or_its_length_is_refused(tmp_path,
                                                                                shape):
    """Checked before anything is allocated: a header asking for 8 TiB is an error, not
    a MemoryError; a header of another shape than the index's is refused."""
    path = tmp_path / "c.npz"
    three_doubles_claiming(path, shape, [3] if shape == [3, 1] else shape)
    with pytest.raises(CheckpointError, match="shorter than" if shape[0] > 3 else "says"):
        load_file(str(path))


def three_doubles_claiming(path, shape: list, index_shape: list) -> None:
    """Write a checkpoint whose one record holds 3 doubles under a .npy header saying
    ``shape``, listed in the index with ``index_shape`` (sha256 right)."""
    save_file(str(path), dict(w=backend.from_host(np.arange(3.0))))
    with zipfile.ZipFile(path) as z:
        index, raw = json.loads(z.read("checkpoint.json")), z.read("00000-w.npy")
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, dict(descr="<f8", fortran_order=False,
                                                      shape=tuple(shape)))
    record = header.getvalue() + raw[-24:]                 # the 3 doubles
    index["records"][0].update(shape=index_shape, sha256=hashlib.sha256(record).hexdigest())
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("checkpoint.json", json.dumps(index))
        z.writestr("00000-w.npy", record)


@settings(max_examples=25, deadline=None)
@given(tree=trees)
def test_a_safetensors_checkpoint_keeps_every_value_bit_for_bit(tmp_path_factory, tree):
    pytest.importorskip("safetensors")
    path = str(tmp_path_factory.mktemp("ckpt") / "ckpt.safetensors")
    digest = save_file(path, dict(tree=tree))
    identical(dict(tree=tree), load_file(path))
    identical(dict(tree=tree), load_file(path, sha256=digest))


def test_a_safetensors_checkpoint_is_readable_by_safetensors(tmp_path):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    path = tmp_path / "c.safetensors"
    save_file(str(path), {"model": {"fc.weight": backend.from_host(np.eye(2, dtype="float32"))},
                          "step": 3})
    tensors = safetensors_numpy.load_file(str(path))
    assert list(tensors) == ["00000-model.fc.weight"]
    assert np.array_equal(tensors["00000-model.fc.weight"], np.eye(2, dtype="float32"))


def test_safetensors_weights_without_the_index_are_not_a_checkpoint(tmp_path):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    path = tmp_path / "weights.safetensors"
    safetensors_numpy.save_file({"w": np.zeros(2)}, str(path))
    with pytest.raises(CheckpointError, match="not a minidist checkpoint"):
        load_file(str(path))


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=False),
              st.text(alphabet="$0123456789-abxfint", max_size=6),
              st.sampled_from(["1" * 5000, "-", "0x7ff8000000000000"])),
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.dictionaries(st.sampled_from(["$dict", "$tuple", "$int", "$float", "$scalar",
                                         "$array", "a", "b"]), children, max_size=2)),
    max_leaves=10)


@settings(max_examples=150, deadline=None)
@given(structure=json_values, wrong=st.one_of(st.none(), st.sampled_from([
    ("shape", []), ("shape", [1, 2]), ("shape", "x"), ("dtype", "bfloat16"),
    ("dtype", "object"), ("dtype", "uint64"), ("dtype", 3), ("name", "other.npy")])))
def test_any_index_is_either_read_or_a_checkpoint_error(tmp_path_factory, structure, wrong):
    """Whatever checkpoint.json says (tags in any shape, records that do not match),
    loading returns data or raises CheckpointError: never another exception."""
    path = tmp_path_factory.mktemp("ckpt") / "c.npz"
    record = io.BytesIO()
    np.lib.format.write_array(record, np.arange(2.0))
    entry = dict(name="r.npy", dtype="float64", shape=[2],
                 sha256=hashlib.sha256(record.getvalue()).hexdigest())
    if wrong is not None:
        entry[wrong[0]] = wrong[1]
    index = dict(format="minidist-checkpoint-1", structure=structure, records=[entry])
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("checkpoint.json", json.dumps(index))
        z.writestr("r.npy", record.getvalue())
    try:
        load_file(str(path))
    except CheckpointError:
        pass
