"""scatter_add in a fixed order on CuPy: the sums NumPy's ``np.add.at`` makes, bit for bit.

``np.add.at(target, idx, values)`` does, for i = 0, 1, ..., N-1 in turn::

    target[idx[i]] += values[i]

so the rows of a repeated index are added one after another, in the order they come.
``cupyx.scatter_add`` makes the same adds with atomics: all repeats at once, in the
order the GPU's threads happen to reach memory, so the rounding, and the last bit,
changes from run to run. An embedding's gradient (one row per token) is such a sum,
and two runs of one training script would part in their last bits.

Here the repeats are first grouped, keeping their order (a stable sort of idx), then
one GPU thread per (distinct index u, column c) walks its group front to back::

    order  = argsort(idx, stable)          # rows of each index together, in order
    starts = where each distinct index's group begins in idx[order]   (U + 1,)
    thread (u, c):  acc = target[i_u, c]
                    for j in starts[u] .. starts[u+1]-1:  acc += values[order[j], c]
                    target[i_u, c] = acc

The same adds in the same order and dtype as ``np.add.at``: the same bits on NumPy
and CuPy, on every run. ``tests/test_backend.py`` holds it to ``np.add.at`` (on the
NumPy and guard backends, the code path by a NumPy stand-in for the kernel).
"""
from __future__ import annotations

from typing import Any

from minidist.backend import xp

_SOURCE = """
    const long long u = i / n_cols, c = i % n_cols;
    const long long row = uniq[u] * n_cols + c;
    T acc = target[row];
    for (long long j = starts[u]; j < starts[u + 1]; ++j) {
        acc = acc + values[sorted_rows[j] * n_cols + c];
    }
    target[row] = acc;
"""
_kernel = None


def _walk_groups_on_gpu(target, sorted_rows, starts, uniq, values, n_cols: int) -> None:
    """The kernel: one thread per (distinct index, column), compiled once per process."""
    global _kernel
    if _kernel is None:
        import cupy
        _kernel = cupy.ElementwiseKernel(
            "raw int64 sorted_rows, raw int64 starts, raw int64 uniq, raw T values, "
            "int64 n_cols", "raw T target", _SOURCE, "minidist_ordered_scatter_add")
    _kernel(sorted_rows, starts, uniq, values, n_cols, target, size=uniq.size * n_cols)


def _walk_groups_reference(target, sorted_rows, starts, uniq, values, n_cols: int) -> None:
    """The kernel's loop in array code, for the CPU backends: the oracle of the kernel."""
    flat_target, flat_values = target.reshape(-1, n_cols), values.reshape(-1, n_cols)
    for u in range(uniq.size):
        acc = flat_target[int(uniq[u])].copy()
        for j in range(int(starts[u]), int(starts[u + 1])):
            acc += flat_values[int(sorted_rows[j])]
        flat_target[int(uniq[u])] = acc


def ordered_scatter_add(target: Any, indices: Any, values: Any, on_gpu: bool = True) -> None:
    """In place: ``target[indices[i]] += values[i]`` for i in order, as ``np.add.at``.

    target: (V, ...) C-contiguous; indices: (N,) integers in [-V, V);
    values: (N, ...) matching target's trailing shape, cast to target's dtype.
    """
    n = indices.size
    if n == 0:
        return
    n_cols = target.size // target.shape[0]
    idx = indices.astype("int64")
    idx = xp.where(idx < 0, idx + target.shape[0], idx)             # numpy's negative indices
    order = xp.argsort(idx, kind="stable")                          # (N,) rows grouped, in order
    grouped = idx[order]                                            # (N,) sorted indices
    new_group = xp.concatenate([xp.ones(1, dtype=bool), grouped[1:] != grouped[:-1]])
    firsts = xp.nonzero(new_group)[0]                               # (U,) where groups begin
    starts = xp.concatenate([firsts, xp.full(1, n, dtype="int64")]).astype("int64")
    uniq = grouped[firsts]                                          # (U,) the distinct indices
    values = xp.ascontiguousarray(values.astype(target.dtype, copy=False))
    walk = _walk_groups_on_gpu if on_gpu else _walk_groups_reference
    walk(target, order.astype("int64"), starts, uniq, values, n_cols)
