"""calc/moe.py: parameter counts equal minidist's MoE GPT, and the Ulysses bytes equal
what the collectives count on a real world."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.calc import moe


@settings(max_examples=10, deadline=None)
@given(layers=st.integers(1, 3), every=st.integers(1, 3), E=st.integers(1, 5),
       k=st.integers(1, 5), bias=st.booleans(), tied=st.booleans())
def test_total_params_equal_the_moe_gpt(layers, every, E, k, bias, tied):
    from minidist.nn import GPT, GPTConfig
    k = min(k, E)
    cfg = GPTConfig(block_size=16, vocab_size=11, n_layer=layers, n_head=2, n_embd=8,
                    moe_every=every, n_expert=E, moe_top_k=k, bias=bias, tie_weights=tied)
    p = moe.moe_gpt_params(layers, 8, 11, E, k, every, seq=16, bias=bias, tied=tied)
    assert p.total == GPT(cfg).num_parameters()
    assert p.total - p.active == p.moe_layers * (E - k) * moe.ffn_params(8, bias)


def test_gpt2_small_with_8_experts_top_2():
    p = moe.moe_gpt_params(12, 768, 50257, 8, 2, seq=1024)
    assert (p.total, p.active) == (521_197_824, 181_182_720)


def test_all_to_all_bytes_worked_number():
    b = moe.moe_all_to_all_bytes(4096, 4096, 2, 8)
    assert b.dispatch == 56 * 2**20 and b.forward_backward == 4 * b.dispatch
    assert moe.moe_all_to_all_bytes(4096, 4096, 2, 1).dispatch == 0


def test_ring_over_ulysses_is_n_over_2():
    for n in (2, 4, 8, 16):
        b = moe.sequence_parallel_bytes(1024 * n, 64, n)
        assert b.ring_forward / b.ulysses_forward == pytest.approx(n / 2)
    assert not moe.sequence_parallel_bytes(64, 8, 8, heads=12).ulysses_possible


def _attention_bytes(method, n, s, h, heads):
    """(forward, forward + backward) bytes this rank sent in one attention layer."""
    import minidist.distributed as dist
    from minidist.autograd import Tensor
    from minidist.backend import xp
    from minidist.parallel import ring_attention, ulysses_attention
    x = Tensor(xp.ones((1, heads, s // n, h // heads)), requires_grad=True)
    dist.get_stats().reset()
    if method == "ulysses":
        out = ulysses_attention(x, x, x)
    else:
        out = ring_attention(x, x, x, layout="contiguous")
    forward = dist.get_stats().bytes_sent
    out.backward(xp.ones(out.shape))
    return forward, dist.get_stats().bytes_sent


@pytest.mark.parametrize("method, n", [("ulysses", 2), ("ulysses", 4), ("ring", 2), ("ring", 3)])
def test_attention_bytes_equal_what_the_collectives_count(method, n):
    from minidist.comm import World
    s, h, heads = 12 * n, 8, 4 if method == "ring" or n != 3 else 3
    with World(n, timeout=20.0, run_timeout=60.0) as w:
        sent = w.run(_attention_bytes, method, n, s, h, heads)
    want = moe.sequence_parallel_bytes(s, h, n, bytes_per_element=8)
    if method == "ulysses":
        assert sent == [(want.ulysses_forward, want.ulysses_step)] * n
    else:
        assert sent == [(want.ring_forward, want.ring_step)] * n
