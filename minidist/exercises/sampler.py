"""26.2 the sampler that forgets set_epoch, and how to see it.

A debug exercise: the starter builds one DistributedSampler per rank and
iterates it every epoch, but never calls ``set_epoch``, so every epoch sees
the same order and each rank the same shard (chapter 26 quiz, question 2).
"""
from __future__ import annotations

from hypothesis import strategies as st

from minidist.exercises.core import Exercise, Property

setups = dict(length=st.integers(4, 40), world=st.integers(1, 4), seed=st.integers(0, 100))


def _orders(subject, length, world, seed, epochs=3):
    per_rank = [subject.epoch_orders(length, world, r, epochs, seed) for r in range(world)]
    for r, orders in enumerate(per_rank):
        assert len(orders) == epochs, f"rank {r}: {len(orders)} epochs returned, expected {epochs}"
    return per_rank


def _shards_partition(subject, length, world, seed):
    per_rank = _orders(subject, length, world, seed)
    for e in range(3):
        shards = [list(per_rank[r][e]) for r in range(world)]
        sizes = {len(s) for s in shards}
        assert len(sizes) == 1, f"epoch {e}: ranks got {[len(s) for s in shards]} samples; all must get as many"
        seen = sorted(set(i for s in shards for i in s))
        assert seen == list(range(length)), \
            f"length={length}, world={world}, epoch {e}: the ranks' shards {shards} miss samples"
        assert sum(map(len, shards)) < length + world, f"epoch {e}: shards overlap beyond the padding: {shards}"


def _new_order_each_epoch(subject, length, world, seed):
    per_rank = _orders(subject, length, world, seed)
    for r in range(world):
        e0, e1, e2 = (list(o) for o in per_rank[r])
        assert not (e0 == e1 == e2), \
            f"length={length}, world={world}, seed={seed}: rank {r} sees {e0} in every epoch"


def _deterministic(subject, length, world, seed):
    a = _orders(subject, length, world, seed)
    b = _orders(subject, length, world, seed)
    assert [[list(o) for o in r] for r in a] == [[list(o) for o in r] for r in b], \
        "two runs with the same seed gave different orders: resuming could not reproduce them"


SAMPLER = Exercise(
    id="26.2", title="set_epoch: the sampler that repeats every epoch", kind="debug",
    filename="ex_26_2_set_epoch.py",
    docs="docs/ddp.md (the sampler)",
    starter='''"""Exercise 26.2 (set_epoch): find the bug.

Each of `world` ranks reads its shard of a dataset of `length` samples with a
DistributedSampler, every epoch. The sampler shuffles with seed + epoch, so
every epoch should see a new order, the ranks' shards should partition the
data (padded to equal sizes), and the same seed should give the same run.

This loop trains on the same order every epoch. Fix it; check with
`minidist exercise check 26.2`.

Interface: minidist.parallel.data.DistributedSampler(length, num_replicas,
rank, shuffle=True, seed=seed); iterate it for the indices of one epoch.
"""
from minidist.parallel.data import DistributedSampler


def epoch_orders(length, world, rank, epochs, seed):
    """The indices rank `rank` trains on, one list per epoch."""
    sampler = DistributedSampler(length, num_replicas=world, rank=rank, shuffle=True, seed=seed)
    orders = []
    for epoch in range(epochs):
        orders.append(list(sampler))
    return orders
''',
    properties=[
        Property("every epoch, the ranks' shards cover the dataset, as many samples each",
                 _shards_partition, setups, examples=15,
                 hint="every rank must shuffle with the same seed: the shards are slices of one order"),
        Property("every epoch sees a new order", _new_order_each_epoch, setups, examples=15,
                 hint="chapter 26 quiz, question 2; docs/ddp.md: what tells the sampler the epoch?"),
        Property("the same seed gives the same orders", _deterministic, setups, examples=10,
                 hint="seed the shuffle from seed and epoch only, not from the clock or the rank"),
    ],
    solution='''from minidist.parallel.data import DistributedSampler


def epoch_orders(length, world, rank, epochs, seed):
    sampler = DistributedSampler(length, num_replicas=world, rank=rank, shuffle=True, seed=seed)
    orders = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        orders.append(list(sampler))
    return orders
''',
    wrong={
        "the planted bug": "",
        "seeded by rank": '''from minidist.parallel.data import DistributedSampler


def epoch_orders(length, world, rank, epochs, seed):
    sampler = DistributedSampler(length, num_replicas=world, rank=rank, shuffle=True,
                                 seed=seed + rank)
    orders = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        orders.append(list(sampler))
    return orders
''',
    })

EXERCISES = [SAMPLER]
