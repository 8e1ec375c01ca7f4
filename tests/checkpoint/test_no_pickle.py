"""Loading a checkpoint never unpickles: a crafted pickle whose ``__reduce__`` writes a
marker file, put where a single file, a shard, a manifest or a record is expected, is
a ``CheckpointError`` and the marker is never written. ``minidist checkpoint convert``
reads the old (pickled) format only with ``--trust-pickle``."""
import hashlib
import io
import json
import os
import pickle
import zipfile

import numpy as np
import pytest

import minidist.checkpoint.io as ckpt_io
from minidist import backend
from minidist.checkpoint import CheckpointError, load_checkpoint, load_file, save_file
from minidist.checkpoint.convert import convert
from minidist.cli import main
from minidist.comm import World

from .test_format import identical


class Payload:
    """Unpickling this runs ``exec``, which writes ``marker``."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('ran')",)


def crafted(marker, protocol=pickle.HIGHEST_PROTOCOL) -> bytes:
    return pickle.dumps({"model": Payload(marker)}, protocol=protocol)


def test_the_payload_does_run_when_unpickled(tmp_path):
    """The oracle: the same bytes, given to pickle, write the marker."""
    pickle.loads(crafted(tmp_path / "marker"))
    assert (tmp_path / "marker").read_text() == "ran"


@pytest.mark.parametrize("protocol", [0, 2, 5])
def test_a_crafted_pickle_as_a_single_checkpoint_is_refused(tmp_path, protocol):
    from minidist.nn import Linear
    path, marker = tmp_path / "ckpt.npz", tmp_path / "marker"
    path.write_bytes(crafted(marker, protocol))
    with pytest.raises(CheckpointError, match="ckpt.npz") as e:
        load_checkpoint(str(path), Linear(2, 2))
    if protocol >= 2:
        assert "is a pickle" in str(e.value) and "--trust-pickle" in str(e.value)
    with pytest.raises(CheckpointError):
        load_file(str(path))
    assert not marker.exists()


def test_a_pickled_record_inside_the_archive_is_refused(tmp_path):
    """An object array's .npy record holds a pickle; the index may even match it."""
    path, marker = tmp_path / "ckpt.npz", tmp_path / "marker"
    save_file(str(path), dict(w=backend.from_host(np.zeros(1))))
    record = io.BytesIO()
    np.lib.format.write_array(record, np.array([Payload(marker)], dtype=object),
                              allow_pickle=True)
    with zipfile.ZipFile(path) as z:
        index = json.loads(z.read("checkpoint.json"))
    index["records"][0].update(dtype="object", shape=[1],
                               sha256=hashlib.sha256(record.getvalue()).hexdigest())
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("checkpoint.json", json.dumps(index))
        z.writestr(index["records"][0]["name"], record.getvalue())
    with pytest.raises(CheckpointError, match="array of Python objects"):
        load_file(str(path))
    assert not marker.exists()


def plant_and_load(directory, where, marker):
    """World of 1: save ZeRO-1, put the crafted pickle at ``where``, load."""
    from minidist.checkpoint import load_sharded, read_manifest, save_sharded
    from minidist.nn import Linear
    from minidist.optim import AdamW
    from minidist.parallel import Zero1

    def zero():
        return Zero1(Linear(3, 2, dtype="float64"), AdamW, lr=0.1)
    save_sharded(directory, zero())
    vdir, _ = read_manifest(directory)
    data = crafted(marker)
    mpath = os.path.join(vdir, "manifest.json")
    if where == "shard":
        # the manifest is made to vouch for the pickle: size and sha256 match
        manifest = json.load(open(mpath))
        manifest["files"][0].update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
        open(mpath, "w").write(json.dumps(manifest))
        open(os.path.join(vdir, manifest["files"][0]["name"]), "wb").write(data)
    else:
        open(mpath, "wb").write(data)
    try:
        load_sharded(directory, zero())
    except CheckpointError as e:
        return str(e)
    return "loaded"


@pytest.fixture(scope="module")
def world1():
    w = World(1, timeout=20.0, run_timeout=60.0)
    yield w
    w.close()


@pytest.mark.parametrize("where", ["shard", "manifest"])
def test_a_crafted_pickle_in_a_sharded_checkpoint_is_refused(world1, tmp_path, where):
    marker = tmp_path / "marker"
    (message,) = world1.run(plant_and_load, str(tmp_path / "ckpt"), where, str(marker))
    assert "is a pickle" in message and "--trust-pickle" in message, message
    assert ("shard-00000-of-00001.npz" if where == "shard" else "manifest.json") in message
    assert not marker.exists()


class OldHostArray:
    """The old format's array wrapper, as it pickled (module minidist.checkpoint.io)."""

    def __init__(self, host):
        self.host = host


OldHostArray.__module__, OldHostArray.__qualname__ = "minidist.checkpoint.io", "_HostArray"


