"""A fully_shard model's DTensor state dict saved by 2 ranks loads into 3 (and 1): every
tensor, gathered, is the saved one bit for bit; each rank reads only overlapping pieces."""
import numpy as np

from minidist.comm import World


def _model(seed):
    from minidist.distributed.fsdp import fully_shard
    from minidist.nn import GPT, GPTConfig
    model = GPT(GPTConfig(block_size=8, vocab_size=11, n_layer=1, n_head=2, n_embd=8,
                          dtype="float64", seed=seed))
    fully_shard(model.blocks[0])
    fully_shard(model)
    return model


def save_case(path):
    from minidist import backend
    from minidist.checkpoint.dtensor import save_dtensors
    from minidist.distributed.fsdp import sharded_state_dict
    state = sharded_state_dict(_model(1))
    save_dtensors(path, state)
    return {k: backend.to_host(d.full_tensor().data) for k, d in state.items()}


def load_case(path):
    from minidist import backend
    from minidist.checkpoint.dtensor import load_dtensors
    from minidist.distributed.fsdp import sharded_state_dict
    state = sharded_state_dict(_model(2))            # other values, until loaded
    load_dtensors(path, state)
    return {k: backend.to_host(d.full_tensor().data) for k, d in state.items()}


def test_dtensor_checkpoint_reshards_across_world_sizes(tmp_path):
    path = str(tmp_path / "ckpt")
    with World(2, timeout=20.0, run_timeout=90.0) as world:
        saved = world.run(save_case, path)[0]
    for n in (3, 1):
        with World(n, timeout=20.0, run_timeout=90.0) as world:
            for loaded in world.run(load_case, path):
                assert loaded.keys() == saved.keys()
                for name, value in saved.items():
                    assert loaded[name].tobytes() == value.tobytes(), (n, name)
                    assert not np.isnan(value).any()
