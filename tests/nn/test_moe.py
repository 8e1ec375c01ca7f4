"""The MoE layer (nn/moe.py, nn/router.py) equals a PyTorch twin written here from the
formulas (dense: every expert on every token, masked), and its gradients equal
central differences. The twin decides capacity with a plain loop, so it checks the
vectorised queue positions too."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist import backend
from minidist.autograd import Tensor, gradcheck
from minidist.nn import GPT, GPTConfig, MoE
from minidist.nn.router import capacity, route
from oracles.optional import require

torch = require("torch")


def torch_moe(moe, x, bias=None):
    """The same layer in PyTorch: (out, aux, kept, params by name, x)."""
    params = {n: torch.tensor(backend.to_host(p.data), requires_grad=True)
              for n, p in moe.named_parameters()}
    tx = torch.tensor(x, requires_grad=True)
    S, C = x.shape[0] * x.shape[1], x.shape[2]
    E, k, groups = moe.n_expert, moe.top_k, moe.groups
    xf = tx.reshape(S, C)
    logits = xf @ params["router.weight"].T
    probs = torch.softmax(logits, dim=-1)
    scores = probs.detach() + (0 if bias is None else torch.tensor(bias))
    chosen = torch.topk(scores, k, dim=-1).indices                       # (S, k)
    gates = torch.gather(probs, 1, chosen)
    if moe.normalize and k > 1:
        gates = gates / gates.sum(-1, keepdim=True)
    kept = np.ones((S, k), dtype=bool)
    if moe.capacity_factor > 0:
        per = S // groups
        cap = math.ceil(moe.capacity_factor * per * k / E)
        for g in range(groups):
            load = [0] * E
            for slot in range(k):
                for t in range(g * per, (g + 1) * per):
                    e = int(chosen[t, slot])
                    kept[t, slot] = load[e] < cap
                    load[e] += 1
    out = torch.zeros(S, C, dtype=tx.dtype)
    for i in range(E):
        p = {n.split(f"experts.{i}.")[1]: v for n, v in params.items()
             if n.startswith(f"experts.{i}.")}
        h = torch.nn.functional.gelu(xf @ p["c_fc.weight"].T + p["c_fc.bias"], approximate="tanh")
        y = h @ p["c_proj.weight"].T + p["c_proj.bias"]                  # (S, C) all tokens
        w = ((chosen == i) & torch.tensor(kept)).to(tx.dtype) * gates     # (S, k)
        out = out + y * w.sum(-1, keepdim=True)
    f = torch.zeros(E, dtype=tx.dtype)
    for i in range(E):
        f[i] = (chosen == i).sum().item() / (S * k)
    balance = E * (f * probs.mean(0)).sum()
    z = (torch.logsumexp(logits, dim=-1) ** 2).mean()
    aux = moe.aux_coef * balance + moe.z_coef * z
    return out.reshape(x.shape), aux, kept, params, tx


@settings(max_examples=15, deadline=None)
@given(E=st.integers(1, 6), k=st.integers(1, 3), cf=st.sampled_from([0.0, 0.5, 1.0, 1.5]),
       groups=st.sampled_from([1, 2]), B=st.integers(1, 3), T=st.sampled_from([2, 4]),
       z=st.sampled_from([0.0, 1e-2]), normalize=st.booleans(), seed=st.integers(0, 999))
def test_moe_matches_a_pytorch_twin(E, k, cf, groups, B, T, z, normalize, seed):
    k = min(k, E)
    C = 6
    moe = MoE(C, E, k, hidden=8, capacity_factor=cf, groups=groups, normalize=normalize,
              aux_coef=0.1, z_coef=z, dtype="float64", generator=backend.Generator(seed))
    x = np.random.default_rng(seed).standard_normal((B, T, C))
    tx_out, taux, tkept, tparams, tx = torch_moe(moe, x)
    xt = Tensor(backend.from_host(x), requires_grad=True)
    out = moe(xt)
    (out.sum() + moe.aux_loss).backward()
    (tx_out.sum() + taux).backward()
    np.testing.assert_array_equal(backend.to_host(moe.last.kept), tkept)
    np.testing.assert_allclose(backend.to_host(out.data), tx_out.detach().numpy(), atol=1e-12)
    np.testing.assert_allclose(moe.aux_loss.item(), taux.item(), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(backend.to_host(xt.grad), tx.grad.numpy(), atol=1e-12)
    for name, p in moe.named_parameters():
        np.testing.assert_allclose(backend.to_host(p.grad), tparams[name].grad.numpy(),
                                   atol=1e-12, err_msg=name)


@pytest.mark.parametrize("k", [1, 2])
def test_moe_gradients_match_finite_differences(k):
    gen = backend.Generator(3)
    moe = MoE(4, 3, k, hidden=5, capacity_factor=1.0, aux_coef=0.3, z_coef=0.1,
              dtype="float64", generator=gen)
    x = Tensor(backend.from_host(np.random.default_rng(1).standard_normal((2, 3, 4))),
               requires_grad=True)
    params = list(moe.parameters())

    def loss(x, *ps):
        out = moe(x)
        return (out * out).sum() + moe.aux_loss
    assert gradcheck(loss, [x] + params)


@settings(max_examples=20, deadline=None)
@given(S=st.sampled_from([4, 8, 12]), E=st.integers(1, 5), k=st.integers(1, 3),
       cf=st.floats(0.1, 2.0), groups=st.sampled_from([1, 2, 4]), seed=st.integers(0, 99))
def test_no_expert_takes_more_than_its_capacity_from_a_group(S, E, k, cf, groups, seed):
    k = min(k, E)
    logits = Tensor(backend.from_host(np.random.default_rng(seed).standard_normal((S, E))))
    r = route(logits, k, capacity_factor=cf, groups=groups)
    chosen, kept = backend.to_host(r.experts), backend.to_host(r.kept)
    cap = capacity(cf, S // groups, k, E)
    for g in range(groups):
        rows = slice(g * S // groups, (g + 1) * S // groups)
        for i in range(E):
            wanted = int((chosen[rows] == i).sum())
            assert int(((chosen[rows] == i) & kept[rows]).sum()) == min(wanted, cap)


def test_bias_moves_the_choice_but_not_the_gate():
    logits = Tensor(backend.from_host(np.array([[2.0, 1.0, 0.0]])))
    plain = route(logits, 1)
    biased = route(logits, 1, bias=backend.from_host(np.array([-5.0, 0.0, 0.0])))
    assert int(backend.to_host(plain.experts)[0, 0]) == 0
    assert int(backend.to_host(biased.experts)[0, 0]) == 1
    p = np.exp([2.0, 1.0, 0.0]) / np.exp([2.0, 1.0, 0.0]).sum()
    assert biased.gates.item() == pytest.approx(p[1])


def test_bias_balancing_evens_out_the_load():
    """DeepSeek-V3's rule alone (no aux loss) spreads tokens skewed to one expert."""
    rng = np.random.default_rng(0)
    moe = MoE(4, 4, 1, hidden=4, aux_coef=0.0, bias_rate=0.05, dtype="float64",
              generator=backend.Generator(0))
    moe.router.weight.data[0] += 1.0                    # expert 0 is everyone's favourite
    x = Tensor(backend.from_host(np.abs(rng.standard_normal((1, 64, 4)))))
    moe(x)
    first = backend.to_host(moe.last.counts).max()
    for _ in range(40):
        moe(x)
        moe.update_bias()
    assert backend.to_host(moe.last.counts).max() < first