def old_format(tree, monkeypatch) -> bytes:
    """``tree`` pickled as the old save_file did: arrays wrapped, highest protocol."""
    def wrap(obj):
        if isinstance(obj, np.ndarray):
            return OldHostArray(obj)
        if isinstance(obj, dict):
            return {k: wrap(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(wrap(v) for v in obj)
        return obj
    monkeypatch.setattr(ckpt_io, "_HostArray", OldHostArray, raising=False)
    return pickle.dumps(wrap(tree), protocol=pickle.HIGHEST_PROTOCOL)


def test_convert_refuses_without_trust_pickle(tmp_path, monkeypatch, capsys):
    old, new = tmp_path / "old.pkl", tmp_path / "new.npz"
    old.write_bytes(old_format({"w": np.arange(3.0)}, monkeypatch))
    assert main(["checkpoint", "convert", str(old), str(new)]) == 2
    assert "--trust-pickle" in capsys.readouterr().err
    with pytest.raises(CheckpointError, match="trust"):
        convert(str(old), str(new))
    assert not new.exists()


def test_convert_with_trust_pickle_keeps_every_value(tmp_path, monkeypatch, capsys):
    gen = backend.Generator(5)
    gen.normal(3)
    tree = {"model": {"fc.weight": np.arange(6, dtype="float32").reshape(2, 3)},
            "optimizer": {"state": {0: {"step": 2, "exp_avg": np.ones(3, "float16")}},
                          "param_groups": [{"lr": 0.1, "betas": (0.9, 0.95), "params": [0]}]},
            "rng": gen.get_state(), "extra": {"scale": np.float32(2.0 ** 15), "nan": float("nan")}}
    old, new = tmp_path / "old.pkl", tmp_path / "new.npz"
    old.write_bytes(old_format(tree, monkeypatch))
    with pytest.raises(CheckpointError, match="is a pickle"):
        load_file(str(old))
    assert main(["checkpoint", "convert", str(old), str(new), "--trust-pickle"]) == 0
    assert f"wrote {new}" in capsys.readouterr().out
    identical(tree, load_file(str(new)))
    assert main(["checkpoint", "convert", str(old), str(new), "--trust-pickle"]) == 1
    assert "exists" in capsys.readouterr().err             # nothing is overwritten
    assert main(["checkpoint", "convert", str(tmp_path / "none.pkl"), str(tmp_path / "x.npz"),
                 "--trust-pickle"]) == 1
    assert "none.pkl: no such file" in capsys.readouterr().err


def test_convert_refuses_a_pickle_that_names_anything_else_even_when_trusted(tmp_path,
                                                                             capsys):
    old, new, marker = tmp_path / "old.pkl", tmp_path / "new.npz", tmp_path / "marker"
    old.write_bytes(crafted(marker))
    assert main(["checkpoint", "convert", str(old), str(new), "--trust-pickle"]) == 1
    assert "builtins.exec" in capsys.readouterr().err
    assert not marker.exists() and not new.exists()


def save_old_sharded_convert_and_load(old_dir, new_dir):
    """World of 1: a ZeRO-1 checkpoint in the old format (pickled shards, manifest
    format 1), converted; the converted one loads to the same weights and moments."""
    import shutil

    from minidist.autograd import Tensor
    from minidist.checkpoint import load_sharded, read_manifest, save_sharded
    from minidist.nn import Linear
    from minidist.optim import AdamW
    from minidist.parallel import Zero1
    ckpt_io._HostArray = OldHostArray

    def zero(seed):
        return Zero1(Linear(3, 2, dtype="float64", generator=backend.Generator(seed)), AdamW,
                     lr=0.1, betas=(0.8, 0.9))
    saved = zero(1)
    saved(Tensor(backend.from_host(np.ones((2, 3))))).sum().backward()
    saved.step()
    vdir = save_sharded(old_dir, saved, extra=dict(step=1))
    _, manifest = read_manifest(old_dir)
    for f in manifest["files"]:                      # rewrite it as the old format was
        shard = load_file(os.path.join(vdir, f["name"]))
        f["name"] = f["name"].replace(".npz", ".pkl")
        data = pickle.dumps(_wrap_old(shard), protocol=pickle.HIGHEST_PROTOCOL)
        open(os.path.join(vdir, f["name"]), "wb").write(data)
        f.update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
    manifest.update(format="minidist-sharded-1", hyperparameters=dict(
        manifest["hyperparameters"], betas=list(manifest["hyperparameters"]["betas"])))
    open(os.path.join(vdir, "manifest.json"), "w").write(json.dumps(manifest))
    try:
        load_sharded(old_dir, zero(2))
        refused = ""
    except CheckpointError as e:
        refused = str(e)
    written = convert(old_dir, new_dir, trust_pickle=True)
    loaded = zero(3)
    extra = load_sharded(new_dir, loaded)
    shutil.rmtree(old_dir)
    same = [np.array_equal(backend.to_host(a.data), backend.to_host(b.data))
            for a, b in zip(saved.shards, loaded.shards)]
    for a, b in zip(saved.shards, loaded.shards):
        for k, v in saved.optimizer.state[a].items():
            w = loaded.optimizer.state[b][k]
            same.append(np.array_equal(backend.to_host(v), backend.to_host(w))
                        if backend.is_array(v) else v == w)
    return refused, written, extra, loaded.optimizer.param_groups[0]["betas"], same


def _wrap_old(obj):
    if backend.is_array(obj):
        return OldHostArray(backend.to_host(obj))
    if isinstance(obj, dict):
        return {k: _wrap_old(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_wrap_old(v) for v in obj)
    return obj


def test_convert_turns_an_old_sharded_checkpoint_into_one_that_loads(world1, tmp_path):
    ((refused, written, extra, betas, same),) = world1.run(
        save_old_sharded_convert_and_load, str(tmp_path / "old"), str(tmp_path / "new"))
    assert "old-format" in refused and "--trust-pickle" in refused
    assert [os.path.basename(p) for p in written] == ["shard-00000-of-00001.npz",
                                                      "manifest.json"]
    assert extra == {"step": 1} and betas == (0.8, 0.9)
    assert same and all(same)
