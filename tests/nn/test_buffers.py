"""Buffers: state that is not a parameter, saved and loaded as torch's (module.py)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist import backend
from minidist.backend import xp
from minidist.nn import Linear, Module
from minidist.nn.moe import MoE


class Counted(Module):
    """A parameter, a persistent buffer, a non-persistent one, a child with a buffer."""

    def __init__(self, n: int = 3):
        super().__init__()
        self.lin = Linear(2, n)
        self.register_buffer("running", xp.zeros((n,), dtype="float32"))
        self.register_buffer("scratch", xp.ones((n,), dtype="float32"), persistent=False)
        self.inner = Module()
        self.inner.register_buffer("count", xp.zeros((1,), dtype="float32"))


def test_state_dict_holds_persistent_buffers_in_torchs_order():
    torch = pytest.importorskip("torch")

    class TorchCounted(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(2, 3)
            self.register_buffer("running", torch.zeros(3))
            self.register_buffer("scratch", torch.ones(3), persistent=False)
            self.inner = torch.nn.Module()
            self.inner.register_buffer("count", torch.zeros(1))

    ours, theirs = Counted(), TorchCounted()
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert [n for n, _ in ours.named_buffers()] == [n for n, _ in theirs.named_buffers()]


@settings(max_examples=10, deadline=None)
@given(values=st.lists(st.floats(-1e3, 1e3, width=32), min_size=4, max_size=4))
def test_buffers_round_trip_through_state_dict(values):
    a, b = Counted(), Counted()
    a.running = backend.from_host(np.array(values[:3], dtype=np.float32))
    a.inner.count[...] = backend.from_host(np.array(values[3:], dtype=np.float32))
    b_running = b.running
    b.load_state_dict(a.state_dict())
    assert b.running is b_running                       # copied in place, as parameters
    np.testing.assert_array_equal(backend.to_host(b.running), np.float32(values[:3]))
    np.testing.assert_array_equal(backend.to_host(b.inner.count), np.float32(values[3:]))


def test_assigning_an_array_replaces_the_buffer():
    m = Counted()
    m.running = xp.full((3,), 2.0, dtype="float32")
    assert dict(m.named_buffers())["running"] is m.running
    assert m.state_dict()["running"] is m.running
    with pytest.raises(TypeError, match="running"):
        m.running = [1.0, 2.0, 3.0]


def test_strict_load_names_a_missing_buffer():
    state = dict(Counted().state_dict())
    del state["inner.count"]
    with pytest.raises(KeyError, match=r"missing \['inner.count'\]"):
        Counted().load_state_dict(state)
    Counted().load_state_dict(state, strict=False)     # kept at its init


def test_load_names_a_buffer_of_the_wrong_shape():
    with pytest.raises(ValueError, match="running: shape"):
        Counted(3).load_state_dict({**Counted(3).state_dict(),
                                    "running": xp.zeros((4,), dtype="float32")})


def test_non_persistent_buffer_is_not_saved():
    m = Counted()
    assert "scratch" in dict(m.named_buffers())
    assert "scratch" not in m.state_dict()
    with pytest.raises(KeyError, match=r"unexpected \['scratch'\]"):   # torch's strict load
        m.load_state_dict({**m.state_dict(), "scratch": xp.ones((3,), dtype="float32")})


def test_moe_selection_bias_is_a_persistent_buffer():
    a, b = MoE(8, 4, bias_rate=0.1), MoE(8, 4, bias_rate=0.1)
    a.expert_bias = xp.arange(4, dtype="float32")           # as update_bias replaces it
    assert list(a.state_dict())[0] == "expert_bias"        # its own, before its children's
    b.load_state_dict(a.state_dict())
    np.testing.assert_array_equal(backend.to_host(b.expert_bias), np.arange(4))
