"""Ring attention equals single-process attention, forward and backward.

Each world (sizes 1..4) stays up for the module while hypothesis sends it cases:
shapes, causal or not, zigzag or contiguous layout, tile sizes, and sliding windows,
packed documents and grouped-query heads. Every rank takes its shard of the same
q, k, v, dO, runs ring attention forward and backward, and returns its shard of O,
dQ, dK, dV; the parent reassembles them and compares with naive attention in one
process with the same mask: float64, within 1e-10 (1e-12 with masks).
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


def ring_on_rank(arrays, causal, layout, blocks, masks=None):
    """Runs on every rank: its shard through ring attention, forward and backward.
    ``masks``: window, document_ids (host, of the whole sequence), enable_gqa."""
    rank, size = dist.get_rank(), dist.get_world_size()
    q, k, v, do = (shard_sequence(backend.from_host(a), rank, size, layout) for a in arrays)
    qt, kt, vt = (Tensor(a, requires_grad=True) for a in (q, k, v))
    out = ring_attention(qt, kt, vt, is_causal=causal, layout=layout, **blocks,
                         **_on_device(masks))
    out.backward(do)
    return [backend.to_host(a) for a in (out.data, qt.grad, kt.grad, vt.grad)]


def _on_device(masks):
    masks = dict(masks or {})
    if masks.get("document_ids") is not None:
        masks["document_ids"] = backend.from_host(masks["document_ids"])
    return masks


def single_process(arrays, causal, masks=None):
    q, k, v = (Tensor(backend.from_host(a), requires_grad=True) for a in arrays[:3])
    out = naive_attention(q, k, v, is_causal=causal, **_on_device(masks))
    out.backward(backend.from_host(arrays[3]))
    return [backend.to_host(a) for a in (out.data, q.grad, k.grad, v.grad)]


def ring_beside_a_users_messages(arrays, tags):
    """Every rank sends its right neighbour a message on each user tag, runs ring
    attention, then receives its left neighbour's: (ring results, messages received)."""
    rank, size = dist.get_rank(), dist.get_world_size()
    sends = [dist.isend(backend.from_host(np.full(arrays[0].shape[-1], 1000.0 * rank + t)),
                        (rank + 1) % size, tag=t) for t in tags]
    results = ring_on_rank(arrays, True, "zigzag", {})
    got = []
    for t in tags:
        buf = backend.from_host(np.zeros(arrays[0].shape[-1]))
        dist.recv(buf, (rank - 1) % size, tag=t)
        got.append(float(backend.to_host(buf)[0]))
    for h in sends:
        h.wait()
    return results, got


def test_a_users_messages_on_any_tag_do_not_meet_the_rings(world):
    """The ring takes its tags from the group's collective sequence, outside the users'
    range: a user's pending message on any tag (701 and 702 were once the ring's own) is
    neither taken by the ring nor lost."""
    n = world.world_size
    if n == 1:
        pytest.skip("a ring needs two ranks")
    rng = np.random.default_rng(7)
    arrays = [rng.standard_normal((2, 2 * n * 2, 3)) for _ in range(4)]
    tags = [0, 701, 702]
    expected = single_process(arrays, True)
    for rank, (results, got) in enumerate(world.run(ring_beside_a_users_messages, arrays, tags)):
        assert got == [1000.0 * ((rank - 1) % n) + t for t in tags]
        for ours, ref, part in zip(results, expected, ("out", "dq", "dk", "dv")):
            full = backend.to_host(shard_sequence(backend.from_host(ref), rank, n, "zigzag"))
            np.testing.assert_allclose(ours, full, rtol=1e-10, atol=1e-12, err_msg=part)


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


def _documents(draw, length):
    """Ids of packed documents in a row of ``length``: sorted cuts, one-token documents
    and documents longer than a rank's shard among the draws."""
    cuts = draw(st.lists(st.integers(1, length - 1), max_size=4, unique=True))
    return np.searchsorted(np.array(sorted(cuts), dtype=np.int64), np.arange(length),
                           side="right").astype(np.int64)


@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_ring_attention_with_windows_documents_and_gqa_matches_one_process(world, data):
    n = world.world_size
    batch, kv_heads = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2))
    heads = kv_heads * data.draw(st.sampled_from([1, 2, 3]))        # the GQA ratio
    chunk = data.draw(st.integers(1, 3))
    length = 2 * n * chunk
    window = data.draw(st.one_of(st.none(), st.sampled_from([1, length, length + 5]),
                                 st.integers(1, length)))
    docs = None
    if data.draw(st.booleans()):
        rows = [_documents(data.draw, length) for _ in range(batch)]
        docs = np.stack(rows) if data.draw(st.booleans()) else rows[0]
    layout = data.draw(st.sampled_from(["zigzag", "contiguous"]))
    blocks = data.draw(st.sampled_from([{}, dict(block_q=2, block_k=1)]))
    e = data.draw(st.integers(1, 4))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**20)))
    shapes = [(batch, h, length, e) for h in (heads, kv_heads, kv_heads, heads)]
    arrays = [rng.standard_normal(shape) for shape in shapes]
    masks = dict(window=window, document_ids=docs, enable_gqa=True)

    shards = world.run(ring_on_rank, arrays, True, layout, blocks, masks)
    want = single_process(arrays, True, masks)
    for i, name in enumerate(("out", "dq", "dk", "dv")):
        got = backend.to_host(unshard_sequence([backend.from_host(s[i]) for s in shards],
                                               layout))
        assert np.abs(got - want[i]).max() <= 1e-12, (name, n, layout, window, docs)


