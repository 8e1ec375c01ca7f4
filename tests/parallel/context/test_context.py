"""Ring attention equals single-process attention, forward and backward.

Each world (sizes 1..4) stays up for the module while hypothesis sends it cases:
shapes, causal or not, zigzag or contiguous layout, tile sizes. Every rank takes
its shard of the same q, k, v, dO, runs ring attention forward and backward, and
returns its shard of O, dQ, dK, dV; the parent reassembles them and compares
with naive attention in one process: float64, within 1e-10.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minidist.distributed as dist
from minidist import backend
from minidist.attention import naive_attention
from minidist.autograd import Tensor
from minidist.comm import World
from minidist.parallel import plan_work, ring_attention, shard_sequence, unshard_sequence


@pytest.fixture(scope="module", params=[1, 2, 3, 4], ids=lambda n: f"world{n}")
def world(request):
    w = World(request.param, timeout=20.0, run_timeout=90.0)
    yield w
    w.close()


def ring_on_rank(arrays, causal, layout, blocks):
    """Runs on every rank: its shard through ring attention, forward and backward."""
    rank, size = dist.get_rank(), dist.get_world_size()
    q, k, v, do = (shard_sequence(backend.from_host(a), rank, size, layout) for a in arrays)
    qt, kt, vt = (Tensor(a, requires_grad=True) for a in (q, k, v))
    out = ring_attention(qt, kt, vt, is_causal=causal, layout=layout, **blocks)
    out.backward(do)
    return [backend.to_host(a) for a in (out.data, qt.grad, kt.grad, vt.grad)]


def single_process(arrays, causal):
    q, k, v = (Tensor(backend.from_host(a), requires_grad=True) for a in arrays[:3])
    out = naive_attention(q, k, v, is_causal=causal)
    out.backward(backend.from_host(arrays[3]))
    return [backend.to_host(a) for a in (out.data, q.grad, k.grad, v.grad)]


@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_ring_attention_matches_single_process(world, data):
    n = world.world_size
    lead = tuple(data.draw(st.lists(st.integers(1, 3), min_size=0, max_size=2)))
    chunk = data.draw(st.integers(1, 6))                   # sequence = 2N chunks of this
    e, ev = data.draw(st.integers(1, 8)), data.draw(st.integers(1, 8))
    causal = data.draw(st.booleans())
    layout = data.draw(st.sampled_from(["zigzag", "contiguous"]))
    blocks = data.draw(st.sampled_from([{}, dict(block_q=3, block_k=2)]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**20)))
    length = 2 * n * chunk
    arrays = [rng.standard_normal(lead + (length, d)) for d in (e, e, ev, ev)]

    shards = world.run(ring_on_rank, arrays, causal, layout, blocks)
    want = single_process(arrays, causal)
    for i, name in enumerate(("out", "dq", "dk", "dv")):
        got = backend.to_host(unshard_sequence([backend.from_host(s[i]) for s in shards],
                                               layout))
        assert np.abs(got - want[i]).max() <= 1e-10, f"{name}, world {n}, causal={causal}"


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_zigzag_gives_every_rank_the_same_causal_work(n):
    zigzag = [plan_work(r, n, c=8, layout="zigzag") for r in range(n)]
    contiguous = [plan_work(r, n, c=8, layout="contiguous") for r in range(n)]
    assert len(set(zigzag)) == 1
    assert contiguous == sorted(contiguous) and contiguous[-1] == n * contiguous[0]
    assert sum(zigzag) == sum(contiguous)                  # the same total, spread evenly


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
def test_unshard_inverts_shard(layout):
    x = backend.from_host(np.arange(2 * 3 * 24.0).reshape(2, 24, 3))
    parts = [shard_sequence(x, r, 3, layout) for r in range(3)]
    assert np.array_equal(backend.to_host(unshard_sequence(parts, layout)), backend.to_host(x))
    if layout == "zigzag":   # rank 0 holds the first and the last chunk
        assert backend.to_host(parts[0])[0, :, 0].tolist() == [0, 3, 6, 9, 60, 63, 66, 69]


def test_bad_layouts_and_lengths_are_refused():
    x = backend.from_host(np.zeros((10, 2)))
    with pytest.raises(ValueError, match="divisible"):
        shard_sequence(x, 0, 3)
    with pytest.raises(ValueError, match="layout"):
        shard_sequence(x, 0, 1, layout="striped")
    q = Tensor(backend.from_host(np.zeros((3, 2))))
    with pytest.raises(ValueError, match="odd"):
        ring_attention(q, q, q, is_causal=True)
    with pytest.raises(ValueError, match="layout"):
        ring_attention(q, q, q, layout="striped")


def ring_on_subgroup(arrays, members):
    """Every rank makes the group; its members run ring attention over it alone."""
    group = dist.new_group(members)
    if dist.get_rank() not in members:
        return None
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    q, k, v, do = (shard_sequence(backend.from_host(a), rank, size) for a in arrays)
    qt, kt, vt = (Tensor(a, requires_grad=True) for a in (q, k, v))
    out = ring_attention(qt, kt, vt, is_causal=True, group=group)
    out.backward(do)
    return [backend.to_host(a) for a in (out.data, qt.grad, kt.grad, vt.grad)]


def test_ring_attention_runs_on_a_subgroup(world):
    if world.world_size < 3:
        pytest.skip("needs a rank outside the group")
    members = [0, world.world_size - 1]
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal((2, 16, 4)) for _ in range(4)]
    results = world.run(ring_on_subgroup, arrays, members)
    want = single_process(arrays, causal=True)
    shards = [results[r] for r in members]
    for i in range(4):
        got = backend.to_host(unshard_sequence([backend.from_host(s[i]) for s in shards]))
        assert np.abs(got - want[i]).max() <= 1e-10
