"""A Llama with MoE layers: Mixtral-style top-2 SwiGLU experts equal transformers'
MixtralForCausalLM given the same weights (logits, loss and every gradient; float64
within 1e-12 with its float32 router softmax and RMSNorm / rotary islands lifted to
float64), and DeepSeek-style shared experts add one always-on SwiGLU to the routed sum.
(top-k >= 2: with k = 1 the router here keeps the Switch gate p, where Mixtral's
renormalises it to 1.)"""
import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist import backend
from minidist.nn import Llama, LlamaConfig
from minidist.nn.module import persistent_buffers
from oracles.optional import require, require_transformers_model

torch = require("torch")
transformers = require_transformers_model()

from test_llama_vs_transformers import lift_to_float64, rel  # noqa: E402  (tests/nn on path)


def _lift_router(model):
    def forward(self, hidden_states):
        x = hidden_states.reshape(-1, self.hidden_dim)
        logits = torch.nn.functional.linear(x, self.weight)
        probs = torch.softmax(logits, dim=-1)
        top, index = torch.topk(probs, self.top_k, dim=-1)
        return logits, top / top.sum(dim=-1, keepdim=True), index
    for module in model.modules():
        if type(module).__name__.endswith("TopKRouter"):
            module.forward = types.MethodType(forward, module)


def _copy_from_mixtral(ours, theirs, width):
    """Our names from transformers' fused expert tensors (gate_up_proj, down_proj)."""
    t = {n: p.detach().numpy() for n, p in theirs.named_parameters()}
    state = {}
    for name in dict(ours.named_parameters()):
        if ".mlp.router." in name:
            state[name] = t[name.replace(".router.", ".gate.")]
        elif ".mlp.experts." in name:
            prefix, rest = name.split(".mlp.experts.")
            i, proj = rest.split(".")[:2]
            fused = prefix + ".mlp.experts."
            if proj == "down_proj":
                state[name] = t[fused + "down_proj"][int(i)]
            else:
                half = slice(0, width) if proj == "gate_proj" else slice(width, 2 * width)
                state[name] = t[fused + "gate_up_proj"][int(i)][half]
        else:
            state[name] = t[name]
    ours.load_state_dict({**{k: backend.from_host(v) for k, v in state.items()},
                          **persistent_buffers(ours)})        # Mixtral has no selection bias
    return state


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 500), experts=st.sampled_from([4, 6]), k=st.sampled_from([2, 3]),
       aux=st.sampled_from([0.0, 0.02, 0.5]))
def test_mixtral_style_moe_matches_transformers(seed, experts, k, aux):
    """With ``router_aux_loss_coef`` (and transformers' ``output_router_logits``) the
    loss adds Mixtral's balancing loss, pooled over both layers' tokens. transformers
    sums its router probabilities in float32 (``.float()``), so with it the loss and
    gradients agree to float32's rounding of that term rather than float64's."""
    width = 12
    common = dict(vocab_size=23, hidden_size=16, intermediate_size=width, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                  rms_norm_eps=1e-5, rope_theta=10000.0, num_local_experts=experts,
                  num_experts_per_tok=k, router_aux_loss_coef=aux)
    torch.manual_seed(seed)
    theirs = transformers.MixtralForCausalLM(transformers.MixtralConfig(
        attn_implementation="sdpa", experts_implementation="eager",
        output_router_logits=aux > 0, **common)).double()
    lift_to_float64(theirs)
    _lift_router(theirs)
    ours = Llama(LlamaConfig(dtype="float64", **common))
    _copy_from_mixtral(ours, theirs, width)
    rng = np.random.default_rng(seed)
    idx, tgt = rng.integers(0, 23, (2, 9)), rng.integers(0, 23, (2, 9))
    logits, loss = ours(backend.from_host(idx), backend.from_host(tgt))
    loss.backward()
    out = theirs(torch.tensor(idx))
    t_loss = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1),
                                               torch.tensor(tgt).flatten())
    if aux:     # what MixtralForCausalLM adds to the loss when given labels
        t_loss = t_loss + aux * out.aux_loss
    t_loss.backward()
    tol = 1e-12 if aux == 0 else 1e-6 * aux * k      # the term is about aux * k: float32
    assert rel(backend.to_host(logits.data), out.logits.detach().numpy()) <= 1e-12
    assert abs(float(loss.data) - t_loss.item()) <= tol
    grads = {n: p.grad.detach().numpy() for n, p in theirs.named_parameters()}
    mine = {n: backend.to_host(p.grad) for n, p in ours.named_parameters()}
    ours.zero_grad()
    _copy_from_mixtral(ours, types.SimpleNamespace(named_parameters=lambda: [
        (n, torch.tensor(g)) for n, g in grads.items()]), width)
    for name, p in ours.named_parameters():      # their gradients, laid out as ours
        want = backend.to_host(p.data)        # an expert no token chose: both exactly 0
        bound = (1e-10 if aux == 0 else 1e-6) * np.abs(want).max()
        assert np.abs(mine[name] - want).max() <= bound, name


def test_shared_experts_add_an_always_on_swiglu():
    cfg = dict(vocab_size=11, hidden_size=8, intermediate_size=6, num_hidden_layers=1,
               num_attention_heads=2, num_key_value_heads=1, num_local_experts=4,
               dtype="float64")
    with_shared = Llama(LlamaConfig(n_shared_experts=2, **cfg))
    moe = with_shared.blocks[0].mlp
    x = backend.from_host(np.random.default_rng(0).standard_normal((2, 3, 8)))
    from minidist.autograd import Tensor
    routed_and_shared = moe(Tensor(x)).data
    shared = moe.shared
    moe.shared = None
    routed = moe(Tensor(x)).data
    moe.shared = shared
    assert shared.gate_proj.weight.shape == (12, 8)          # 2 experts of width 6, as one
    assert np.abs(backend.to_host(routed_and_shared - routed - shared(Tensor(x)).data)).max() \
        <= 1e-15


def test_moe_llama_refuses_shared_expert_save_and_a_bad_top_k(tmp_path):
    model = Llama(LlamaConfig(num_local_experts=4, n_shared_experts=1))
    with pytest.raises(ValueError, match="no shared experts"):
        model.save_pretrained(str(tmp_path))
    with pytest.raises(ValueError, match="num_experts_per_tok=5 must be in 1 .. "):
        LlamaConfig(num_local_experts=4, num_experts_per_tok=5)
