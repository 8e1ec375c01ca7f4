"""Mixtral checkpoints: a tiny random transformers MixtralForCausalLM (built here, no
network), saved, loads with Llama.from_pretrained as a Llama with MoE layers giving the
same logits, loss and every gradient (float64 <= 1e-12 with transformers' float32
islands lifted: RMSNorm variance, rotary table, router softmax; float32 <= 1e-5);
ours saved loads in transformers with the same logits and no missing or unexpected
tensor; the fused expert layout (gate_up_proj, down_proj) loads the same model as the
per-expert one; greedy decoding gives the same tokens; a checkpoint that does not fit
is refused naming the tensor."""
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist import backend
from minidist.nn import Llama, LlamaConfig
from oracles.optional import require, require_transformers_model

torch = require("torch")
transformers = require_transformers_model()
pytest.importorskip("safetensors")

from test_llama_moe import _copy_from_mixtral, _lift_router  # noqa: E402  (tests/nn on path)
from test_llama_vs_transformers import both_backward, lift_to_float64, rel, tokens  # noqa: E402

from minidist.nn.hf import CheckpointMismatch  # noqa: E402

WIDTH, VOCAB = 12, 23


def mixtral(seed=0, dtype=torch.float64, experts=4, k=2, kv=2, window=None, layers=2):
    torch.manual_seed(seed)
    cfg = transformers.MixtralConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=WIDTH, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=kv, max_position_embeddings=32,
        rms_norm_eps=1e-5, rope_theta=10000.0, num_local_experts=experts,
        num_experts_per_tok=k, sliding_window=window, attn_implementation="sdpa",
        experts_implementation="eager")
    model = transformers.MixtralForCausalLM(cfg)
    with torch.no_grad():          # RMSNorm weights start at 1: make them matter
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))
    model = model.to(dtype)
    if dtype == torch.float64:
        lift_to_float64(model)
        _lift_router(model)
    return model


def their_grads_as_ours(ours, theirs):
    """transformers' gradients laid out under our names (test_llama_moe's mapping)."""
    import types
    grads = [(n, p.grad.detach().clone()) for n, p in theirs.named_parameters()]
    keep = dict(ours.state_dict())
    _copy_from_mixtral(ours, types.SimpleNamespace(named_parameters=lambda: grads), WIDTH)
    out = {n: backend.to_host(p.data).copy() for n, p in ours.named_parameters()}
    ours.load_state_dict(keep)
    return out


def compare(theirs, directory, tol, seed):
    theirs.save_pretrained(directory)
    ours = Llama.from_pretrained(str(directory))
    assert ours.config.num_local_experts == theirs.config.num_local_experts
    idx, tgt = tokens(seed, length=9, vocab=VOCAB), tokens(seed + 1, length=9, vocab=VOCAB)
    both_backward(ours, theirs, idx, tgt, tol)
    want = their_grads_as_ours(ours, theirs)
    for name, p in ours.named_parameters():
        err = np.abs(backend.to_host(p.grad) - want[name]).max()
        assert err <= tol * 10 * np.abs(want[name]).max(), name   # 0 for an unchosen expert
    return ours


@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 500), experts=st.sampled_from([3, 4]), k=st.sampled_from([2, 3]),
       kv=st.sampled_from([1, 2, 4]), window=st.sampled_from([None, 5]))
def test_float64_mixtral_matches_transformers_to_1e_12(tmp_path_factory, seed, experts, k, kv,
                                                       window):
    theirs = mixtral(seed, torch.float64, experts, k, kv, window)
    ours = compare(theirs, tmp_path_factory.mktemp("mixtral"), 1e-12, seed)
    assert ours.config.sliding_window == window


def test_float32_mixtral_matches_transformers_to_1e_5(tmp_path):
    compare(mixtral(3, torch.float32), tmp_path, 1e-5, 3)


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_saved_mixtral_loads_in_transformers_with_the_same_logits(tmp_path, dtype, tol):
    mixtral(7, dtype).save_pretrained(tmp_path / "a")
    ours = Llama.from_pretrained(str(tmp_path / "a"))
    ours.save_pretrained(str(tmp_path / "b"))
    back, info = transformers.MixtralForCausalLM.from_pretrained(
        tmp_path / "b", output_loading_info=True, attn_implementation="sdpa",
        experts_implementation="eager")
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert back.dtype == dtype
    if dtype == torch.float64:
        lift_to_float64(back)
        _lift_router(back)
    idx = tokens(7, length=9, vocab=VOCAB)
    want = backend.to_host(ours(backend.from_host(idx))[0].data)
    assert rel(back(torch.tensor(idx)).logits.detach().numpy(), want) <= tol


