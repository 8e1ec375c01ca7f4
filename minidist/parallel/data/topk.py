"""Top-K sparsification with error feedback: send only the k largest gradient entries.

Each rank keeps what it did not send and adds it to its next gradient (error
feedback, Stich et al. 2018 "Sparsified SGD with memory"; Lin et al. 2018, Deep
Gradient Compression), so every entry is sent eventually and nothing is lost:

    input    = gradient + residual                     (n,) this bucket on this rank
    I        = indices of the k largest |input|         ties: the lower index first
    residual = input,  residual[I] = 0                  what stays behind for next step
    average  = (1/N) sum_r scatter(I_r, input_r[I_r])   every rank's (I_r, values_r)

The (indices, values) pairs of all ranks are all-gathered, k * (8 + s) bytes per
rank and (N-1) * k * (8 + s) sent per rank over the ring (s: bytes per value), and
every rank adds them in rank order: the same bits everywhere. Against the
all-reduce's 2(N-1)/N * n * s it pays off when k is well under n / N.

k = ceil(density * n) per bucket, at least 1. When k >= n nothing would be dropped:
the hook sends the bucket with DDP's own all-reduce (``allreduce_hook``), so density
1.0 is DDP bit for bit (and sends no indices).

Use: ``ddp.register_comm_hook(TopKState(None, density=0.01), topk_hook)``. The
residuals are memory a resumed run needs: ``state.state_dict()`` /
``load_state_dict`` (hook_state.py), one per rank.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import minidist.distributed as dist
from minidist.backend import xp
from minidist.parallel.data.hook_state import HookState, add_residual
from minidist.parallel.data.hooks import Future, GradBucket, allreduce_hook


@dataclass
class TopKState(HookState):
    """Settings and memory of the Top-K hook, one per DDP model."""
    process_group: Any = None              # the group to average over (None: the world)
    density: float = 0.01                  # fraction of each bucket's entries sent
    use_error_feedback: bool = True        # keep the unsent entries for the next step
    error_dict: dict = field(default_factory=dict)   # bucket index -> residual (n,)
    sent_elements: dict = field(default_factory=dict)  # bucket index -> k

    def __post_init__(self) -> None:
        if not 0.0 < self.density <= 1.0:
            raise ValueError(f"TopKState: density must lie in (0, 1] (the fraction of "
                             f"entries sent), got {self.density}")


def k_for(n: int, density: float) -> int:
    """Entries sent from a bucket of n: ceil(density * n), between 1 and n."""
    return min(n, max(1, math.ceil(density * n)))


def top_k_indices(x: Any, k: int) -> Any:
    """Indices of the k largest |x|, ties broken by the lower index (a stable sort)."""
    return xp.argsort(-xp.abs(x), kind="stable")[:k]


def topk_hook(state: TopKState, bucket: GradBucket) -> Future:
    """Average ``bucket`` from each rank's k largest entries (module docstring)."""
    group, i, buf = state.process_group, bucket.index(), bucket.buffer()
    k = k_for(buf.size, state.density)
    state.sent_elements[i] = k
    if k >= buf.size:                            # nothing to drop: DDP's all-reduce
        return allreduce_hook(group, bucket)
    n_ranks = dist.get_world_size(group)
    if state.use_error_feedback:
        add_residual(state.error_dict, i, buf)   # input = gradient + residual
    idx = top_k_indices(buf, k)                  # (k,) int64
    values = buf[idx]                            # (k,)
    if state.use_error_feedback:
        residual = buf.copy()
        residual[idx] = 0                        # what was not sent stays here
        state.error_dict[i] = residual
    all_idx = xp.empty(n_ranks * k, dtype=idx.dtype)          # (N * k,)
    all_values = xp.empty(n_ranks * k, dtype=buf.dtype)       # (N * k,)
    works = [dist.all_gather_into_tensor(all_idx, idx, group=group, async_op=True),
             dist.all_gather_into_tensor(all_values, values, group=group, async_op=True)]

    def scatter_in_rank_order() -> Any:
        works[1].wait()
        buf[...] = 0
        for r in range(n_ranks):                 # indices are distinct within a rank
            buf[all_idx[r * k:(r + 1) * k]] += all_values[r * k:(r + 1) * k]
        xp.divide(buf, n_ranks, out=buf)         # (an in-place op: buf is not reassigned)
        return buf
    future = Future(works[0], scatter_in_rank_order)
    future.works.append(works[1])
    return future