@pytest.mark.parametrize("window", [None, 1, 3])
def test_one_token_documents_and_a_document_over_every_shard(world, window):
    """Chunks of 2 tokens: a one-token document, another, then one document to the end,
    which spans the chunks of every rank (zigzag: the first and the last chunks too)."""
    n = world.world_size
    length = 4 * n
    docs = np.array([0, 1] + [2] * (length - 2), dtype=np.int64)
    rng = np.random.default_rng(n)
    arrays = [rng.standard_normal((2, length, 3)) for _ in range(4)]
    masks = dict(window=window, document_ids=docs)
    shards = world.run(ring_on_rank, arrays, True, "zigzag", {}, masks)
    want = single_process(arrays, True, masks)
    for i in range(4):
        got = backend.to_host(unshard_sequence([backend.from_host(s[i]) for s in shards]))
        assert np.abs(got - want[i]).max() <= 1e-12


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_zigzag_gives_every_rank_the_same_causal_work(n):
    c = 8
    zigzag = [plan_work(r, n, c, layout="zigzag") for r in range(n)]
    contiguous = [plan_work(r, n, c, layout="contiguous") for r in range(n)]
    assert len(set(zigzag)) == 1
    # rank r of the contiguous split: its own block's triangle and r whole blocks
    assert contiguous == [c * (c + 1) // 2 + r * c * c for r in range(n)]
    length = n * c                                         # the same total, spread evenly
    assert sum(zigzag) == sum(contiguous) == length * (length + 1) // 2


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("window", [1, 3, 4, 5, 9, 100])
@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
def test_a_window_skips_blocks_and_keeps_every_visible_pair(n, window, layout):
    c = 8
    length = n * c
    work = [plan_work(r, n, c, layout=layout, window=window) for r in range(n)]
    # row i sees keys max(0, i - window + 1) .. i: nothing visible is skipped
    assert sum(work) == sum(min(i + 1, window) for i in range(length))
    if window == 1:                                        # each query sees itself alone
        assert work == [c] * n


def ring_messages_on_rank(arrays, layout, window):
    """Ring attention forward + backward on this rank, counting the K/V messages and
    the dK/dV messages it sends: (outputs and gradients, kv sends, dkv sends)."""
    import importlib
    module = importlib.import_module("minidist.parallel.context.ring_attention")
    calls, sent = [], {}                  # each ring's tags: (K/V,) forward, (K/V, dK/dV)
    plain_ring, plain_send = module._ring, module.post_send

    def recording(group, n_tags):
        ring = plain_ring(group, n_tags)
        calls.append(ring[4])
        return ring

    def counting(tensor, dst, g, tag):
        sent[tag] = sent.get(tag, 0) + 1
        return plain_send(tensor, dst, g, tag)
    module._ring, module.post_send = recording, counting
    try:
        results = ring_on_rank(arrays, True, layout, {}, dict(window=window))
    finally:
        module._ring, module.post_send = plain_ring, plain_send
    assert set(sent) <= {t for tags in calls for t in tags}           # the rings' tags only
    kv = sum(sent.get(tags[0], 0) for tags in calls)
    dkv = sum(sent.get(tags[1], 0) for tags in calls if len(tags) == 2)
    return results, kv, dkv


@pytest.mark.parametrize("window", [1, 3, 4, 5, 9])
def test_a_window_shortens_the_ring_under_the_contiguous_layout(world, window):
    """Under the contiguous layout a window of w keys needs the blocks of the
    1 + ceil((w-1)/c) ranks up to its own: K/V travel that many hops less one (twice:
    forward and backward), each dK/dV accumulator as many and one home; zigzag runs
    the whole ring unless the window is one key. Both still equal one process."""
    n, c = world.world_size, 4
    rng = np.random.default_rng(window)
    arrays = [rng.standard_normal((2, n * c, 3)) for _ in range(4)]
    want = single_process(arrays, True, dict(window=window))
    for layout in ("contiguous", "zigzag"):
        if layout == "contiguous":
            steps = min(n, 1 + -(-(window - 1) // c))
        else:       # a rank's late chunk needs the next rank's: the last hop of the ring
            steps = n if window > 1 else 1
        for rank, (got, kv, dkv) in enumerate(world.run(ring_messages_on_rank, arrays,
                                                        layout, window)):
            assert (kv, dkv) == (2 * (steps - 1), steps if steps > 1 else 0), (layout, rank)
            for name, a, b in zip("o q k v".split(), got, want):
                mine = shard_sequence(backend.from_host(b), rank, n, layout)
                assert np.abs(a - backend.to_host(mine)).max() <= 1e-12, (layout, name)


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
    with pytest.raises(ValueError, match="needs is_causal"):
        ring_attention(q, q, q, window=2)


def _refusals(ids):
    """Every rank: the error ring attention raises for these document_ids (or None)."""
    q = Tensor(backend.from_host(np.zeros((4, 2))))
    try:
        ring_attention(q, q, q, is_causal=True, document_ids=backend.from_host(ids))
    except (TypeError, ValueError) as error:
        return f"{type(error).__name__}: {error}"
    return None


def test_document_ids_not_of_the_whole_sequence_are_refused(world):
    short = world.run(_refusals, np.zeros(4, dtype=np.int64))      # one shard's worth
    floats = world.run(_refusals, np.zeros(4 * world.world_size))
    if world.world_size > 1:
        assert all("whole sequence" in message for message in short)
    assert all(message.startswith("TypeError") and "integer" in message for message in floats)


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
