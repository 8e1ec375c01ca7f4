"""Gradient buckets: parameters grouped so one all-reduce carries many gradients.

Buckets are filled in *reverse* order of the parameters as the model lists
them, which is roughly the order backward produces their gradients (the last
layer's gradient is ready first). A bucket closes when adding the next
parameter would take it past ``cap_bytes`` (a single larger parameter gets a
bucket of its own), or when the dtype changes (one flat buffer, one dtype).

    bucket.flat           1-D buffer holding the bucket's gradients back to back
    bucket.views[i]       flat[off_i : off_i + numel_i].reshape(shape_i)

Per step, the cost of all-reducing B buckets of M/B bytes each with the ring is
B * (2(N-1) alpha) + 2(N-1)/N * M / beta: fewer buckets pay less latency, more
buckets start earlier and overlap more of backward. torch's default cap is
25 MB; so is ours.
"""
from __future__ import annotations

from typing import Any

from minidist.autograd.tensor import Tensor
from minidist.backend import xp

DEFAULT_BUCKET_CAP_MB = 25.0


class Bucket:
    """A flat gradient buffer for a few parameters, and its state in this backward."""

    def __init__(self, index: int, params: list[Tensor]):
        self.index = index
        self.params = params
        self.dtype = params[0].data.dtype
        numel = sum(p.data.size for p in params)
        self.flat = xp.zeros(numel, dtype=self.dtype)                 # (numel,)
        self.views, off = [], 0
        for p in params:
            self.views.append(self.flat[off:off + p.data.size].reshape(p.data.shape))
            off += p.data.size
        self.reset()

    def reset(self) -> None:
        self.ready: set[int] = set()      # ids of params whose gradient is in flat
        self.work: Any = None             # the hook's Future, once launched
        self.launched_at: float | None = None  # when its last gradient arrived

    @property
    def nbytes(self) -> int:
        return self.flat.nbytes

    def is_full(self) -> bool:
        return len(self.ready) == len(self.params)

    def add(self, position: int, grad: Any) -> None:
        """Copy a finished gradient into its slot of the flat buffer, unless
        backward already added it there (``p.grad`` is the bucket view, ddp.py)."""
        if grad is not self.views[position]:
            self.views[position][...] = grad
        self.ready.add(id(self.params[position]))


def assign_buckets(params: list[Tensor], cap_bytes: float) -> list[Bucket]:
    """Group ``params`` into buckets in reverse order (see the module docstring)."""
    return [Bucket(i, g) for i, g in enumerate(split_in_buckets(params, cap_bytes))]


def split_in_buckets(params: list[Tensor], cap_bytes: float) -> list[list[Tensor]]:
    """The parameters of each bucket, last parameter first (no buffers allocated)."""
    if cap_bytes <= 0:
        raise ValueError(f"bucket cap must be positive, got {cap_bytes} bytes")
    groups: list[list[Tensor]] = []
    current: list[Tensor] = []
    size = 0
    for p in reversed(params):
        too_big = current and size + p.data.nbytes > cap_bytes
        other_dtype = current and p.data.dtype != current[0].data.dtype
        if too_big or other_dtype:
            groups.append(current)
            current, size = [], 0
        current.append(p)
        size += p.data.nbytes
    if current:
        groups.append(current)
    return groups
