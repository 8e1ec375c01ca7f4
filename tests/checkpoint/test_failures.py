"""Checkpoint writes are atomic, and a missing, truncated, swapped or mismatched file
is a ``CheckpointError`` that names it."""
import os

import numpy as np
import pytest

from minidist import backend
from minidist.checkpoint import CheckpointError, atomic_write_bytes, load_file, save_file
from minidist.comm import World

from . import resume_cases as R


def test_a_crash_mid_write_leaves_the_previous_file(tmp_path, monkeypatch):
    path = str(tmp_path / "ckpt.npz")
    save_file(path, dict(w=backend.from_host(np.arange(3.0))))

    def crash(src, dst):
        raise OSError("power cut")
    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="power cut"):
        save_file(path, dict(w=backend.from_host(np.zeros(3))))
    monkeypatch.undo()
    assert np.array_equal(backend.to_host(load_file(path)["w"]), np.arange(3.0))
    assert os.listdir(tmp_path) == ["ckpt.npz"]            # no temp file left behind


def test_truncated_single_file_is_named(tmp_path):
    path = str(tmp_path / "ckpt.npz")
    save_file(path, dict(w=backend.from_host(np.arange(1000.0))))
    with open(path, "r+b") as f:
        f.truncate(100)
    with pytest.raises(CheckpointError, match="ckpt.npz"):
        load_file(path)
    atomic_write_bytes(path, b"")
    with pytest.raises(CheckpointError, match="ckpt.npz"):
        load_file(path)


def damage_and_load(directory, damage):
    """On every rank: save ZeRO-2 after 2 steps, damage the checkpoint, try to load."""
    import minidist.distributed as dist
    from minidist.checkpoint import load_sharded, read_manifest
    from minidist.optim import AdamW
    from minidist.parallel import Zero2
    case = dict(strategy="zero2", seed=3)
    R.run(case, directory, 0, 2)
    vdir, _ = read_manifest(directory)
    shard1 = os.path.join(vdir, "shard-00001-of-00002.npz")
    dist.barrier()
    if dist.get_rank() == 0:
        if damage == "missing":
            os.remove(shard1)
        elif damage == "truncated":
            with open(shard1, "r+b") as f:
                f.truncate(os.path.getsize(shard1) // 2)
        elif damage == "swapped":
            with open(os.path.join(vdir, "shard-00000-of-00002.npz"), "rb") as f:
                data = f.read()
            with open(shard1, "wb") as f:
                f.write(data)
        elif damage == "manifest":
            with open(os.path.join(vdir, "manifest.json"), "w") as f:
                f.write("{not json")
    dist.barrier()
    hidden = 9 if damage == "other-model" else 6
    model = R.TinyNet(R.D_IN, hidden, R.D_OUT, "float64", seed=0)
    zero = Zero2(model, AdamW, bucket_cap_mb=1e-4, lr=0.01)
    try:
        load_sharded(directory, zero)
    except CheckpointError as e:
        return str(e)
    return "loaded"


@pytest.fixture(scope="module")
def world2():
    w = World(2, timeout=20.0, run_timeout=90.0)
    yield w
    w.close()


@pytest.mark.parametrize("damage,named", [("missing", "shard-00001-of-00002.npz"),
                                          ("truncated", "shard-00001-of-00002.npz"),
                                          ("swapped", "shard-00001-of-00002.npz"),
                                          ("manifest", "manifest.json"),
                                          ("other-model", "manifest.json")])
def test_damaged_sharded_checkpoint_is_an_error_naming_the_file(world2, tmp_path, damage,
                                                                named):
    messages = world2.run(damage_and_load, str(tmp_path), damage)
    # every rank that reads the damaged file says which one; with resharding, rank 0
    # reads only its own shard, so at least one rank names it
    assert any(named in m for m in messages), messages
    assert "loaded" not in messages or damage in ("missing", "truncated", "swapped")


def crash_before_publishing(directory):
    """Save twice; the second save dies after writing its shards, before LATEST moves."""
    import minidist.checkpoint.sharded as sharded
    case = dict(strategy="zero1", seed=4)
    first = R.run(case, directory, 0, 2)

    def crash(path, version):
        raise OSError("crash before publishing")
    real, sharded._publish = sharded._publish, crash
    try:
        R.run(case, directory, 2, 3)
    except OSError:
        pass
    finally:
        sharded._publish = real
    return first, sorted(os.listdir(directory))


def test_a_crash_mid_save_leaves_the_previous_checkpoint_readable(tmp_path):
    with World(1, timeout=20.0, run_timeout=60.0) as w:
        first, listing = w.run(crash_before_publishing, str(tmp_path))[0]
        assert listing == ["LATEST", "v1", "v2"]          # v2 incomplete, never published
        resumed = w.run(R.run, dict(strategy="zero1", seed=4), str(tmp_path), 2, 2, False)[0]
    for k in first:
        assert np.array_equal(resumed[k], first[k])


def save_with_an_array_in_extra(directory):
    from minidist.checkpoint import save_sharded
    from minidist.optim import AdamW
    from minidist.parallel import Zero1
    zero = Zero1(R.TinyNet(R.D_IN, 6, R.D_OUT, "float64", seed=0), AdamW, lr=0.01)
    try:
        save_sharded(directory, zero, extra=dict(scale=backend.from_host(np.ones(2))))
    except CheckpointError as e:
        return str(e), os.path.exists(directory)
    return "saved", os.path.exists(directory)


def test_an_array_in_a_sharded_manifest_is_refused_on_every_rank_before_writing(world2,
                                                                                tmp_path):
    results = world2.run(save_with_an_array_in_extra, str(tmp_path / "ckpt"))
    for message, wrote in results:
        assert "holds arrays (at ['scale'])" in message and not wrote, results
