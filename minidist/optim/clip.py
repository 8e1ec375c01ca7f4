"""Gradient-norm clipping: rescale all gradients together when their norm is large.

Over all gradients g_1, ..., g_k taken as one long vector:

    total_norm = ( sum_i ||g_i||_p^p )^(1/p)      (p = inf: max_i max |g_i|)
    clip_coef  = max_norm / (total_norm + 1e-6)
    g_i <- clip_coef * g_i                        only if clip_coef < 1

The direction of the step is kept; only its length is capped. (The 1e-6 keeps
a zero norm from dividing by zero; it is PyTorch's constant.)

Across shards (ZeRO, tensor parallel), each rank holds some of the g_i. The
norm of the whole is then built from per-rank pieces:

    p = 2:    total_norm = sqrt( all_reduce_sum( grad_sq_sum(my_params) ) )
    p = inf:  total_norm = all_reduce_max( grad_norm(my_grads, inf) )

and each rank calls ``clip_grads_with_norm_(my_params, max_norm, total_norm)``.
(``grad_norm_share`` and ``norm_from_share`` are the two ends of that, for any p.)
``clip_grad_norm_`` is the one-process composition of the two halves.

A parameter that ``fully_shard``, ``parallelize_module``, expert parallelism or the
tensor-parallel layers made one rank's piece of a larger tensor (a DTensor's local
part, an expert of a layer's stack, a slice) is registered as such, with how its share
adds up with the other ranks' pieces (autograd/pieces.py). ``clip_grad_norm_`` then
combines those shares, so that it returns, and clips by, the norm of the whole
tensors on every rank, as torch's does for DTensor parameters. The pieces are
combined kind by kind (one collective per kind of cut, in the order the parameter
list first meets it, which is the same on every rank), so every rank must call it.
This layer cannot talk to other ranks (it sits below comm): the distributed layer
supplies the combining (distributed/tensor/_piece_norm.py).

A pipeline stage's parameters (registered by ``run_pipeline``) are refused: the other
stages hold the rest of the model, and a tied embedding sits on two of them;
``minidist.parallel.clip_grad_norm_(model, max_norm, chunks, pp_group)`` counts them.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable

from minidist.autograd import Tensor
from minidist.autograd.pieces import piece_kinds, piece_layout, stage_layout
from minidist.backend import xp


def _grads(params: Tensor | Iterable[Tensor]) -> list[Any]:
    """The gradient arrays of ``params`` (a Tensor or iterable of them), skipping None."""
    if isinstance(params, Tensor):
        params = [params]
    grads = []
    for p in params:
        if not isinstance(p, Tensor):
            raise TypeError(f"expected Tensors, got {type(p).__name__}")
        if p.grad is not None:
            grads.append(p.grad)
    return grads


def _sq_sum(g: Any) -> float:
    """||g||_2^2 of one array; a dot product is one pass with no temporary g**2."""
    flat = g.reshape(-1)
    return float(xp.vdot(flat, flat))


def l2_norm(a: Any) -> float:
    """||a||_2 of one array, on the host."""
    return float(xp.linalg.norm(a))


def whole_norm(param: Tensor) -> Callable[[Any], float]:
    """How to take the 2-norm of an array shaped like ``param`` (its weights, gradient
    or update) over the whole tensor ``param`` is a piece of: for a piece (module
    docstring), sqrt of its sum of squares added over the pieces' holders, a collective
    that every holder must call; for a whole tensor (an expert too: its holders hold
    other experts), its own norm. A trust ratio (LAMB, LARS) takes its norms with it, as
    one process takes them over the tensor."""
    layout = piece_layout(param)
    if layout is None or not layout.tensor_groups:
        return l2_norm
    return lambda a: math.sqrt(layout.combine_tensor(_sq_sum(a), 2.0))


def grad_sq_sum(params: Tensor | Iterable[Tensor]) -> float:
    """sum_i ||g_i||_2^2 over the parameters' gradients: what shards all-reduce."""
    return sum((_sq_sum(g) for g in _grads(params)), 0.0)


def _check_norm_type(norm_type: float) -> float:
    norm_type = float(norm_type)
    if not norm_type > 0:
        raise ValueError(f"norm_type must be > 0 or inf, got {norm_type}")
    return norm_type


def grad_norm_share(grads: Iterable[Any], norm_type: float = 2.0) -> float:
    """One holder's share of the p-norm of arrays it holds: sum_i ||g_i||_p^p,
    or max_i max |g_i| for p = inf. Shares of disjoint pieces combine by a sum
    (a max for inf); ``norm_from_share`` turns the combined share into the norm."""
    norm_type = _check_norm_type(norm_type)
    grads = list(grads)
    if norm_type == math.inf:
        return max((float(xp.max(xp.abs(g))) if g.size else 0.0 for g in grads), default=0.0)
    if norm_type == 2.0:
        return sum((_sq_sum(g) for g in grads), 0.0)
    return sum((float(xp.sum(xp.abs(g) ** norm_type)) for g in grads), 0.0)


