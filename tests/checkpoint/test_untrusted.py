"""A checkpoint from a stranger: every name read from a file stays inside the checkpoint,
loading removes nothing it cannot prove unfinished, and no file makes the loader hang
or allocate what the file merely claims (docs/checkpoints.md, "What a loader trusts")."""
import hashlib
import json
import os
import shutil
import zipfile

import numpy as np
import pytest

from minidist import backend
from minidist.checkpoint import CheckpointError, load_file, read_manifest, save_file
from minidist.comm import World
from minidist.untrusted import MAX_JSON_BYTES

from .test_format import three_doubles_claiming

DEAD_PID = 99999999          # above any pid_max: never a running process


def _victim(tmp_path):
    """A directory outside the checkpoint, with a file and a temporary that a load
    which wandered there would read or remove."""
    victim = tmp_path / "victim"
    victim.mkdir()
    save_file(str(victim / "data.npz"), dict(w=backend.from_host(np.arange(3.0))))
    (victim / f".data.npz.tmp-{DEAD_PID}").write_bytes(b"someone's data")
    (victim / f".manifest.json.tmp-{DEAD_PID}").write_bytes(b"someone's data")
    return victim


def _spy_reads(monkeypatch):
    """Every path the checkpoint loader opens."""
    import minidist.checkpoint.io as ckpt_io
    opened = []
    real = ckpt_io.read_regular

    def recording(path, *args):
        opened.append(os.path.realpath(path))
        return real(path, *args)
    monkeypatch.setattr(ckpt_io, "read_regular", recording)
    return opened


def _sharded_by_hand(directory, version="v1"):
    """A version directory with a manifest (enough for read_manifest)."""
    vdir = directory / version
    vdir.mkdir(parents=True)
    (vdir / "manifest.json").write_text(json.dumps(dict(format="minidist-sharded-2")))
    return vdir


@pytest.mark.parametrize("latest", ["../victim", "v1/../../victim", "/etc", "v1\n../victim",
                                    "v1/", "v7"])
def test_a_latest_that_leaves_the_checkpoint_is_refused_naming_it(tmp_path, monkeypatch,
                                                                   latest):
    victim = _victim(tmp_path)
    (victim / "manifest.json").write_text(json.dumps(dict(format="minidist-sharded-2")))
    ckpt = tmp_path / "ckpt"
    _sharded_by_hand(ckpt)
    os.symlink(victim, ckpt / "v7")              # a version directory that links out
    (ckpt / "LATEST").write_text(latest)
    opened = _spy_reads(monkeypatch)
    with pytest.raises(CheckpointError) as e:
        read_manifest(str(ckpt))
    assert repr(latest.strip()) in str(e.value), str(e.value)
    assert all(p.startswith(os.path.realpath(ckpt)) for p in opened), opened
    assert sorted(os.listdir(victim)) == [".data.npz.tmp-99999999",
                                          ".manifest.json.tmp-99999999", "data.npz",
                                          "manifest.json"]


def test_a_missing_latest_removes_nothing_and_says_how_to_publish(tmp_path):
    ckpt = tmp_path / "ckpt"
    for v in ("v1", "v2"):
        _sharded_by_hand(ckpt, v)
    from minidist.checkpoint.sharded import remove_partial_versions
    assert remove_partial_versions(str(ckpt)) == []
    with pytest.raises(CheckpointError, match=r"holds v1, v2.*echo vN >"):
        read_manifest(str(ckpt))
    assert sorted(os.listdir(ckpt)) == ["v1", "v2"]


def test_only_versions_newer_than_a_parsed_latest_are_removed(tmp_path):
    ckpt = tmp_path / "ckpt"
    for v in ("v1", "v2", "v3"):
        _sharded_by_hand(ckpt, v)
    (ckpt / "LATEST").write_text("v2")
    from minidist.checkpoint.sharded import remove_partial_versions
    assert remove_partial_versions(str(ckpt)) == ["v3"]
    (ckpt / "LATEST").write_text("../v1")          # not ours to interpret
    assert remove_partial_versions(str(ckpt)) == []
    assert sorted(os.listdir(ckpt)) == ["LATEST", "v1", "v2"]


