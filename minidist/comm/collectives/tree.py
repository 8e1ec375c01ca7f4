"""Binomial trees and recursive doubling: the log(N)-step algorithms.

Ranks are renumbered relative to the root, v = (r - root) mod N.

Binomial broadcast: in round k (mask = 2**k) every rank that already has the
data (v < mask) sends it to v + mask. After ceil(log2 N) rounds all have it.

Binomial reduce: the same tree walked upwards. A rank first folds in the
partial sums of its children v + 1, v + 2, v + 4, ... (while v has that bit
clear), then sends its partial sum to its parent v - mask. The order in which
values are added is fixed by the tree, so the result does not depend on timing.

    T_tree_bcast = ceil(log2 N) * (alpha + M / beta)

Recursive doubling all-reduce: in round k rank v exchanges its whole partial
result with v XOR 2**k and both combine the two halves in the same order (the
lower rank's value first), so both hold the same bits; after log2 N rounds all
ranks do. When N is not a power of two, the first 2*(N - p) ranks pair up
beforehand: each even one hands its value to the odd one above it and
waits for the final result, which that odd one sends back at the end.

    T_rd = log2(N) * (alpha + M / beta)    (latency-optimal for small M)
"""
from __future__ import annotations

from typing import Any

from minidist.backend import xp
from minidist.comm.transport.reduce_op import ReduceOp, combine_fn, finish


def binomial_broadcast(group, flat: Any, root: int, tag: int) -> None:
    """Copy ``flat`` from group rank ``root`` to every rank of the group."""
    n = group.size
    v = (group.rank - root) % n
    mask = 1
    while mask < n:  # receive once, from the parent: the rank that differs in our lowest set bit
        if v & mask:
            group.wait([group.irecv(flat, (v - mask + root) % n, tag)], "tree broadcast")
            break
        mask <<= 1
    mask >>= 1
    sends = []
    while mask > 0:  # then pass it on to our children, farthest first
        if v + mask < n:
            sends.append(group.isend(flat, (v + mask + root) % n, tag))
        mask >>= 1
    group.wait(sends, "tree broadcast")


def binomial_reduce(group, acc: Any, op: ReduceOp, root: int, tag: int) -> None:
    """Fold every rank's ``acc`` into the root's ``acc`` (others' acc become partial sums)."""
    n = group.size
    v = (group.rank - root) % n
    mask = 1
    while mask < n:
        if v & mask:
            group.wait([group.isend(acc, (v - mask + root) % n, tag)], "tree reduce")
            return
        if v + mask < n:
            group.wait([group.irecv(acc, (v + mask + root) % n, tag, op=op)], "tree reduce")
        mask <<= 1


def recursive_doubling_all_reduce(group, flat: Any, op: ReduceOp, tag: int) -> None:
    """All-reduce in ceil(log2 N) exchanges of the whole buffer (plus two when N is
    not a power of two). ``flat`` is reduced in place; AVG is finished here."""
    n, r = group.size, group.rank
    p = 1
    while p * 2 <= n:
        p *= 2
    extra = n - p  # ranks 0..2*extra-1 pair up so that p ranks remain
    if r < 2 * extra:
        if r % 2 == 0:  # hand our value to r+1, and later get the result back from it
            group.wait([group.isend(flat, r + 1, tag)], "recursive doubling (fold)")
            group.wait([group.irecv(flat, r + 1, tag)], "recursive doubling (unfold)")
            finish(op, flat, n)
            return
        # odd: fold in the even partner's value (the lower rank's value goes first)
        theirs = xp.empty_like(flat)
        group.wait([group.irecv(theirs, r - 1, tag)], "recursive doubling (fold)")
        combine_fn(op)(theirs, flat, out=flat)
        v = r // 2
    else:
        v = r - extra
    mask = 1
    while mask < p:
        pv = v ^ mask
        partner = pv * 2 + 1 if pv < extra else pv + extra
        _combine_in_order(group, flat, partner, op, tag, partner_is_lower=pv < v)
        mask <<= 1
    if r < 2 * extra:
        group.wait([group.isend(flat, r - 1, tag)], "recursive doubling (unfold)")
    finish(op, flat, n)


def _combine_in_order(group, flat: Any, partner: int, op: ReduceOp, tag: int,
                      partner_is_lower: bool) -> None:
    """Exchange ``flat`` with ``partner``; both compute op(lower's, higher's)."""
    theirs = xp.empty_like(flat)
    group.sendrecv(flat, partner, theirs, partner, tag, what="recursive doubling")
    fn = combine_fn(op)
    if partner_is_lower:
        fn(theirs, flat, out=flat)
    else:
        fn(flat, theirs, out=flat)
