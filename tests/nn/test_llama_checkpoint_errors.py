"""A Hugging Face checkpoint that does not fit is refused with the tensor named, and
nothing is half-loaded; without the safetensors package the error names the extra."""
import builtins
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


@settings(max_examples=30, deadline=None)
@given(layers=st.integers(0, 2), heads=st.sampled_from([(2, 1), (2, 2), (4, 2)]),
       biases=st.tuples(st.booleans(), st.booleans()), tied=st.booleans(),
       experts=st.sampled_from([(0, 0), (3, 0), (2, 1)]))
def test_parameter_shapes_are_what_the_built_model_has(layers, heads, biases, tied, experts):
    """The oracle: named_parameters of the model itself, names, shapes and order."""
    cfg = LlamaConfig(vocab_size=7, hidden_size=8, intermediate_size=6, num_hidden_layers=layers,
                      num_attention_heads=heads[0], num_key_value_heads=heads[1],
                      attention_bias=biases[0], mlp_bias=biases[1], tie_word_embeddings=tied,
                      num_local_experts=experts[0], n_shared_experts=experts[1],
                      moe_intermediate_size=4 if experts[0] else None)
    built = [(name, tuple(p.shape)) for name, p in Llama(cfg).named_parameters()]
    assert list(Llama.parameter_shapes(cfg)) == built


HUGE = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=2**31,
            hidden_size=2**20, intermediate_size=2**22, num_hidden_layers=10**6,
            num_attention_heads=2**10, num_key_value_heads=2**10)
UNDER_3_GIB = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
from minidist.nn import Llama
from minidist.nn.hf import CheckpointMismatch
try:
    Llama.from_pretrained(sys.argv[1])
except CheckpointMismatch as e:
    print("refused:", e)
"""


def test_a_config_claiming_a_huge_model_with_tiny_weights_is_refused_before_building(
        tmp_path):
    """A 174-byte directory once asked for 64 TiB: the headers are checked against the
    config first, in a process that may not map more than 3 GiB."""
    (tmp_path / "config.json").write_text(json.dumps(HUGE))
    safetensors_numpy.save_file({"model.embed_tokens.weight": np.zeros((1, 1), "float32")},
                                str(tmp_path / "model.safetensors"))
    assert sum(p.stat().st_size for p in tmp_path.iterdir()) < 600
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
               PYTHONPATH=str(pathlib.Path(__file__).parents[2]))
    done = subprocess.run([sys.executable, "-c", UNDER_3_GIB, str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "MemoryError" not in done.stderr, done.stderr[-2000:]
    assert "refused: " in done.stdout and "'model.embed_tokens.weight'" in done.stdout, \
        done.stdout
    assert "expected shape (2147483648, 1048576), found (1, 1)" in done.stdout


@pytest.mark.parametrize("file", ["../victim/model.safetensors", "/tmp/model.safetensors",
                                  "sub/model.safetensors", "..", "link.safetensors"])
def test_an_index_naming_a_file_outside_the_directory_is_refused(saved, tmp_path, file):
    victim = tmp_path.parent / "victim"
    victim.mkdir(exist_ok=True)
    (victim / "model.safetensors").write_bytes((saved / "model.safetensors").read_bytes())
    os.symlink(victim / "model.safetensors", saved / "link.safetensors")
    names = safetensors_numpy.load_file(str(saved / "model.safetensors"))
    index = {"weight_map": {name: file for name in names}}
    (saved / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointMismatch, match="refused") as e:
        Llama.from_pretrained(str(saved))
    assert repr(file) in str(e.value) or "symbolic link" in str(e.value)


@pytest.mark.parametrize("damage", ["beyond", "short", "dtype", "negative"])
def test_a_header_claiming_bytes_the_file_lacks_or_a_wrong_dtype_is_refused(saved, damage):
    """The header is read alone and checked: its byte ranges inside the file, each range
    as long as its dtype and shape say, each weight a float."""
    path = saved / "model.safetensors"
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    entry = header["model.norm.weight"]
    start, end = entry["data_offsets"]
    if damage == "beyond":
        entry["data_offsets"] = [start + len(data), end + len(data)]
    elif damage == "short":
        entry["shape"] = [4]
    elif damage == "dtype":
        entry["dtype"] = "I32"
    else:
        entry["shape"] = [-8]
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + data[8 + n:])
    expected = {"beyond": "claims bytes", "short": "claims bytes", "dtype": "not a float",
                "negative": "non-negative"}[damage]
    with pytest.raises(CheckpointMismatch, match=expected):
        Llama.from_pretrained(str(saved))


@pytest.mark.timeout(20, method="thread")   # (a blocked open ignores signals)
@pytest.mark.parametrize("where", ["config.json", "model.safetensors"])
def test_a_fifo_in_a_checkpoint_directory_is_refused_without_hanging(saved, where):
    (saved / where).unlink()
    os.mkfifo(saved / where)
    with pytest.raises(CheckpointMismatch, match="not a regular file"):
        Llama.from_pretrained(str(saved))
