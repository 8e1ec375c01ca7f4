"""calc.llama: the Llama-3 8B and 70B parameter counts from their configs; the count of
any drawn config equals the parameters of minidist's Llama and of transformers' one; FLOPs
and KV cache follow their formulas, and GQA saves what it claims."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.calc.llama import (LLAMA3_70B, LLAMA3_8B, kv_cache_bytes, llama_flops_per_token,
                                 llama_params)
from minidist.cli import main
from oracles.optional import require_transformers_model


def test_llama3_8b_and_70b_parameter_counts():
    assert llama_params(**LLAMA3_8B).total == 8_030_261_248
    assert llama_params(**LLAMA3_70B).total == 70_553_706_496


def test_llama3_8b_kv_cache_is_128_kib_per_token_in_bf16():
    assert kv_cache_bytes(32, 8, 128, 1) == 131072
    assert kv_cache_bytes(32, 8, 128, 8192, batch=2, bytes_per_element=1) == 2 ** 30


configs = st.fixed_dictionaries(dict(
    vocab_size=st.integers(2, 40), num_hidden_layers=st.integers(1, 3),
    num_key_value_heads=st.integers(1, 3), group=st.integers(1, 3), head_half=st.integers(1, 4),
    intermediate_size=st.integers(1, 30), tie_word_embeddings=st.booleans()))


def _unpack(c):
    c = dict(c)
    heads = c.pop("group") * c["num_key_value_heads"]
    hidden = heads * 2 * c.pop("head_half")
    return dict(c, num_attention_heads=heads, hidden_size=hidden)


@settings(max_examples=15, deadline=None)
@given(c=configs)
def test_count_equals_the_models_parameters(c):
    c = _unpack(c)
    want = llama_params(**c)
    from minidist.nn import Llama, LlamaConfig
    assert Llama(LlamaConfig(**c)).num_parameters() == want.total
    transformers = require_transformers_model()
    theirs = transformers.LlamaForCausalLM(transformers.LlamaConfig(**c))
    assert sum(p.numel() for p in theirs.parameters()) == want.total


def test_gqa_lowers_the_flops_by_the_smaller_k_v_projections_only():
    mha = llama_flops_per_token(4096, **dict(LLAMA3_8B, num_key_value_heads=32))
    gqa = llama_flops_per_token(4096, **LLAMA3_8B)
    assert mha - gqa == 6 * 32 * 2 * 4096 * (32 - 8) * 128


def test_flops_per_token_is_six_n_matmul_plus_attention():
    n_mm = llama_params(**LLAMA3_8B).total - 128256 * 4096 - (2 * 32 + 1) * 4096
    assert llama_flops_per_token(8192, **LLAMA3_8B) == 6 * n_mm + 12 * 32 * 8192 * 4096


@pytest.mark.parametrize("flag", ["--model", "--preset"])   # --model as in plan; --preset kept
def test_cli_prints_the_8b_count_and_refuses_a_missing_size(flag, capsys):
    assert main(["calc", "llama", flag, "llama3-8b"]) == 0
    assert "8,030,261,248" in capsys.readouterr().out
    with pytest.raises(SystemExit) as stop:
        main(["calc", "llama", "--hidden", "64"])
    assert stop.value.code == 2
    assert "--vocab is needed" in capsys.readouterr().err


def test_count_agrees_with_the_planners_model_sizes():
    """The planner counts the same model (its total leaves the final norm out)."""
    from minidist.calc.planner.model import total_params
    from minidist.calc.planner.presets import MODELS
    for name, config in (("llama3-8b", LLAMA3_8B), ("llama3-70b", LLAMA3_70B)):
        assert llama_params(**config).total == total_params(MODELS[name]) + config["hidden_size"]