def test_fused_expert_layout_loads_the_same_model(tmp_path):
    from safetensors.torch import save_file
    theirs = mixtral(9)
    theirs.save_pretrained(tmp_path / "per_expert")
    fused = tmp_path / "fused"
    fused.mkdir()
    save_file({k: v.contiguous() for k, v in theirs.state_dict().items()},
              str(fused / "model.safetensors"))
    assert any(k.endswith("experts.gate_up_proj") for k in theirs.state_dict())
    (fused / "config.json").write_text((tmp_path / "per_expert" / "config.json").read_text())
    a = Llama.from_pretrained(str(tmp_path / "per_expert"))
    b = Llama.from_pretrained(str(fused))
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert np.array_equal(backend.to_host(p.data), backend.to_host(q.data)), name


def test_greedy_decoding_gives_the_same_20_tokens(tmp_path):
    theirs = mixtral(11)
    theirs.save_pretrained(tmp_path)
    ours = Llama.from_pretrained(str(tmp_path))
    prompt = tokens(11, batch=1, length=5, vocab=VOCAB)
    want = theirs.generate(torch.tensor(prompt), max_new_tokens=20, do_sample=False,
                           min_new_tokens=20, pad_token_id=0)
    got = ours.generate(backend.from_host(prompt), 20, do_sample=False)
    assert np.array_equal(backend.to_host(got), want.numpy())


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("mixtral_saved")
    mixtral(5, torch.float32, layers=1).save_pretrained(path)
    return path


def rewrite(saved, tmp_path, change_tensors=None, change_config=None):
    from safetensors.numpy import load_file, save_file
    tensors = load_file(str(saved / "model.safetensors"))
    config = json.loads((saved / "config.json").read_text())
    if change_tensors:
        change_tensors(tensors)
    if change_config:
        change_config(config)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


EXPERT = "model.layers.0.block_sparse_moe.experts.1.w3.weight"


def test_a_checkpoint_without_the_selection_bias_loads_it_at_its_init(saved):
    """Mixtral has no selection bias (DeepSeek-V3's ``e_score_correction_bias``): each
    router's persistent ``expert_bias`` stays at its zeros, in the model's state dict."""
    ours = Llama.from_pretrained(str(saved))
    state = ours.state_dict()
    assert np.array_equal(backend.to_host(state["model.layers.0.mlp.expert_bias"]),
                          np.zeros(4))
    Llama(ours.config).load_state_dict(state)        # strict: the buffer with the weights


def test_missing_expert_tensor_is_named_with_our_name(saved, tmp_path):
    with pytest.raises(CheckpointMismatch,
                       match=r"missing tensor 'model\.layers\.0\.mlp\.experts\.1\.up_proj"):
        Llama.from_pretrained(rewrite(saved, tmp_path, lambda t: t.pop(EXPERT)))


def test_wrong_expert_shape_names_both_shapes(saved, tmp_path):
    def shrink(t):
        t[EXPERT] = t[EXPERT][:-1]
    with pytest.raises(CheckpointMismatch, match=r"experts\.1\.up_proj\.weight': expected "
                                                 r"shape \(12, 16\), found \(11, 16\)"):
        Llama.from_pretrained(rewrite(saved, tmp_path, shrink))


def test_expert_beyond_the_config_is_unexpected(saved, tmp_path):
    def extra(t):
        t["model.layers.0.block_sparse_moe.experts.9.w1.weight"] = t[EXPERT]
    with pytest.raises(CheckpointMismatch, match=r"unexpected tensor 'model\.layers\.0\.mlp"
                                                 r"\.experts\.9\.gate_proj\.weight'"):
        Llama.from_pretrained(rewrite(saved, tmp_path, extra))


@pytest.mark.parametrize("change, message", [
    ({"num_experts_per_tok": 1}, "num_experts_per_tok=1"),
    ({"router_jitter_noise": 0.1}, "router_jitter_noise=0.1")])
def test_unsupported_mixtral_config_is_refused(saved, tmp_path, change, message):
    with pytest.raises(CheckpointMismatch, match=message):
        Llama.from_pretrained(rewrite(saved, tmp_path, change_config=lambda c: c.update(change)))


def test_shared_experts_and_top_1_refuse_to_save(tmp_path):
    base = dict(vocab_size=11, hidden_size=8, intermediate_size=6, num_hidden_layers=1,
                num_attention_heads=2, num_local_experts=4)
    with pytest.raises(ValueError, match="no shared experts"):
        Llama(LlamaConfig(n_shared_experts=1, **base)).save_pretrained(str(tmp_path / "a"))
    with pytest.raises(ValueError, match="num_experts_per_tok=1"):
        Llama(LlamaConfig(num_experts_per_tok=1, **base)).save_pretrained(str(tmp_path / "b"))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
