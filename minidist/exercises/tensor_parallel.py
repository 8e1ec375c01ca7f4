"""35.10 column- and row-parallel linear layers, through Megatron's f and g.

On N ranks, W1 (H, D) is split by rows (each rank computes H/N of the hidden
features: column parallel) and W2 (D, H) by columns (each rank multiplies its
H/N features: row parallel, a partial sum). The learner writes the two
autograd Functions f and g and the two layers; the grader compares the
output and every gradient with the dense layers computed here.
"""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from minidist.exercises.core import Exercise, Property


def dense(seed: int, n: int, batch: int, d: int, h_per_rank: int):
    rng = np.random.default_rng(seed)
    h = h_per_rank * n
    x, w1, w2 = rng.normal(size=(batch, d)), rng.normal(size=(h, d)), rng.normal(size=(d, h))
    dy = rng.normal(size=(batch, d))
    return x, w1, w2, dy


def drive(module, seed, n, batch, d, hp):
    """In rank r: y = row(column(x)) with this rank's shards; y and the gradients."""
    from minidist.autograd import Tensor
    from minidist.backend import from_host, to_host
    from minidist.comm import get_rank
    r = get_rank()
    x, w1, w2, dy = dense(seed, n, batch, d, hp)
    xt = Tensor(from_host(x), requires_grad=True)
    w1t = Tensor(from_host(w1[r * hp:(r + 1) * hp]), requires_grad=True)      # (H/N, D)
    w2t = Tensor(from_host(w2[:, r * hp:(r + 1) * hp].copy()), requires_grad=True)  # (D, H/N)
    y = module.row_parallel_linear(module.column_parallel_linear(xt, w1t), w2t)
    y.backward(from_host(dy))
    grads = [t.grad for t in (xt, w1t, w2t)]
    assert all(g is not None for g in grads), "some input received no gradient"
    return to_host(y.data), [to_host(g) for g in grads]


def _run(s, seed, n, batch, d, hp):
    out = s.run(n, drive, seed, n, batch, d, hp)
    x, w1, w2, dy = dense(seed, n, batch, d, hp)
    hidden = x @ w1.T
    return out, dict(y=hidden @ w2.T, dx=dy @ w2 @ w1, dw1=(dy @ w2).T @ x, dw2=dy.T @ hidden)


cases = dict(seed=st.integers(0, 1000), n=st.integers(1, 4), batch=st.integers(1, 3),
             d=st.integers(1, 4), hp=st.integers(1, 3))


def _close(got, want, what, r, case):
    assert got.shape == want.shape and np.allclose(got, want, rtol=1e-9, atol=1e-9), \
        f"rank {r}: {what} = {np.round(got, 4).tolist()}, the dense layers give " \
        f"{np.round(want, 4).tolist()}"


def _output_matches(s, seed, n, batch, d, hp):
    out, want = _run(s, seed, n, batch, d, hp)
    for r, (y, _) in enumerate(out):
        _close(y, want["y"], "y", r, None)


def _input_grad_matches(s, seed, n, batch, d, hp):
    out, want = _run(s, seed, n, batch, d, hp)
    for r, (_, grads) in enumerate(out):
        _close(grads[0], want["dx"], "dL/dx", r, None)


def _weight_grads_match(s, seed, n, batch, d, hp):
    out, want = _run(s, seed, n, batch, d, hp)
    for r, (_, grads) in enumerate(out):
        _close(grads[1], want["dw1"][r * hp:(r + 1) * hp], "dL/dW1 (this rank's rows)", r, None)
        _close(grads[2], want["dw2"][:, r * hp:(r + 1) * hp], "dL/dW2 (this rank's columns)", r, None)


TENSOR_PARALLEL = Exercise(
    id="35.10", processes=True, title="column- and row-parallel linear layers (f and g)", kind="implement",
    filename="ex_35_10_tensor_parallel.py",
    docs="docs/tensor_parallel.md (f and g)",
    starter='''"""Exercise 35.10: column-parallel and row-parallel linear layers.

On N ranks, W1 (H, D) is split by rows: rank r holds W1_r (H/N, D) and
computes its H/N hidden features, y1_r = x W1_r^T (column parallel). W2 (D, H)
is split by columns: rank r holds W2_r (D, H/N) and computes a partial output
y1_r W2_r^T; the sum over ranks is the layer's output (row parallel).

Megatron's two conjugate operators make the gradients right:

    f: forward identity,   backward all-reduce  (before the column layer:
       every rank's W1_r contributes a part of dL/dx)
    g: forward all-reduce, backward identity    (after the row layer)

Write f and g as autograd Functions (minidist.autograd.Function: static
forward(ctx, x) and backward(ctx, grad) on arrays; call with F.apply(t)),
then the two layers. Interface: minidist.nn.functional.linear(x, w) = x w^T,
minidist.comm.all_reduce(array) (in place, sum; reduce a copy, never the
input). Check: `minidist exercise check 35.10`.
"""
import minidist.comm as comm
from minidist.autograd import Function
from minidist.nn.functional import linear


class CopyToTensorParallel(Function):          # f
    @staticmethod
    def forward(ctx, x):
        raise NotImplementedError

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError


class ReduceFromTensorParallel(Function):      # g
    @staticmethod
    def forward(ctx, x):
        raise NotImplementedError

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError


def column_parallel_linear(x, weight_shard):
    """x (B, D) on every rank, weight_shard (H/N, D) -> this rank's (B, H/N)."""
    raise NotImplementedError


def row_parallel_linear(x_shard, weight_shard):
    """x_shard (B, H/N), weight_shard (D, H/N) -> the full (B, D) on every rank."""
    raise NotImplementedError
''',
    properties=[
        Property("the output equals the dense layers' on every rank", _output_matches, cases,
                 examples=8, hint="docs/tensor_parallel.md: which operator sums the partial outputs?"),
        Property("dL/dx equals the dense layers' on every rank", _input_grad_matches, cases,
                 examples=8, hint="x feeds every rank's W1_r: its gradient is a sum over ranks (f's backward)"),
        Property("each rank's weight gradients equal its slice of the dense ones",
                 _weight_grads_match, cases, examples=8,
                 hint="g's backward is the identity: reducing there multiplies the gradient by N"),
    ],
    solution='''from minidist.nn.functional import linear
from minidist.parallel.tensor.mappings import copy_to_tp, reduce_from_tp


def column_parallel_linear(x, weight_shard):
    return linear(copy_to_tp(x), weight_shard)


def row_parallel_linear(x_shard, weight_shard):
    return reduce_from_tp(linear(x_shard, weight_shard))
''',
    wrong={
        "f without its backward all-reduce": '''from minidist.nn.functional import linear
from minidist.parallel.tensor.mappings import reduce_from_tp


def column_parallel_linear(x, weight_shard):
    return linear(x, weight_shard)


def row_parallel_linear(x_shard, weight_shard):
    return reduce_from_tp(linear(x_shard, weight_shard))
''',
        "g reduces in both directions": '''import minidist.comm as comm
from minidist.autograd import Function
from minidist.nn.functional import linear
from minidist.parallel.tensor.mappings import copy_to_tp


class AllReduceBoth(Function):
    @staticmethod
    def forward(ctx, x):
        out = x.copy()
        comm.all_reduce(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        out = grad.copy()
        comm.all_reduce(out)
        return out


def column_parallel_linear(x, weight_shard):
    return linear(copy_to_tp(x), weight_shard)


def row_parallel_linear(x_shard, weight_shard):
    return AllReduceBoth.apply(linear(x_shard, weight_shard))
''',
    })

EXERCISES = [TENSOR_PARALLEL]
