"""Ops that only move elements: reshape, permute, concat, split, stack.

Their backward moves the gradient back the same way: reshape it back, apply
the inverse permutation, cut it into the pieces, or join the pieces.
"""
from __future__ import annotations

from minidist.autograd.function import Function
from minidist.backend import xp


class Reshape(Function):
    @staticmethod
    def forward(ctx, a, shape):
        ctx.shape = a.shape
        return a.reshape(shape)

    @staticmethod
    def backward(ctx, grad):
        return grad.reshape(ctx.shape)


class Permute(Function):
    @staticmethod
    def forward(ctx, a, axes):
        if sorted(a_ % a.ndim for a_ in axes) != list(range(a.ndim)):
            raise ValueError(f"permute axes {axes} are not a permutation of "
                             f"0..{a.ndim - 1}")
        ctx.axes = tuple(a_ % a.ndim for a_ in axes)
        return a.transpose(ctx.axes)

    @staticmethod
    def backward(ctx, grad):
        inverse = [0] * len(ctx.axes)
        for i, a in enumerate(ctx.axes):
            inverse[a] = i
        return grad.transpose(inverse)


class Concat(Function):
    @staticmethod
    def forward(ctx, *arrays, axis=0):
        ctx.axis = axis
        ctx.sizes = [a.shape[axis] for a in arrays]
        return xp.concatenate(arrays, axis=axis)

    @staticmethod
    def backward(ctx, grad):
        bounds = []
        total = 0
        for n in ctx.sizes[:-1]:
            total += n
            bounds.append(total)
        return tuple(xp.split(grad, bounds, axis=ctx.axis))


class Split(Function):
    """Cut along ``axis`` into pieces of the given sizes (several outputs)."""

    @staticmethod
    def forward(ctx, a, sizes, axis=0):
        if sum(sizes) != a.shape[axis]:
            raise ValueError(f"split sizes {list(sizes)} do not add up to "
                             f"{a.shape[axis]} along axis {axis}")
        ctx.axis = axis
        bounds = []
        total = 0
        for n in sizes[:-1]:
            total += n
            bounds.append(total)
        return tuple(xp.split(a, bounds, axis=axis))

    @staticmethod
    def backward(ctx, *grads):
        return xp.concatenate(grads, axis=ctx.axis), None


class Stack(Function):
    @staticmethod
    def forward(ctx, *arrays, axis=0):
        ctx.axis = axis
        return xp.stack(arrays, axis=axis)

    @staticmethod
    def backward(ctx, grad):
        n = grad.shape[ctx.axis]
        return tuple(xp.take(grad, i, axis=ctx.axis) for i in range(n))
