"""A fully_shard model's DTensor state dict saved by 2 ranks loads into 3 (and 1): every
tensor, gathered, is the saved one bit for bit, a persistent buffer (every rank's whole
array) too; each rank reads only overlapping pieces."""
import numpy as np

from minidist.comm import World
from minidist import backend


def _model(seed):
    from minidist.distributed.fsdp import fully_shard
    from minidist.nn import GPT, GPTConfig
    model = GPT(GPTConfig(block_size=8, vocab_size=11, n_layer=1, n_head=2, n_embd=8,
                          dtype="float64", seed=seed))
    model.blocks[0].register_buffer("tally", backend.xp.arange(3.0) * seed)   # not sharded
    fully_shard(model.blocks[0])
    fully_shard(model)
    return model


def save_case(path):
    from minidist import backend
    from minidist.checkpoint.dtensor import save_dtensors
    from minidist.distributed.fsdp import sharded_state_dict
    state = sharded_state_dict(_model(1))
    save_dtensors(path, state)
    return _gathered(state)


def load_case(path):
    from minidist import backend
    from minidist.checkpoint.dtensor import load_dtensors
    from minidist.distributed.fsdp import sharded_state_dict
    state = sharded_state_dict(_model(2))            # other values, until loaded
    load_dtensors(path, state)
    return _gathered(state)


def test_dtensor_checkpoint_reshards_across_world_sizes(tmp_path):
    path = str(tmp_path / "ckpt")
    with World(2, timeout=20.0, run_timeout=90.0) as world:
        saved = world.run(save_case, path)[0]
    assert saved["blocks.0.tally"].tolist() == [0.0, 1.0, 2.0]
    for n in (3, 1):
        with World(n, timeout=20.0, run_timeout=90.0) as world:
            for loaded in world.run(load_case, path):
                assert loaded.keys() == saved.keys()
                for name, value in saved.items():
                    assert loaded[name].tobytes() == value.tobytes(), (n, name)
                    assert not np.isnan(value).any()


def _tp_model(seed, sequence_parallel=False):
    """A GPT under the whole tensor-parallel plan over the world."""
    import minidist.distributed as dist
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.tensor.parallel import gpt_tp_plan, parallelize_module
    from minidist.nn import GPT, GPTConfig
    t = dist.get_world_size()
    cfg = GPTConfig(block_size=8, vocab_size=8, n_layer=1, n_head=4, n_embd=16,
                    dtype="float64", seed=seed)
    mesh = init_device_mesh(backend.device_type(), (t,), mesh_dim_names=("tp",))
    return parallelize_module(GPT(cfg), mesh["tp"], gpt_tp_plan(cfg, t, sequence_parallel))


def _gathered(state):
    from minidist import backend
    from minidist.distributed.tensor import DTensor
    return {k: backend.to_host(v.full_tensor().data if isinstance(v, DTensor) else v)
            for k, v in state.items()}


def tp_save_case(path):
    """Save at tp = world; on the way, load_state_dict takes the dense model's arrays and
    another TP model's DTensors, each rank keeping its piece."""
    from dataclasses import replace

    from minidist.checkpoint.dtensor import save_dtensors
    from minidist.distributed.tensor import DTensor
    from minidist.distributed.tensor.parallel import full_state_dict
    from minidist.nn import GPT
    model = _tp_model(1)
    state = model.state_dict()
    layouts = {k: [str(p) for p in v.placements] for k, v in state.items()
               if isinstance(v, DTensor)}
    save_dtensors(path, state)
    from_dense, from_dtensors = _tp_model(2), _tp_model(3)
    from_dense.load_state_dict(GPT(model.config).state_dict())
    from_dtensors.load_state_dict(state)
    one_process = GPT(replace(model.config, seed=5))   # and back into the plain model
    one_process.load_state_dict(full_state_dict(model))
    return (_gathered(state), layouts, _gathered(from_dense.state_dict()),
            _gathered(from_dtensors.state_dict()), _gathered(one_process.state_dict()),
            _gathered(GPT(model.config).state_dict()))


def tp_load_case(path, sequence_parallel):
    from minidist.checkpoint.dtensor import load_dtensors
    model = _tp_model(4, sequence_parallel)              # other values, until loaded
    load_dtensors(path, model.state_dict())
    return _gathered(model.state_dict())


def test_tp_state_dict_is_dtensors_and_reshards_to_other_degrees(tmp_path):
    path = str(tmp_path / "tp")
    with World(2, timeout=20.0, run_timeout=90.0) as world:
        saved, layouts, from_dense, from_dtensors, plain, dense = world.run(tp_save_case,
                                                                            path)[0]
    assert plain.keys() == dense.keys()
    for name, value in dense.items():
        assert plain[name].tobytes() == value.tobytes(), name
    assert layouts["blocks.0.attn.c_attn.weight"] == ["Shard(dim=1)"]   # the (3, C, C) stack
    assert layouts["blocks.0.mlp.c_proj.weight"] == ["Shard(dim=1)"]
    assert layouts["wte.weight"] == ["Shard(dim=0)"]
    assert saved["blocks.0.attn.c_attn.weight"].shape == (3, 16, 16)
    for name, value in saved.items():
        assert from_dense[name].tobytes() == value.tobytes(), name
        assert from_dtensors[name].tobytes() == value.tobytes(), name
    for n, sp in ((1, False), (4, True)):
        with World(n, timeout=20.0, run_timeout=90.0) as world:
            for loaded in world.run(tp_load_case, path, sp):
                assert loaded.keys() == saved.keys()
                for name, value in saved.items():
                    assert loaded[name].tobytes() == value.tobytes(), (n, name)


