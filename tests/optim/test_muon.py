"""Muon against a NumPy transcription of torch's ``_single_tensor_muon`` (float64 iteration),
against ``torch.optim.Muon`` itself (bf16 iteration), and its refusals."""
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist import backend, nn
from minidist.autograd import Tensor
from minidist.optim import Muon, muon_param_groups, newton_schulz
from optim_helpers import PROPERTY, seeds


def muon_reference(w, grads, *, lr, weight_decay, momentum, nesterov, coefficients, eps,
                   ns_steps, adjust_lr_fn):
    """torch.optim._muon._single_tensor_muon for one matrix, in NumPy float64 (the
    Newton-Schulz iteration without its cast to bf16)."""
    def lerp(start, end, weight):   # torch's lerp: from the nearer end
        return start + weight * (end - start) if abs(weight) < 0.5 \
            else end - (end - start) * (1 - weight)
    a, b, c = coefficients
    rows, cols = w.shape
    ratio = {None: math.sqrt(max(1, rows / cols)), "original": math.sqrt(max(1, rows / cols)),
             "match_rms_adamw": 0.2 * math.sqrt(max(rows, cols))}[adjust_lr_fn]
    buf = np.zeros_like(w)
    for g in grads:
        buf = lerp(buf, g, 1 - momentum)
        update = lerp(g, buf, momentum) if nesterov else buf
        x = update.T if rows > cols else update
        x = x / max(np.linalg.norm(x), eps)
        for _ in range(ns_steps):
            gram = x @ x.T
            x = a * x + (b * gram + c * gram @ gram) @ x
        ortho = x.T if rows > cols else x
        w = w * (1 - lr * weight_decay) - lr * ratio * ortho
    return w


def run_muon(w0, grads, **kwargs):
    p = Tensor(backend.from_host(w0.copy()), requires_grad=True)
    opt = Muon([p], **kwargs)
    for g in grads:
        p.grad = backend.from_host(g)
        opt.step()
    return backend.to_host(p.data)


@PROPERTY
@given(shape=st.sampled_from([(12, 5), (5, 12), (7, 7), (1, 9), (9, 1)]), seed=seeds,
       nesterov=st.booleans(), adjust_lr_fn=st.sampled_from([None, "original",
                                                              "match_rms_adamw"]),
       momentum=st.sampled_from([0.0, 0.3, 0.95]), weight_decay=st.sampled_from([0.0, 0.1]))
def test_muon_float64_three_steps_match_torch_transcription(shape, seed, nesterov, adjust_lr_fn,
                                                            momentum, weight_decay):
    rng = np.random.default_rng(seed)
    w0 = rng.normal(size=shape)
    grads = [rng.normal(size=shape) for _ in range(3)]
    hyper = dict(lr=0.02, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                 eps=1e-7, ns_steps=5, adjust_lr_fn=adjust_lr_fn)
    ours = run_muon(w0, grads, **hyper)
    reference = muon_reference(w0, grads, coefficients=(3.4445, -4.775, 2.0315), **hyper)
    np.testing.assert_allclose(ours, reference, rtol=0, atol=1e-12)
    assert np.abs(ours - w0).max() > 1e-3   # the step did move the weights


def test_newton_schulz_with_converging_coefficients_gives_u_v_transpose():
    # (1.875, -1.25, 0.375) converges: enough steps give the polar factor U V^T of the SVD
    rng = np.random.default_rng(0)
    g = rng.normal(size=(6, 4))
    u, _, vt = np.linalg.svd(g, full_matrices=False)
    ortho = backend.to_host(newton_schulz(backend.from_host(g), (1.875, -1.25, 0.375), 60))
    np.testing.assert_allclose(ortho, u @ vt, atol=1e-10)


@pytest.mark.parametrize("shape", [(16, 6), (6, 16), (10, 10), (64, 96)])
def test_muon_bf16_step_is_torch_muon_within_bf16_rounding(torch, shape):
    rng = np.random.default_rng(1)
    w0 = rng.normal(size=shape).astype(np.float32)
    g = rng.normal(size=shape).astype(np.float32)
    ref = torch.nn.Parameter(torch.tensor(w0))
    ref.grad = torch.tensor(g)
    torch.optim.Muon([ref], lr=0.02).step()
    ours = run_muon(w0, [g], lr=0.02, ns_dtype="bfloat16")
    step = np.abs(ref.detach().numpy() - w0 * (1 - 0.02 * 0.1))   # lr' |O|
    # one bf16 unit (2^-8 relative) of the largest entry of the update, twice over
    assert np.abs(ours - ref.detach().numpy()).max() <= 2 * 2.0 ** -8 * step.max()
    # and the float32 iteration is further away: the bf16 emulation is what matched
    f32 = run_muon(w0, [g], lr=0.02)
    assert np.abs(f32 - ref.detach().numpy()).max() > np.abs(ours - ref.detach().numpy()).max()