def shard_named(directory, victim, name, missing_latest):
    """World of 1: save ZeRO-1 twice (v1 copied to v2), then name ``name`` as the shard
    in the manifest (or lose LATEST), and load. Returns the error and what was opened."""
    import minidist.checkpoint.io as ckpt_io
    from minidist.checkpoint import load_sharded, save_sharded
    from minidist.nn import Linear
    from minidist.optim import AdamW
    from minidist.parallel import Zero1

    def zero():
        return Zero1(Linear(3, 2, dtype="float64"), AdamW, lr=0.1)
    vdir = save_sharded(directory, zero())
    mpath = os.path.join(vdir, "manifest.json")
    if missing_latest:
        shutil.copytree(vdir, os.path.join(directory, "v2"))
        os.remove(os.path.join(directory, "LATEST"))
    else:
        manifest = json.load(open(mpath))
        data = open(os.path.join(victim, "data.npz"), "rb").read()
        if name is None:            # the right name, a link out of the checkpoint
            name = manifest["files"][0]["name"]
            os.remove(os.path.join(vdir, name))
            os.symlink(os.path.join(victim, "data.npz"), os.path.join(vdir, name))
        manifest["files"][0].update(name=name, sha256=hashlib.sha256(data).hexdigest(),
                                    bytes=len(data))    # the manifest vouches for it
        open(mpath, "w").write(json.dumps(manifest))
    opened, real = [], ckpt_io.read_regular
    ckpt_io.read_regular = lambda path, *a: opened.append(os.path.realpath(path)) or \
        real(path, *a)
    try:
        load_sharded(directory, zero())
    except CheckpointError as e:
        return str(e), opened
    finally:
        ckpt_io.read_regular = real
    return "loaded", opened


@pytest.fixture(scope="module")
def world1():
    w = World(1, timeout=20.0, run_timeout=60.0)
    yield w
    w.close()


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink", "other-rank"])
def test_a_manifest_naming_a_file_outside_is_refused_and_nothing_outside_removed(
        world1, tmp_path, how):
    victim = _victim(tmp_path)
    ckpt = tmp_path / "ckpt"
    name = {"dotdot": "../../victim/data.npz", "absolute": str(victim / "data.npz"),
            "symlink": None, "other-rank": "shard-00001-of-00002.npz"}[how]
    ((message, opened),) = world1.run(shard_named, str(ckpt), str(victim), name, False)
    assert "refused" in message, message
    if name is not None:
        assert repr(name) in message, message
    else:
        assert "symbolic link" in message, message
    assert not any(p.startswith(os.path.realpath(victim)) for p in opened), opened
    assert (victim / f".data.npz.tmp-{DEAD_PID}").exists()


def test_a_lost_latest_leaves_every_version_and_lists_them(world1, tmp_path):
    ckpt = tmp_path / "ckpt"
    ((message, _),) = world1.run(shard_named, str(ckpt), None, None, True)
    assert "v1, v2" in message and "LATEST" in message, message
    assert os.path.isfile(ckpt / "v1" / "manifest.json")
    assert os.path.isfile(ckpt / "v2" / "shard-00000-of-00001.npz")


@pytest.mark.timeout(20, method="thread")   # (a blocked open ignores signals)
@pytest.mark.parametrize("where", ["file", "manifest", "latest"])
def test_a_fifo_where_a_file_is_expected_is_refused_without_hanging(tmp_path, where):
    ckpt = tmp_path / "ckpt"
    vdir = _sharded_by_hand(ckpt)
    target = {"file": tmp_path / "c.npz", "manifest": vdir / "manifest.json",
              "latest": ckpt / "LATEST"}[where]
    if where != "latest":
        (ckpt / "LATEST").write_text("v1")
    target.unlink(missing_ok=True)
    os.mkfifo(target)
    with pytest.raises(CheckpointError, match="not a regular file"):
        load_file(str(target)) if where == "file" else read_manifest(str(ckpt))


