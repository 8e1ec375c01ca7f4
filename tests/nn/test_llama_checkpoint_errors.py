"""A Hugging Face checkpoint that does not fit is refused with the tensor named, and
nothing is half-loaded; without the safetensors package the error names the extra."""
import builtins
import json

import numpy as np
import pytest

from minidist.nn import Llama, LlamaConfig
from minidist.nn.hf import CheckpointMismatch

safetensors_numpy = pytest.importorskip("safetensors.numpy")


@pytest.fixture
def saved(tmp_path):
    model = Llama(LlamaConfig(vocab_size=11, hidden_size=8, intermediate_size=12,
                              num_hidden_layers=1, num_attention_heads=2,
                              num_key_value_heads=1))
    model.save_pretrained(str(tmp_path))
    return tmp_path


def _rewrite(path, change):
    tensors = safetensors_numpy.load_file(str(path / "model.safetensors"))
    change(tensors)
    safetensors_numpy.save_file(tensors, str(path / "model.safetensors"),
                                metadata={"format": "pt"})


def test_a_saved_model_loads_back_bit_for_bit(saved):
    first = Llama.from_pretrained(str(saved))
    first.save_pretrained(str(saved / "again"))
    again = Llama.from_pretrained(str(saved / "again"))
    for (name, a), (_, b) in zip(first.named_parameters(), again.named_parameters()):
        assert np.array_equal(a.data, b.data), name


def test_missing_tensor_is_named(saved):
    _rewrite(saved, lambda t: t.pop("model.layers.0.mlp.up_proj.weight"))
    with pytest.raises(CheckpointMismatch, match=r"missing tensor 'model.layers.0.mlp.up_proj"
                                                 r".weight' \(expected shape \(12, 8\)\)"):
        Llama.from_pretrained(str(saved))


def test_unexpected_tensor_is_named(saved):
    _rewrite(saved, lambda t: t.update({"model.layers.0.extra": np.zeros(3, "float32")}))
    with pytest.raises(CheckpointMismatch, match="unexpected tensor 'model.layers.0.extra'"):
        Llama.from_pretrained(str(saved))


def test_wrong_shape_names_both_shapes(saved):
    _rewrite(saved, lambda t: t.update({"model.norm.weight": np.ones(9, "float32")}))
    with pytest.raises(CheckpointMismatch, match=r"'model.norm.weight': expected shape \(8,\), "
                                                 r"found \(9,\)"):
        Llama.from_pretrained(str(saved))


def test_unsupported_architecture_is_refused(saved):
    config = json.loads((saved / "config.json").read_text())
    config.update(architectures=["GPT2LMHeadModel"], model_type="gpt2")
    (saved / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointMismatch, match="unsupported architecture.*GPT2LMHeadModel"):
        Llama.from_pretrained(str(saved))


def test_scaled_rope_is_refused(saved):
    config = json.loads((saved / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}
    (saved / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointMismatch, match="rope_type 'llama3'"):
        Llama.from_pretrained(str(saved))


@pytest.mark.parametrize("damage", ["truncate", "header"])
def test_truncated_or_corrupt_file_is_refused(saved, damage):
    path = saved / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[:len(data) - 40] if damage == "truncate" else b"\xff" * 16 + data[16:])
    with pytest.raises(CheckpointMismatch, match="truncated or corrupt"):
        Llama.from_pretrained(str(saved))


def test_not_a_checkpoint_directory(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="neither model.safetensors nor"):
        Llama.from_pretrained(str(tmp_path))


def test_index_naming_a_tensor_its_shard_lacks(saved):
    index = {"weight_map": {"model.norm.weight": "model.safetensors",
                            "lm_head.weight": "model-00002-of-00002.safetensors"}}
    (saved / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(FileNotFoundError, match="model-00002-of-00002.safetensors"):
        Llama.from_pretrained(str(saved))


def test_without_safetensors_the_error_names_the_extra(saved, monkeypatch):
    real_import = builtins.__import__

    def no_safetensors(name, *args, **kwargs):
        if name.startswith("safetensors"):
            raise ImportError("No module named 'safetensors'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_safetensors)
    with pytest.raises(ImportError, match=r'pip install -e "\.\[hf\]"'):
        Llama.from_pretrained(str(saved))
    with pytest.raises(ImportError, match="safetensors"):
        Llama(LlamaConfig()).save_pretrained(str(saved / "x"))