@pytest.mark.parametrize("shape", [(5,), (2, 3, 4)])
def test_muon_refuses_non_matrix_parameters_pointing_to_adamw(shape):
    p = Tensor(backend.from_host(np.zeros(shape)), requires_grad=True)
    with pytest.raises(ValueError, match="matrices only.*AdamW"):
        Muon([p])


@pytest.mark.parametrize("kwargs, message", [
    (dict(ns_steps=100), "ns_steps"),
    (dict(ns_coefficients=(3.4445, -4.775)), "ns_coefficients"),
    (dict(ns_coefficients=(1.0, 2.0, 3.0, 4.0)), "ns_coefficients"),
    (dict(lr=-1e-3), "learning rate"),
    (dict(momentum=-0.1), "momentum"),
    (dict(weight_decay=-0.1), "weight_decay"),
    (dict(adjust_lr_fn="spectral"), "adjust_lr_fn"),
    (dict(ns_dtype="bfloat17"), "bfloat17"),
])
def test_muon_bad_hyperparameters_raise_clear_errors(kwargs, message):
    p = Tensor(backend.from_host(np.zeros((3, 4))), requires_grad=True)
    with pytest.raises(ValueError, match=message):
        Muon([p], **kwargs)


def test_muon_bad_hyperparameters_in_a_later_group_raise_too():
    p = Tensor(backend.from_host(np.zeros((3, 4))), requires_grad=True)
    q = Tensor(backend.from_host(np.zeros((3, 4))), requires_grad=True)
    opt = Muon([p])
    with pytest.raises(ValueError, match="ns_steps"):
        opt.add_param_group({"params": [q], "ns_steps": 200})


def test_muon_param_groups_give_hidden_matrices_to_muon_and_the_rest_to_adamw():
    gpt = nn.GPT(nn.GPTConfig(n_layer=1, tie_weights=False))
    muon, adamw = muon_param_groups(gpt)
    names = {id(p): n for n, p in gpt.named_parameters()}
    assert sorted(names[id(p)] for p in muon) == [
        "blocks.0.attn.c_attn.weight", "blocks.0.attn.c_proj.weight",
        "blocks.0.mlp.c_fc.weight", "blocks.0.mlp.c_proj.weight"]
    assert {"wte.weight", "wpe.weight", "lm_head.weight", "ln_f.weight",
            "blocks.0.attn.c_attn.bias"} <= {names[id(p)] for p in adamw}
    assert len(muon) + len(adamw) == len(list(gpt.parameters()))
    llama = nn.Llama(nn.LlamaConfig(num_hidden_layers=1))
    muon, adamw = muon_param_groups(llama)
    names = {id(p): n for n, p in llama.named_parameters()}
    assert all("embed_tokens" not in names[id(p)] and "lm_head" not in names[id(p)]
               and p.ndim == 2 for p in muon)
    assert len(muon) == 7   # q, k, v, o, gate, up, down
    Muon(muon)              # accepted: every one is a matrix


@PROPERTY
@given(seed=seeds, stop=st.integers(0, 4), ns_dtype=st.sampled_from([None, "bfloat16"]))
def test_muon_resumed_from_a_checkpoint_mid_run_takes_the_uninterrupted_runs_steps(
        tmp_path_factory, seed, stop, ns_dtype):
    """The momentum buffers and each group's hyperparameters (a second group with its
    own lr, nesterov and adjust_lr_fn) go through save_checkpoint / load_checkpoint: the
    resumed run ends on the same bits as the run that never stopped."""
    from minidist.checkpoint import load_checkpoint, save_checkpoint
    rng = np.random.default_rng(seed)
    shapes = [(3, 5), (4, 2)]
    start = [rng.standard_normal(s) for s in shapes]
    grads = [[rng.standard_normal(s) for s in shapes] for _ in range(5)]

    def build(arrays):
        model = nn.Sequential(*[nn.Linear(s[1], s[0], bias=False, dtype="float64")
                                for s in shapes])
        for p, a in zip(model.parameters(), arrays):
            p.data[...] = backend.from_host(a)
        first, second = model.parameters()
        opt = Muon([{"params": [first]},
                    {"params": [second], "lr": 0.02, "nesterov": False,
                     "adjust_lr_fn": "match_rms_adamw"}], lr=0.01, ns_dtype=ns_dtype)
        return model, opt

    def train(model, opt, rounds):
        for round_ in rounds:
            for p, g in zip(model.parameters(), round_):
                p.grad = backend.from_host(g)
            opt.step()

    whole = build(start)
    train(*whole, grads)
    path = str(tmp_path_factory.mktemp("muon") / "ckpt")
    model, opt = build(start)
    train(model, opt, grads[:stop])
    save_checkpoint(path, model, opt)
    model, opt = build([np.zeros(s) for s in shapes])
    load_checkpoint(path, model, opt)
    train(model, opt, grads[stop:])
    for a, b in zip(model.parameters(), whole[0].parameters()):
        assert np.array_equal(backend.to_host(a.data), backend.to_host(b.data))
