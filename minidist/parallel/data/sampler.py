"""DistributedSampler: which samples each rank reads, with torch's semantics.

Each epoch, the indices 0..L-1 are shuffled with a generator seeded by
``seed + epoch`` (the same permutation on every rank, no communication), made a
multiple of N, and dealt out round-robin: rank r takes positions r, r+N, r+2N...

    drop_last=False:  num_samples = ceil(L / N); the permutation is padded by
                      repeating its start, so a few samples appear twice
    drop_last=True:   num_samples = floor(L / N); the tail is dropped

so that every rank gets the same number of samples (ranks that ran out early
would leave the others waiting in an all-reduce). Call ``set_epoch(e)`` at the
start of every epoch: without it each epoch repeats the same order.

Dealing round-robin has a property resuming relies on: the k-th batch of b
samples of every rank together are positions [k*N*b, (k+1)*N*b) of the
permutation, whatever N is, as long as the global batch N*b is the same. So a
run can stop mid-epoch at world size 4 and go on at world size 2 with the same
global batches: ``state_dict()`` records the position in the permutation.
"""
from __future__ import annotations

from typing import Any, Iterator

import minidist.distributed as dist
from minidist import backend


class DistributedSampler:
    """Indices for rank ``rank`` of ``num_replicas`` (default: this process's group)."""

    def __init__(self, dataset: Any, num_replicas: int | None = None, rank: int | None = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False):
        if num_replicas is None or rank is None:
            num_replicas = dist.get_world_size() if num_replicas is None else num_replicas
            rank = dist.get_rank() if rank is None else rank
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} outside [0, {num_replicas})")
        self.length = dataset if isinstance(dataset, int) else len(dataset)
        self.num_replicas, self.rank = num_replicas, rank
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.epoch = 0
        if drop_last and self.length % num_replicas != 0:
            self.num_samples = self.length // num_replicas
        else:
            self.num_samples = -(-self.length // num_replicas)      # ceil(L / N)
        self.total_size = self.num_samples * num_replicas
        self._start = 0           # samples of this rank to skip (resuming mid-epoch)
        self._yielded = 0         # samples of this rank handed out this epoch

    def set_epoch(self, epoch: int) -> None:
        """A new order for a new epoch (seeded by seed + epoch)."""
        if epoch != self.epoch:
            self._start = 0
        self.epoch = epoch

    def permutation(self) -> list[int]:
        """The whole epoch's order, padded or cut to ``total_size`` (same on every rank)."""
        if self.shuffle:
            gen = backend.Generator(self.seed + self.epoch)
            order = [int(i) for i in backend.to_host(gen.permutation(self.length))]
        else:
            order = list(range(self.length))
        if self.total_size > len(order):                 # pad by repeating the start
            repeats = -(-self.total_size // max(len(order), 1))
            order = (order * repeats)[:self.total_size]
        return order[:self.total_size]

    def __iter__(self) -> Iterator[int]:
        mine = self.permutation()[self.rank:self.total_size:self.num_replicas]
        start, self._start = self._start, 0
        self._yielded = start
        for i in mine[start:]:
            self._yielded += 1
            yield i

    def __len__(self) -> int:
        return self.num_samples

    # -- resuming ----------------------------------------------------------------
    def state_dict(self) -> dict:
        """Epoch, seed and the global position reached in this epoch's permutation."""
        return dict(epoch=self.epoch, seed=self.seed,
                    position=self._yielded * self.num_replicas)

    def load_state_dict(self, state: dict) -> None:
        """Resume: the next ``__iter__`` starts at the saved global position, which must
        fall on a multiple of this sampler's world size."""
        position = int(state["position"])
        if position % self.num_replicas:
            raise ValueError(f"saved position {position} is not a multiple of the world "
                             f"size {self.num_replicas}: resume with a global batch that "
                             "divides evenly")
        self.epoch, self.seed = int(state["epoch"]), int(state["seed"])
        self._start = position // self.num_replicas
        self._yielded = self._start
