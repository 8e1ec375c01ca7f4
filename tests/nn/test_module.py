"""Module bookkeeping: registration, names, state dicts, modes, checkpointed blocks."""
import numpy as np
import pytest

import minidist
from minidist import backend
from minidist.nn import GPT, MLP, Dropout, GPTConfig, Linear, Module, ModuleList, Parameter


class TwoLayer(Module):
    def __init__(self):
        super().__init__()
        self.first = Linear(3, 4)
        self.rest = ModuleList([Linear(4, 4), Linear(4, 2, bias=False)])


def test_parameters_are_found_by_attribute_with_dotted_names():
    names = [n for n, _ in TwoLayer().named_parameters()]
    assert names == ["first.weight", "first.bias", "rest.0.weight", "rest.0.bias",
                     "rest.1.weight"]


def test_tied_parameter_is_listed_once():
    model = GPT(GPTConfig(n_layer=1, tie_weights=True))
    ids = [id(p) for p in model.parameters()]
    assert len(ids) == len(set(ids))
    assert "lm_head.weight" not in dict(model.named_parameters())
    untied = GPT(GPTConfig(n_layer=1, tie_weights=False))
    assert untied.num_parameters() == model.num_parameters() + 65 * 64


def test_state_dict_round_trip_copies_values():
    a, b = TwoLayer(), TwoLayer()
    b.load_state_dict(a.state_dict())
    for (na, pa), (nb, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert na == nb and pa is not pb
        np.testing.assert_array_equal(backend.to_host(pa.data), backend.to_host(pb.data))


def test_load_state_dict_names_what_is_wrong():
    model = TwoLayer()
    state = dict(model.state_dict())
    del state["first.bias"]
    with pytest.raises(KeyError, match="first.bias"):
        model.load_state_dict(state)
    state = dict(model.state_dict())
    state["first.weight"] = backend.xp.zeros((5, 5), dtype="float32")
    with pytest.raises(ValueError, match="first.weight"):
        model.load_state_dict(state)


def test_eval_turns_dropout_off_and_train_back_on():
    drop = Dropout(0.5, generator=backend.Generator(0))
    x = minidist.Tensor(backend.xp.ones((100,), dtype="float32"))
    drop.eval()
    np.testing.assert_array_equal(drop(x).numpy(), np.ones(100, np.float32))
    drop.train()
    out = drop(x).numpy()
    assert set(np.unique(out)) == {0.0, 2.0}


def test_zero_grad_clears_every_gradient():
    model = MLP(4)
    x = minidist.Tensor(backend.Generator(0).normal((2, 4)))
    model(x).sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    model.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_assigning_before_super_init_is_a_clear_error():
    class Broken(Module):
        def __init__(self):
            self.w = Parameter(backend.xp.zeros(2))

    with pytest.raises(RuntimeError, match="super"):
        Broken()


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_checkpointed_gpt_gives_bitwise_equal_gradients(dropout):
    cfg = dict(block_size=8, vocab_size=13, n_layer=3, n_head=2, n_embd=8, dropout=dropout)
    rng = np.random.default_rng(0)
    idx = backend.from_host(rng.integers(0, 13, (2, 8)))
    grads = []
    for ckpt in (False, True):
        model = GPT(GPTConfig(checkpoint=ckpt, **cfg))
        minidist.manual_seed(7)
        _, loss = model(idx, idx)
        loss.backward()
        grads.append({n: backend.to_host(p.grad) for n, p in model.named_parameters()})
    for name in grads[0]:
        np.testing.assert_array_equal(grads[0][name], grads[1][name], err_msg=name)