def _hsdp_model(seed, shape):
    """The GPT under fully_shard on a mesh of ``shape``: (S,) FSDP, (R, S) HSDP."""
    from minidist.distributed.device_mesh import init_device_mesh
    from minidist.distributed.fsdp import fully_shard
    from minidist.nn import GPT, GPTConfig
    mesh = init_device_mesh(backend.device_type(), shape)
    model = GPT(GPTConfig(block_size=8, vocab_size=11, n_layer=1, n_head=2, n_embd=8,
                          dtype="float64", seed=seed))
    fully_shard(model.blocks[0], mesh=mesh)
    return fully_shard(model, mesh=mesh)


def hsdp_case(path, shape, seed, save):
    """Save (or load into) a model sharded on a mesh of ``shape``: the gathered tensors,
    and the names of the tensors in this rank's piece file."""
    from minidist.checkpoint.dtensor import load_dtensors, save_dtensors
    from minidist.distributed.fsdp import sharded_state_dict
    state = sharded_state_dict(_hsdp_model(seed, shape))
    (save_dtensors if save else load_dtensors)(path, state)
    return _gathered(state)


def test_an_hsdp_checkpoint_is_saved_once_and_reshards_to_fsdp_and_back(tmp_path):
    """HSDP's [Replicate(), Shard(0)] parameters: the replica at coordinate 0 writes the
    S pieces, the other writes none; they load into FSDP at 3 ranks and into HSDP (2, 2)
    from a 1-D save, bit for bit."""
    import json
    import os
    path, back = str(tmp_path / "hsdp"), str(tmp_path / "back")
    with World(4, timeout=20.0, run_timeout=90.0) as world:
        saved = world.run(hsdp_case, path, (2, 2), 1, True)[0]
    info = json.load(open(os.path.join(path, "dtensors.json")))
    cut = {n: t for n, t in info["tensors"].items() if t["layout"] != "replicate"}
    assert cut and all(t["owners"] == [0, 1] for t in cut.values())
    replica_one = np.load(os.path.join(path, "piece-00002-of-00004.npz"))
    assert not set(replica_one.files) & set(cut)          # the second replica wrote none
    with World(3, timeout=20.0, run_timeout=90.0) as world:
        for loaded in world.run(hsdp_case, path, (3,), 2, False):
            assert all(loaded[n].tobytes() == v.tobytes() for n, v in saved.items())
        world.run(hsdp_case, back, (3,), 1, True)
    with World(4, timeout=20.0, run_timeout=90.0) as world:
        for loaded in world.run(hsdp_case, back, (2, 2), 2, False):
            assert all(loaded[n].tobytes() == v.tobytes() for n, v in saved.items())


def test_a_manifest_whose_owners_are_not_ranks_is_refused(tmp_path):
    import json
    import os

    import pytest

    from minidist.checkpoint.dtensor import read_dtensors_manifest
    from minidist.checkpoint.io import CheckpointError
    for n in range(2):
        open(os.path.join(tmp_path, f"piece-{n:05d}-of-00002.npz"), "wb").close()
    for owners in ([0, 0], [2], [], "01", [True], [0, 1, 1]):
        entry = {"shape": [4], "layout": "shard0", "owners": owners}
        with open(os.path.join(tmp_path, "dtensors.json"), "w") as f:
            json.dump({"world": 2, "tensors": {"w": entry}}, f)
        with pytest.raises(CheckpointError, match="owners"):
            read_dtensors_manifest(str(tmp_path))


def one_file_case(path, tensor_parallel):
    """save_checkpoint (rank 0 writes) of a model of pieces: refused, and nothing written."""
    import os
    from minidist.checkpoint import CheckpointError, save_checkpoint
    from minidist.optim import AdamW
    model = _tp_model(1) if tensor_parallel else _model(1)
    try:
        save_checkpoint(path, model, AdamW(model.parameters(), lr=1e-2))
    except CheckpointError as e:
        return str(e), os.path.exists(path)
    return None, os.path.exists(path)


def test_one_file_of_rank_0s_pieces_is_refused(tmp_path):
    """A fully_shard (or tensor-parallel) model saved by save_checkpoint was rank 0's
    pieces, which every rank then loaded as its own: at two ranks rank 1's weights came
    back 9e-2 away from what it had saved. It is refused, naming save_dtensors."""
    with World(2, timeout=20.0, run_timeout=90.0) as world:
        for tensor_parallel in (False, True):
            path = str(tmp_path / f"one_file_{tensor_parallel}.npz")
            for message, written in world.run(one_file_case, path, tensor_parallel):
                assert message is not None and "save_dtensors" in message, tensor_parallel
                assert not written
