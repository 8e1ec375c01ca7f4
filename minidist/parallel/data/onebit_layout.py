"""Which parameters 1-bit Adam's flat vectors hold, and how every rank agrees on it.

1-bit Adam (onebit_adam.py) averages each param group's flat vector (its parameters
that have a gradient, back to back in the group's order) by position over the N
ranks, so every rank must put the same parameters in it; and its error feedback is
laid out over the vector of its first compressed step, so from then on the same ones
at every step. With m_r (P,) rank r's mask of a group's P parameters (1 where it has
a gradient):

    warm-up step            mean_r m_r travels in front of the flat gradient, in its
                            all-reduce (P numbers more, no message more); a slot
                            strictly between 0 and 1 is refused on every rank
    first compressed step   one all-reduce of the masks per group, the same check;
                            the parameters with a gradient are the layout, fixed
    later steps             a rank whose parameters with a gradient differ from the
                            layout, in ANY param group, refuses the step's first
                            compressed all-reduce (-1 where its scale goes, onebit.py:
                            no byte and no message more), so every rank raises at once;
                            on that path only, the ranks all-gather their masks of
                            every group and each names the parameter and the rank

The check of a later step is over the whole optimizer, not one group, for the group
that had no gradient on any rank at its first compressed step: it is laid out over no
parameter and makes no collective, so a gradient given to one of its parameters on
one rank must be told to the peers by another group's compressed all-reduce, which
every rank makes anyway. (Letting the empty group take part in a compressed
all-reduce of nothing would tell them too, but a frozen group kept in the optimizer
would then pay 4(N-1) messages a step for nothing.) While no group of the optimizer
has a gradient on any rank, there is no such all-reduce: nothing is laid out yet,
and each step agrees on the masks again (``OnebitAdam.step``), the one case in which
the check costs a collective a step.
"""
from __future__ import annotations

from typing import Any, NoReturn

import minidist.distributed as dist
from minidist import backend
from minidist.backend import xp
from minidist.comm.transport.reduce_op import ReduceOp


def flatten(arrays: list[Any]) -> Any:
    """The arrays back to back in one new flat vector (n,), of their one dtype."""
    dtypes = {str(a.dtype) for a in arrays}
    if len(dtypes) != 1:
        raise ValueError(f"1-bit Adam flattens each param group into one vector of one "
                         f"dtype, got {sorted(dtypes)}: put the parameters of each dtype "
                         f"in a param group of their own")
    return xp.concatenate([a.reshape(-1) for a in arrays])


def views(flat: Any, like: list[Any]) -> list[Any]:
    """Pieces of ``flat`` shaped like the arrays of ``like``, in order (no copy)."""
    out, off = [], 0
    for a in like:
        out.append(flat[off:off + a.size].reshape(a.shape))
        off += a.size
    return out


def gradient_mask(group: dict, params: list) -> Any:
    """(P,) over the group's P parameters: 1 where the parameter is among ``params``
    (those with a gradient on this rank), else 0; in the group's dtype."""
    with_grad = {id(p) for p in params}
    first = group["params"][0].data
    return backend.from_host([1.0 if id(p) in with_grad else 0.0 for p in group["params"]],
                             dtype=first.dtype)


def refuse_left_out(index: int, group: dict, averaged: Any) -> None:
    """Raise, on every rank alike, if the ranks' gradient masks differ: ``averaged`` is
    their mean (the same bits everywhere), and a slot strictly between 0 and 1 is a
    parameter some ranks have a gradient for and others not. The flat vectors are
    averaged by position, so such a step would add one parameter's gradient to
    another's, silently where the sizes match."""
    left_out = [j for j, x in enumerate(backend.to_host(averaged).tolist()) if 0 < x < 1]
    if left_out:
        shapes = [tuple(group["params"][j].shape) for j in left_out]
        raise ValueError(
            f"1-bit Adam: parameters {left_out} of param group {index} (shapes {shapes}) "
            f"have a gradient on some ranks and not on others; the group's flat vector is "
            f"averaged by position, so it would pair different parameters' numbers: give "
            f"every parameter a gradient on every rank (zero_grad(set_to_none=False) "
            f"keeps them as zeros)")


def agree_on_layout(index: int, group: dict, params: list, comm: Any) -> list[int]:
    """The group's layout, checked on every rank (one all-reduce of the masks): the ids
    of ``params``, this rank's parameters with a gradient, the same on every rank."""
    have = gradient_mask(group, params)                                    # (P,)
    dist.all_reduce(have, op=ReduceOp.AVG, group=comm)
    refuse_left_out(index, group, have)
    return [id(p) for p in params]


def with_gradient(group: dict) -> list:
    """The group's parameters that have a gradient, in its order (as ``Optimizer.step``
    hands them to ``_update_group``)."""
    return [p for p in group["params"] if p.grad is not None]


def changed_groups(param_groups: list[dict], laid_out: dict[int, list[int]]) -> list[int]:
    """The param groups whose parameters with a gradient on this rank are not those
    their layout holds (groups not laid out yet left out). No communication."""
    return [i for i, g in enumerate(param_groups)
            if i in laid_out and laid_out[i] != [id(p) for p in with_gradient(g)]]


def refuse_changed(param_groups: list[dict], laid_out: dict[int, list[int]],
                   comm: Any) -> NoReturn:
    """Raise on every rank (all of them call it, after a refused compressed all-reduce),
    naming each parameter whose gradient came or went and the ranks where: the ranks
    all-gather their masks of every group's parameters."""
    have = xp.concatenate([gradient_mask(g, with_gradient(g)).astype(xp.float64)
                           for g in param_groups])                         # (sum P,)
    masks = xp.empty(dist.get_world_size(comm) * have.size, dtype=have.dtype)
    dist.all_gather_into_tensor(masks, have, group=comm)                   # (N * sum P,)
    rows = backend.to_host(masks).reshape(-1, have.size).tolist()           # N x (sum P,)
    ranks = [r if comm is None else comm.ranks[r] for r in range(len(rows))]   # global
    changes, start = [], 0
    for index, group in enumerate(param_groups):
        size = len(group["params"])
        if index in laid_out:
            mine = {rank: row[start:start + size] for rank, row in zip(ranks, rows)}
            changes += _changes(index, group, set(laid_out[index]), mine)
        start += size
    raise ValueError(
        f"1-bit Adam: the error feedback of each param group is laid out over the flat "
        f"momentum of the parameters that had a gradient at its first compressed step, "
        f"and this step's gradients differ: {'; '.join(changes)}. Give the same "
        f"parameters a gradient at every step (zero_grad(set_to_none=False) keeps them "
        f"as zeros)")


def _changes(index: int, group: dict, laid_out: set[int], masks: dict[int, list]) -> list[str]:
    """What changed in one group against its layout; ``masks``: global rank -> its
    mask of the group's P parameters."""
    out = []
    for j, p in enumerate(group["params"]):
        was = id(p) in laid_out
        now = [r for r, mask in masks.items() if bool(mask[j]) != was]
        if now:
            what = "has no gradient" if was else "has a gradient"
            out.append(f"param group {index}, parameter {j} (shape {tuple(p.shape)}) "
                       f"{what} on rank(s) {now}")
    return out
