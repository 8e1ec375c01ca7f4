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
powerSGD_hook)``; torch's arguments and names. The residuals, the warm-start Q's,
``iter`` and the generator of Q's draws are memory a resumed run needs: pickle the
state as torch's (the process group left out), or save ``state.state_dict()`` and
``load_state_dict`` it (plain arrays and scalars; hook_state.py), one per rank.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import minidist.distributed as dist
from minidist.backend import Generator, xp
from minidist.comm.transport.reduce_op import ReduceOp
from minidist.parallel.data.hook_state import HookState, add_residual
from minidist.parallel.data.hooks import Future, GradBucket, allreduce_hook


@dataclass
class PowerSGDState(HookState):
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

    def state_dict(self) -> dict[str, Any]:
        """HookState's fields, and the generator of Q's draws under ``"rng"`` (its
        PCG64 words: with ``warm_start=False`` every step draws)."""
        return {**super().state_dict(), "rng": self._rng.get_state()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._rng.set_state(state_dict["rng"])

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


def _flat(arrays: list, dtype: Any) -> Any:
    """The arrays back to back in one flat buffer (one all-reduce for all of them)."""
    return xp.concatenate([a.reshape(-1) for a in arrays]) if arrays else xp.zeros(0, dtype)


def _pieces(flat: Any, shapes: list) -> list:
    """``flat`` cut back into views of ``shapes`` (the inverse of ``_flat``)."""
    out, off = [], 0
    for shape in shapes:
        size = math.prod(shape)
        out.append(flat[off:off + size].reshape(shape))
        off += size
    return out


def powerSGD_hook(state: PowerSGDState, bucket: GradBucket) -> Future:
    """Average ``bucket`` with PowerSGD (see the module docstring), in four steps: add
    the residual, start the dense all-reduce and P's, then (when DDP waits) Q's, then
    decompress and keep the new residual."""
    if state.iter < state.start_powerSGD_iter:
        state.maybe_increase_iter(bucket)
        return allreduce_hook(state.process_group, bucket)
    return _PowerSGDRound(state, bucket).start()


class _PowerSGDRound:
    """PowerSGD on one bucket in one step: its matrices, the dense rest, P and Q."""

    def __init__(self, state: PowerSGDState, bucket: GradBucket):
        self.state, self.bucket, self.group = state, bucket, state.process_group
        self.i, self.buf = bucket.index(), bucket.buffer()
        self.r = state.matrix_approximation_rank
        self.matrices, self.dense = [], []      # views of the bucket: compressed, sent whole
        for view in bucket.gradients():
            shape = _as_matrix(view).shape if view.ndim >= 2 else None
            worth = shape is not None and worth_compressing(shape, self.r,
                                                            state.min_compression_rate)
            (self.matrices if worth else self.dense).append(view)

    def start(self) -> Future:
        """input = gradient + residual; start the dense all-reduce and P = sum M Q."""
        state, i, buf = self.state, self.i, self.buf
        if state.use_error_feedback:
            add_residual(state.error_dict, i, buf)       # input = gradient + residual
            self.before = buf.copy()
        state.dense_elements[i] = buf.size
        state.sent_elements[i] = (
            sum(compressed_elements(_as_matrix(v).shape, self.r) for v in self.matrices)
            + sum(v.size for v in self.dense))
        # The uncompressed part: one plain all-reduce of the vectors, back to back.
        self.flat_dense = _flat(self.dense, buf.dtype)
        self.dense_work = dist.all_reduce(self.flat_dense, op=ReduceOp.AVG, group=self.group,
                                          async_op=True) if self.dense else None
        # P = M Q for every matrix, all in one flat buffer, summed over ranks.
        qs = state.q_memory_dict.get(i) if state.warm_start else None
        if qs is None:
            qs = [state._rng.normal((_as_matrix(v).shape[1], rank_for(_as_matrix(v).shape, self.r)),
                                    dtype=buf.dtype) for v in self.matrices]
        self.ps = [_as_matrix(v) @ q for v, q in zip(self.matrices, qs)]   # each (n, k)
        self.p_flat = _flat(self.ps, buf.dtype)
        future = Future(dist.all_reduce(self.p_flat, group=self.group, async_op=True),
                        self.second_half)
        if self.dense_work is not None:
            future.works.append(self.dense_work)
        return future

    def second_half(self) -> Future:
        """P is summed: orthonormalise it, Q = M^T P^, sum Q over ranks."""
        p_hats = [_orthonormal(p) for p in _pieces(self.p_flat, [p.shape for p in self.ps])]
        new_qs = [_as_matrix(v).T @ ph for v, ph in zip(self.matrices, p_hats)]  # each (m, k)
        q_flat = _flat(new_qs, self.buf.dtype)
        q_work = dist.all_reduce(q_flat, group=self.group, async_op=True)
        return Future(q_work, lambda: self.decompress(p_hats, q_flat, new_qs))

    def decompress(self, p_hats: list, q_flat: Any, new_qs: list) -> Any:
        """M ~ P^ Q^T with Q averaged; the dense part back; residual = input - approx."""
        state = self.state
        q_flat /= dist.get_world_size(self.group)                    # sum -> average
        averaged_qs = _pieces(q_flat, [q.shape for q in new_qs])     # each (m, k)
        for v, ph, q_avg in zip(self.matrices, p_hats, averaged_qs):
            v[...] = (ph @ q_avg.T).reshape(v.shape)                 # M ~ P^ Q^T
        state.q_memory_dict[self.i] = [q.copy() for q in averaged_qs]
        if self.dense:
            if self.dense_work is not None:
                self.dense_work.wait()
            for v, avg in zip(self.dense, _pieces(self.flat_dense, [v.shape for v in self.dense])):
                v[...] = avg
        if state.use_error_feedback:
            state.error_dict[self.i] = self.before - self.buf        # residual = input - approx
        state.maybe_increase_iter(self.bucket)
        return self.buf