def test_a_symbolic_link_to_a_checkpoint_file_is_refused(tmp_path):
    save_file(str(tmp_path / "real.npz"), dict(w=backend.from_host(np.arange(3.0))))
    os.symlink(tmp_path / "real.npz", tmp_path / "link.npz")
    with pytest.raises(CheckpointError, match="symbolic link"):
        load_file(str(tmp_path / "link.npz"))


def test_a_compressed_index_is_refused_at_the_cap(tmp_path):
    """64 MiB of JSON spaces deflate to about 64 KB: inflated only up to the cap."""
    path = tmp_path / "c.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("checkpoint.json", b"{" + b" " * MAX_JSON_BYTES + b"}")
    assert os.path.getsize(path) < MAX_JSON_BYTES // 500
    with pytest.raises(CheckpointError, match=f"more than {MAX_JSON_BYTES} bytes"):
        load_file(str(path))


@pytest.mark.parametrize("shape", [[-1, 3], [2**32, 2**32, 2**32], [3, -1, -1]])
def test_a_negative_or_overflowing_shape_is_refused_before_allocating(tmp_path, shape):
    """np.prod([2**32] * 3) wraps to 0 and [-1, -1] multiplies to 1: the count is exact."""
    path = tmp_path / "c.npz"
    three_doubles_claiming(path, shape, shape)
    with pytest.raises(CheckpointError, match="non-negative|shorter than|more than"):
        load_file(str(path))


def dtensors_damaged(path, victim, damage):
    """World of 1: save a fully_shard GPT's DTensors, damage dtensors.json (or link a
    piece out of the directory), load into another model. Returns the error."""
    from minidist.checkpoint.dtensor import MANIFEST, load_dtensors, save_dtensors
    from minidist.distributed.fsdp import sharded_state_dict

    from .test_dtensor import _model
    save_dtensors(path, sharded_state_dict(_model(1)))
    mpath = os.path.join(path, MANIFEST)
    info = json.load(open(mpath))
    kind, value = damage
    if kind == "world":
        info["world"] = value
    elif kind == "shape":
        first = next(iter(info["tensors"].values()))
        first["shape"] = value
    elif kind == "layout":
        next(iter(info["tensors"].values()))["layout"] = value
    elif kind == "link":
        piece = os.path.join(path, "piece-00000-of-00001.npz")
        shutil.copy(piece, os.path.join(victim, "data.npz"))
        os.remove(piece)
        os.symlink(os.path.join(victim, "data.npz"), piece)
    open(mpath, "w").write(json.dumps(info))
    try:
        load_dtensors(path, sharded_state_dict(_model(2)))
    except CheckpointError as e:
        return str(e)
    return "loaded"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("damage", [("world", 0), ("world", -3), ("world", 10**12),
                                    ("world", 2), ("world", True), ("shape", [-8, -11]),
                                    ("shape", "8"), ("layout", "shard7"), ("link", None)])
def test_a_dtensor_manifest_with_a_bad_world_shape_or_link_is_refused(world1, tmp_path,
                                                                       damage):
    """A world of 0 or -3 used to leave the tensors silently unchanged, 10^12 to busy-loop;
    the world must be at least 1 and at most the pieces present, all of them there."""
    victim = _victim(tmp_path)
    (message,) = world1.run(dtensors_damaged, str(tmp_path / "ckpt"), str(victim), damage)
    expected = {"world": f"says world {damage[1]!r}", "shape": f"shape {damage[1]!r}",
                "layout": f"layout {damage[1]!r}", "link": "is a symbolic link"}[damage[0]]
    assert expected in message, message


def test_a_safetensors_header_over_the_json_cap_is_refused(tmp_path):
    pytest.importorskip("safetensors")
    path = tmp_path / "c.safetensors"
    header = b"{" + b" " * MAX_JSON_BYTES + b"}"
    path.write_bytes(len(header).to_bytes(8, "little") + header)
    with pytest.raises(CheckpointError, match=f"more than the {MAX_JSON_BYTES} allowed"):
        load_file(str(path))