def test_top_k_larger_than_the_experts_is_an_error():
    with pytest.raises(ValueError, match="top-k must be between 1 and the 2 experts"):
        route(Tensor(backend.from_host(np.zeros((3, 2)))), 3)


def test_gpt_with_moe_blocks_adds_their_aux_loss_and_learns():
    cfg = GPTConfig(block_size=8, vocab_size=11, n_layer=2, n_head=2, n_embd=8,
                    moe_every=2, n_expert=4, moe_top_k=2, capacity_factor=1.25,
                    moe_z_coef=1e-3, dtype="float64")
    model = GPT(cfg)
    assert [type(b.mlp).__name__ for b in model.blocks] == ["MLP", "MoE"]
    assert "blocks.1.mlp.experts.3.c_fc.weight" in dict(model.named_parameters())
    rng = np.random.default_rng(0)
    idx = backend.from_host(rng.integers(0, 11, (2, 8)))
    from minidist.nn import functional as F
    from minidist.optim import AdamW
    logits, loss = model(idx, idx)
    ce = F.cross_entropy(logits, idx).item()
    assert loss.item() == pytest.approx(ce + model.blocks[1].mlp.aux_loss.item())
    opt = AdamW(model.parameters(), lr=1e-2)
    first = loss.item()
    for _ in range(10):
        opt.zero_grad()
        _, loss = model(idx, idx)
        loss.backward()
        opt.step()
    assert loss.item() < first


def _grads(model, idx):
    model.zero_grad()
    _, loss = model(idx, idx)
    loss.backward()
    return loss.item(), {n: backend.to_host(p.grad) for n, p in model.named_parameters()}


@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 100), llama=st.booleans())
def test_activation_checkpointing_keeps_the_routers_balancing_gradient(seed, llama):
    """Under config.checkpoint a block runs in no_grad and again in backward: the
    router's balancing loss must leave the checkpoint with its graph (nn/moe.py
    run_block), or the router gets no gradient from it. Same loss, same gradients
    (to rounding: the recompute sums some gradients in another order)."""
    from minidist.nn import Llama, LlamaConfig
    rng = np.random.default_rng(seed)
    idx = backend.from_host(rng.integers(0, 13, (2, 8)))

    def model(checkpoint):
        if llama:
            cfg = LlamaConfig(vocab_size=13, hidden_size=16, intermediate_size=12,
                              num_hidden_layers=2, num_attention_heads=2, num_local_experts=4,
                              router_aux_loss_coef=0.5, dtype="float64", seed=seed,
                              checkpoint=checkpoint)
            return Llama(cfg)
        return GPT(GPTConfig(block_size=8, vocab_size=13, n_layer=2, n_head=2, n_embd=8,
                             moe_every=1, n_expert=4, moe_aux_coef=0.5, moe_z_coef=0.1,
                             dtype="float64", seed=seed, checkpoint=checkpoint))

    loss, plain = _grads(model(False), idx)
    loss_ckpt, ckpt = _grads(model(True), idx)
    assert loss_ckpt == loss
    for name in plain:
        np.testing.assert_allclose(ckpt[name], plain[name], rtol=1e-11, atol=1e-14,
                                   err_msg=name)
