"""DistributedSampler: each epoch covers the data set exactly once across ranks,
reshuffles after set_epoch, repeats without it, and pads / drops as torch does."""
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.parallel import DistributedSampler


def all_ranks(length, n, epoch=None, **kw):
    samplers = [DistributedSampler(length, num_replicas=n, rank=r, **kw) for r in range(n)]
    if epoch is not None:
        for s in samplers:
            s.set_epoch(epoch)
    return samplers, [list(s) for s in samplers]


@settings(max_examples=60, deadline=None)
@given(length=st.integers(0, 60), n=st.integers(1, 4), seed=st.integers(0, 100),
       shuffle=st.booleans())
def test_every_index_seen_exactly_once_per_epoch(length, n, seed, shuffle):
    samplers, parts = all_ranks(length, n, seed=seed, shuffle=shuffle)
    assert len({len(p) for p in parts}) == 1 and len(parts[0]) == len(samplers[0])
    seen = sorted(i for p in parts for i in p)
    padding = len(seen) - length                     # torch: repeat the first few indices
    assert 0 <= padding < n
    assert sorted(set(seen)) == list(range(length))
    if padding == 0:
        assert seen == list(range(length))


@settings(max_examples=30, deadline=None)
@given(length=st.integers(1, 60), n=st.integers(1, 4))
def test_drop_last_gives_floor_and_no_repeats(length, n):
    _, parts = all_ranks(length, n, drop_last=True)
    seen = [i for p in parts for i in p]
    assert len(seen) == (length // n) * n and len(set(seen)) == len(seen)


def test_set_epoch_changes_the_order_and_without_it_the_order_repeats():
    s = DistributedSampler(50, num_replicas=2, rank=1, seed=7)
    first, again = list(s), list(s)
    assert first == again                            # no set_epoch: the same order
    s.set_epoch(1)
    assert list(s) != first
    s.set_epoch(0)
    assert list(s) == first                          # the epoch alone decides the order
    other_seed = DistributedSampler(50, num_replicas=2, rank=1, seed=8)
    assert list(other_seed) != first


def test_no_shuffle_is_round_robin():
    _, parts = all_ranks(10, 3, shuffle=False)
    assert parts == [[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]]


@given(n_old=st.sampled_from([1, 2, 3, 4, 6]), n_new=st.sampled_from([1, 2, 3, 4, 6]),
       steps=st.integers(0, 4))
@settings(max_examples=30, deadline=None)
def test_resume_mid_epoch_at_another_world_size_gives_the_same_global_batches(n_old, n_new,
                                                                              steps):
    """Global batch 12: the k-th batch of all ranks together is the same set of samples."""
    length, global_batch = 60, 12

    def batches(samplers, count):
        its = [iter(s) for s in samplers]
        per_rank = global_batch // len(samplers)
        return [sorted(i for it in its for i in [next(it) for _ in range(per_rank)])
                for _ in range(count)]

    straight = batches([DistributedSampler(length, n_old, r, seed=3) for r in range(n_old)], 5)
    old = [DistributedSampler(length, n_old, r, seed=3) for r in range(n_old)]
    head = batches(old, steps)
    state = old[0].state_dict()
    assert state["position"] == steps * global_batch
    new = [DistributedSampler(length, n_new, r, seed=0) for r in range(n_new)]
    for s in new:
        s.load_state_dict(state)
    assert head + batches(new, 5 - steps) == straight