def norm_from_share(share: float, norm_type: float = 2.0) -> float:
    """The p-norm from the (combined) share: share^(1/p); the share itself for inf."""
    norm_type = _check_norm_type(norm_type)
    if norm_type == math.inf:
        return share
    if norm_type == 2.0:
        return math.sqrt(share)
    return share ** (1.0 / norm_type)


def grad_norm(grads: Iterable[Any], norm_type: float = 2.0) -> float:
    """The p-norm of a list of arrays taken as one vector (p > 0 or ``math.inf``)."""
    return norm_from_share(grad_norm_share(grads, norm_type), norm_type)


def check_finite(total_norm: float, norm_type: float) -> None:
    """Raise if the norm is inf or NaN (``error_if_nonfinite=True``)."""
    if not math.isfinite(total_norm):
        raise RuntimeError(f"the total {norm_type}-norm of the gradients is {total_norm}; "
                           "pass error_if_nonfinite=False to clip anyway")


def clip_grads_with_norm_(params: Tensor | Iterable[Tensor], max_norm: float,
                          total_norm: float) -> None:
    """Scale the gradients in place by ``max_norm / (total_norm + 1e-6)`` if that is < 1.

    ``total_norm`` is given, so it can be the norm over every rank's shards.
    A NaN or inf total scales too (to NaN or 0), as in PyTorch, so a broken
    step shows up in the gradients instead of being silently passed through.
    """
    if max_norm < 0:
        raise ValueError(f"max_norm must be >= 0, got {max_norm}")
    clip_coef = max_norm / (total_norm + 1e-6)
    if clip_coef < 1.0 or not math.isfinite(total_norm):
        for g in _grads(params):
            g *= clip_coef


def total_grad_share(params: Tensor | Iterable[Tensor], norm_type: float = 2.0) -> float:
    """The share (``grad_norm_share``) of the gradients of ``params``, pieces combined
    with the pieces the other ranks hold (module docstring): the share of the whole
    tensors, the same on every rank that holds a piece. A collective per kind of piece."""
    params = [params] if isinstance(params, Tensor) else list(params)
    whole, kinds = piece_kinds(params)
    shares = [grad_norm_share(_grads(whole), norm_type)]
    for layout, pieces in kinds:   # a kind with no gradient here still combines
        shares.append(layout.combine(grad_norm_share(_grads(pieces), norm_type), norm_type))
    return max(shares) if _check_norm_type(norm_type) == math.inf else sum(shares)


def refuse_stage_parameters(params: Iterable[Tensor]) -> None:
    """Raise if a parameter is one pipeline stage's (autograd/pieces.py): the norm of
    this rank's would be its stage's alone, not the model's."""
    for p in params:
        layout = stage_layout(p)
        if layout is not None:
            raise ValueError(
                f"a parameter of shape {tuple(p.shape)} is one pipeline stage's (run_pipeline "
                f"over ranks {list(layout.key[1])}): the norm of this rank's gradients "
                "would be this stage's alone, not the model's, and each stage would clip by "
                "another factor. Use minidist.parallel.clip_grad_norm_(model, max_norm, "
                "chunks, pp_group), which adds the stages' shares over the pipeline group and "
                "counts a tied embedding once")


def total_grad_norm(params: Tensor | Iterable[Tensor], norm_type: float = 2.0) -> float:
    """The p-norm of the gradients of ``params`` taken as one vector; pieces count
    with the pieces the other ranks hold (module docstring), so the result is the
    norm of the whole tensors, the same on every rank. A pipeline stage's parameters
    are refused (``refuse_stage_parameters``)."""
    params = [params] if isinstance(params, Tensor) else list(params)
    refuse_stage_parameters(params)
    return norm_from_share(total_grad_share(params, norm_type), norm_type)


def clip_grad_norm_(params: Tensor | Iterable[Tensor], max_norm: float,
                    norm_type: float = 2.0, error_if_nonfinite: bool = False) -> float:
    """Clip the gradients of ``params`` in place to total norm ``max_norm``.

    Same semantics as ``torch.nn.utils.clip_grad_norm_``; parameters without a
    gradient are skipped, and pieces of cut tensors count as the whole tensors
    (``total_grad_norm``). Returns the total norm *before* clipping, as a Python
    float (not a 0-d array: deciding whether to clip needs it on the host anyway).
    """
    params = [params] if isinstance(params, Tensor) else list(params)
    total_norm = total_grad_norm(params, norm_type)
    if error_if_nonfinite:
        check_finite(total_norm, norm_type)
    clip_grads_with_norm_(params, max_norm, total_norm)
    return total_norm
