"""PowerSGD: send a rank-r approximation of each gradient matrix (Vogels et al., 2019).

A gradient matrix M (n x m) summed over N ranks is approximated by one step of
power iteration, with Q (m x r) the same on every rank (same seed, or last
step's Q with ``warm_start``)::

    P  = all_reduce_sum(M_r Q)            (n x r)   r * n numbers sent
    P^ = orthonormal columns of P         (QR)
    Q  = all_reduce_sum(M_r^T P^) / N     (m x r)   r * m numbers sent
    M ~ P^ Q^T                            the average (1/N) sum_r M_r, projected on P^

so a rank sends r * (n + m) numbers per matrix where the plain all-reduce sends
n * m (Algorithm 1 of the paper). When r >= min(n, m) the projection keeps
everything and the result is the exact average (up to rounding). Vectors
(biases) and matrices that compression would not shrink by more than
``min_compression_rate`` are averaged exactly, uncompressed, in one all-reduce
per bucket: a matrix is compressed only where

    rate * r (n + m)  <  n * m        (strictly, as torch's ``_should_compress``)

so at the boundary (4 x 4 or 3 x 6 at r = 1, rate 2) the average is exact.

Error feedback (``use_error_feedback``, Algorithm 2): what compression lost on
this rank is added to its next gradient, so nothing is lost for good::

    input    = gradient + residual_old
    residual = input - approximation          so  approximation + residual = input

For the first ``start_powerSGD_iter`` steps the plain all-reduce runs (the
paper's and torch's advice: let the gradients settle first). The P all-reduce
runs in the background during backward; the Q half is started when DDP waits
for the bucket (after backward), because it needs P first.

Use: ``ddp.register_comm_hook(PowerSGDState(None, matrix_approximation_rank=2),
powerSGD_hook)``; torch's arguments and names.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import minidist.distributed as dist
from minidist.backend import Generator, xp
from minidist.comm.transport.reduce_op import ReduceOp
from minidist.parallel.data.hooks import Future, GradBucket, allreduce_hook


@dataclass
class PowerSGDState:
    """Settings and memory of PowerSGD, one per DDP model (torch's names)."""
    process_group: Any = None              # the group to average over (None: the world)
    matrix_approximation_rank: int = 1     # r: columns of P and Q
    start_powerSGD_iter: int = 1000        # plain all-reduce for the steps before this one
    min_compression_rate: float = 2.0      # compress a matrix only if rate * r(n+m) < n*m
    use_error_feedback: bool = True        # carry what compression lost into the next step
    warm_start: bool = True                # start each power iteration from last step's Q
    random_seed: int = 0                   # Q's first draw, the same on every rank
    iter: int = 0                          # steps seen (counted at each step's last bucket)
    error_dict: dict = field(default_factory=dict)      # bucket index -> residual (numel,)
    q_memory_dict: dict = field(default_factory=dict)   # bucket index -> [Q per matrix]
    sent_elements: dict = field(default_factory=dict)   # bucket index -> numbers all-reduced
    dense_elements: dict = field(default_factory=dict)  # bucket index -> numbers in the bucket

    def __post_init__(self) -> None:
        if self.matrix_approximation_rank < 1:
            raise ValueError("PowerSGDState: matrix_approximation_rank must be >= 1, got "
                             f"{self.matrix_approximation_rank}")
        self._rng = Generator(self.random_seed)

    def maybe_increase_iter(self, bucket: GradBucket) -> None:
        if bucket.is_last():
            self.iter += 1


def rank_for(shape: tuple, r: int) -> int:
    """The rank actually used for a matrix of ``shape`` (never above min(n, m))."""
    n, m = shape
    return min(n, m, r)


def compressed_elements(shape: tuple, r: int) -> int:
    """Numbers sent for one n x m matrix at rank r: r * (n + m)."""
    n, m = shape
    k = rank_for(shape, r)
    return k * (n + m)


def worth_compressing(shape: tuple, r: int, rate: float) -> bool:
    """Whether an n x m matrix is compressed at rank r: only if the plain
    all-reduce sends more than ``rate`` times what PowerSGD sends,
    rate * r(n + m) < n * m (torch's rule; at equality it is sent whole)."""
    n, m = shape
    return rate * compressed_elements(shape, r) < n * m


def _as_matrix(view: Any) -> Any:
    return view.reshape(view.shape[0], -1)      # (n, m): a view of the bucket


def _orthonormal(p: Any) -> Any:
    """Orthonormal columns spanning those of ``p`` (n x k, k <= n): Householder QR."""
    q, _ = xp.linalg.qr(p)
    return q


def powerSGD_hook(state: PowerSGDState, bucket: GradBucket) -> Future:
    """Average ``bucket`` with PowerSGD (see the module docstring)."""
    group = state.process_group
    if state.iter < state.start_powerSGD_iter:
        state.maybe_increase_iter(bucket)
        return allreduce_hook(group, bucket)
    n_ranks = dist.get_world_size(group)
    i, buf, r = bucket.index(), bucket.buffer(), state.matrix_approximation_rank
    if state.use_error_feedback:
        if i in state.error_dict:
            buf += state.error_dict[i]                   # input = gradient + residual
        before = buf.copy()
    matrices, dense = [], []
    for view in bucket.gradients():
        shape = _as_matrix(view).shape if view.ndim >= 2 else None
        worth = shape is not None and worth_compressing(shape, r, state.min_compression_rate)
        (matrices if worth else dense).append(view)
    state.dense_elements[i] = buf.size
    state.sent_elements[i] = (sum(compressed_elements(_as_matrix(v).shape, r) for v in matrices)
                              + sum(v.size for v in dense))

    # The uncompressed part: one plain all-reduce of the vectors, back to back.
    flat_dense = xp.concatenate([v.reshape(-1) for v in dense]) if dense else None
    dense_work = (dist.all_reduce(flat_dense, op=ReduceOp.AVG, group=group, async_op=True)
                  if dense else None)

    # P = M Q for every matrix, all in one flat buffer, summed over ranks.
    qs = state.q_memory_dict.get(i) if state.warm_start else None
    if qs is None:
        qs = [state._rng.normal((_as_matrix(v).shape[1], rank_for(_as_matrix(v).shape, r)),
                                dtype=buf.dtype) for v in matrices]
    ps = [_as_matrix(v) @ q for v, q in zip(matrices, qs)]          # each (n, k)
    p_flat = xp.concatenate([p.reshape(-1) for p in ps]) if ps else xp.zeros(0, buf.dtype)
    p_work = dist.all_reduce(p_flat, group=group, async_op=True)

    def second_half() -> Future:
        """P is summed: orthonormalise it, Q = M^T P^, sum Q over ranks."""
        p_hats, off = [], 0
        for p in ps:
            p_hats.append(_orthonormal(p_flat[off:off + p.size].reshape(p.shape)))
            off += p.size
        new_qs = [_as_matrix(v).T @ ph for v, ph in zip(matrices, p_hats)]   # each (m, k)
        q_flat = xp.concatenate([q.reshape(-1) for q in new_qs]) if new_qs \
            else xp.zeros(0, buf.dtype)
        q_work = dist.all_reduce(q_flat, group=group, async_op=True)
        return Future(q_work, lambda: decompress(p_hats, q_flat, new_qs))

    def decompress(p_hats: list, q_flat: Any, new_qs: list) -> Any:
        q_flat /= n_ranks                                            # sum -> average
        averaged_qs, off = [], 0
        for v, ph, q in zip(matrices, p_hats, new_qs):
            q_avg = q_flat[off:off + q.size].reshape(q.shape)        # (m, k)
            off += q.size
            v[...] = (ph @ q_avg.T).reshape(v.shape)                 # M ~ P^ Q^T
            averaged_qs.append(q_avg.copy())
        state.q_memory_dict[i] = averaged_qs
        if dense:
            if dense_work is not None:
                dense_work.wait()
            off = 0
            for v in dense:
                v[...] = flat_dense[off:off + v.size].reshape(v.shape)
                off += v.size
        if state.use_error_feedback:
            state.error_dict[i] = before - buf                       # residual = input - approx
        state.maybe_increase_iter(bucket)
        return buf

    future = Future(p_work, second_half)
    if dense_work is not None:
        future.works.append(dense_work)
    return future
