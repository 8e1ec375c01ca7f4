"""The collectives, shaped like torch.distributed and built only from send/recv.

Each public function (1) resolves the group (``None`` = the world), (2) checks
that every rank made the same call (check.py; a small all-reduce does it in its
own messages, small.py), (3) runs its algorithm on the
group's point-to-point calls, counting the bytes it moved (``group.stats.last``),
and (4) runs now, or in the background when ``async_op=True`` (work.py).

Arrays are arrays of the active backend. In-place where torch's are in place:
``all_reduce(x)`` leaves the result in ``x``; ``broadcast(x, src)`` overwrites
``x`` on every rank but ``src``. ``src`` / ``dst`` are global ranks, as in torch.

    collective       algorithm            bytes sent per rank (M = array bytes)
    broadcast        binomial tree        <= ceil(log2 N) * M (the root)
    reduce           binomial tree        M (every rank but the root)
    all_reduce       by size (auto), or   ring, direct: 2(N-1)/N * M; allgather: (N-1) * M
                     the one named        (all_reduce.py has all seven)
    all_gather       ring                 (N-1) * M   (M = one rank's part)
    reduce_scatter   ring                 (N-1)/N * M (M = the whole input)
    gather, scatter  direct (linear)      the root receives / sends (N-1) * M
    all_to_all       pairwise exchange    (N-1)/N * M
    all_to_all_single single-copy reads   sum of the parts sent to others ((N-1)/N * M
                      (or pairwise)       when the splits are equal; alltoall.py)
    barrier          dissemination        ceil(log2 N) empty messages
"""
from __future__ import annotations

from functools import partial
from typing import Any

from minidist.backend import xp
from minidist.comm.collectives import alltoall_board, oneshot, twoshot, work
from minidist.comm.collectives.all_reduce import make_plan, runnable
from minidist.comm.collectives.all_reduce import run as run_all_reduce
from minidist.comm.collectives.alltoall import (check_splits, offsets, pairwise_all_to_all,
                                                alltoall_plan, single_copy_all_to_all, source_of,
                                                split_sizes, worth_single_copy)
from minidist.comm.collectives.call import _flat, _run, _same_as, _sig
from minidist.comm.collectives.check import keep_plan
from minidist.comm.group import ProcessGroup, resolve
from minidist.comm.transport.reduce_op import ReduceOp, finish
from minidist.comm.collectives.ring import chunk_bounds, ring_all_gather, ring_reduce_scatter
from minidist.comm.collectives.tree import binomial_broadcast, binomial_reduce


def broadcast(tensor: Any, src: int, group: ProcessGroup | None = None,
              async_op: bool = False):
    """Copy ``tensor`` of rank ``src`` into ``tensor`` on every rank (binomial tree)."""
    def body(g, tag):
        flat, write_back = _flat(tensor)
        binomial_broadcast(g, flat, g.group_rank(src), tag)
        write_back()
    return _run(group, "broadcast", dict(src=src, **_sig(tensor)), body, async_op)


def reduce(tensor: Any, dst: int, op: ReduceOp = ReduceOp.SUM,
           group: ProcessGroup | None = None, async_op: bool = False):
    """Reduce ``tensor`` of all ranks into ``tensor`` of rank ``dst`` (binomial tree).
    The arrays of the other ranks are left unchanged."""
    def body(g, tag):
        root = g.group_rank(dst)
        flat, write_back = _flat(tensor)
        if g.rank == root:
            binomial_reduce(g, flat, op, root, tag)
            finish(op, flat, g.size)
            write_back()
        else:
            binomial_reduce(g, flat.copy(), op, root, tag)
    return _run(group, "reduce", dict(dst=dst, op=op.name, **_sig(tensor)), body, async_op)


def all_reduce(tensor: Any, op: ReduceOp = ReduceOp.SUM, group: ProcessGroup | None = None,
               async_op: bool = False, algorithm: str = "auto"):
    """Reduce ``tensor`` in place across the group, the same bits on every rank,
    with the algorithm all_reduce.py names: the one asked for (ring, tree,
    recursive_doubling, naive, allgather, hierarchical, direct, twoshot) or, for ``auto``
    (the default), by size and world size (all_reduce.THRESHOLDS): at 2 ranks
    allgather while M <= 256 KiB, recursive doubling below 1 MiB, the ring from
    1 MiB; at 4 allgather while M <= 128 KiB, twoshot below 64 MiB and direct from
    64 MiB where the ranks can read each other's memory (the ring where they
    cannot, or have no board; an explicit ``direct`` or ``twoshot`` there raises,
    naming why). Its entry reduces a flat view of ``tensor`` after the
    same-call check, which allgather and direct carry in their own first messages.
    On one machine an allgather that fits a rank's slot on the board is one post
    and N-1 reads in place (oneshot.py), and ``twoshot`` reduces a chunk per rank
    and gathers the chunks through the board (twoshot.py); their plans are kept
    per (shape, dtype, op, algorithm), and the next such call goes straight to them.

    Runs now, or in the background with ``async_op=True`` (a ``Work`` to wait on)."""
    g = resolve(group)
    key = ("call", tensor.shape, tensor.dtype, op, algorithm)
    plan = g.small_plans.get(key)          # kept only for the board: the latency path
    if plan is None:
        name = runnable(algorithm, tensor.nbytes, g)
        plan = make_plan(g, name, tensor, op)  # allgather, direct: their check's table
        if not (oneshot.through_board(plan) or twoshot.through_board(plan)):
            return _planned_all_reduce(g, tensor, op, name, plan, async_op)
        keep_plan(g, key, plan)            # next time, straight here (oneshot.py)
    call = twoshot.call if twoshot.through_board(plan) else oneshot.call
    if async_op or not work.idle():
        return work.submit(partial(call, g, tensor, plan), async_op)
    return call(g, tensor, plan)


def _planned_all_reduce(g: ProcessGroup, tensor: Any, op: ReduceOp, name: str, plan: Any,
                        async_op: bool):
    """An all-reduce off the board: through the generic runner (call.py)."""
    if plan is None:
        return _run(g, "all_reduce", dict(op=op.name, algorithm=name, **_sig(tensor)),
                    _all_reduce, async_op, args=(tensor, op, name, None))
    return _run(g, "all_reduce", plan.fields, _all_reduce, async_op,
                args=(tensor, op, name, plan), checks_itself=True, line=plan.line)


def _all_reduce(g: ProcessGroup, tag: int, tensor: Any, op: ReduceOp, name: str,
                plan: Any) -> None:
    flat, write_back = _flat(tensor)
    run_all_reduce(g, flat, op, name, tag, plan)
    write_back()


def all_gather_into_tensor(output: Any, input: Any, group: ProcessGroup | None = None,
                           async_op: bool = False):
    """``output`` (N times the size of ``input``) gets every rank's ``input``, in rank order."""
    g = resolve(group)
    if output.size != g.size * input.size or output.dtype != input.dtype:
        raise ValueError(f"all_gather_into_tensor: output must hold {g.size} x {input.size} "
                         f"elements of {input.dtype}, got {output.size} of {output.dtype}")

    def body(g, tag):
        flat, write_back = _flat(output)
        bounds = chunk_bounds(flat.size, g.size)
        lo, hi = bounds[g.rank]
        flat[lo:hi] = input.reshape(-1)
        ring_all_gather(g, flat, bounds, tag)
        write_back()
    return _run(g, "all_gather", _sig(input), body, async_op)


def all_gather(tensor_list: list, tensor: Any, group: ProcessGroup | None = None,
               async_op: bool = False):
    """``tensor_list[i]`` gets rank i's ``tensor`` on every rank (ring)."""
    g = resolve(group)
    _same_as(tensor_list, tensor, "tensor_list", g.size)

    def body(g, tag):
        flat = xp.empty(g.size * tensor.size, dtype=tensor.dtype)
        bounds = chunk_bounds(flat.size, g.size)
        lo, hi = bounds[g.rank]
        flat[lo:hi] = tensor.reshape(-1)
        ring_all_gather(g, flat, bounds, tag)
        for out, (lo, hi) in zip(tensor_list, bounds):
            out[...] = flat[lo:hi].reshape(out.shape)
    return _run(g, "all_gather", _sig(tensor), body, async_op)


def reduce_scatter_tensor(output: Any, input: Any, op: ReduceOp = ReduceOp.SUM,
                          group: ProcessGroup | None = None, async_op: bool = False):
    """Reduce ``input`` (N times the size of ``output``) across ranks; rank r keeps
    part r of the result in ``output`` (ring). ``input`` is not modified."""
    g = resolve(group)
    if input.size != g.size * output.size or output.dtype != input.dtype:
        raise ValueError(f"reduce_scatter_tensor: input must hold {g.size} x {output.size} "
                         f"elements of {output.dtype}, got {input.size} of {input.dtype}")

    def body(g, tag):
        work_buf = input.reshape(-1).copy()
        bounds = chunk_bounds(work_buf.size, g.size)
        ring_reduce_scatter(g, work_buf, bounds, op, tag)
        lo, hi = bounds[g.rank]
        mine = work_buf[lo:hi]
        finish(op, mine, g.size)
        output[...] = mine.reshape(output.shape)
    return _run(g, "reduce_scatter", dict(op=op.name, **_sig(input)), body, async_op)


def reduce_scatter(output: Any, input_list: list, op: ReduceOp = ReduceOp.SUM,
                   group: ProcessGroup | None = None, async_op: bool = False):
    """Rank r gets op over all ranks of ``input_list[r]``, in ``output`` (ring)."""
    g = resolve(group)
    _same_as(input_list, output, "input_list", g.size)
    stacked = xp.concatenate([a.reshape(-1) for a in input_list])
    return reduce_scatter_tensor(output, stacked, op, g, async_op)


def gather(tensor: Any, gather_list: list | None = None, dst: int = 0,
           group: ProcessGroup | None = None, async_op: bool = False):
    """Rank ``dst`` gets every rank's ``tensor`` in ``gather_list`` (direct sends)."""
    g = resolve(group)
    root = g.group_rank(dst)
    if g.rank == root:
        _same_as(gather_list or [], tensor, "gather_list", g.size)

    def body(g, tag):
        if g.rank != root:
            g.wait([g.isend(tensor, root, tag)], "gather")
            return
        gather_list[root][...] = tensor
        g.wait([g.irecv(gather_list[i], i, tag) for i in range(g.size) if i != root], "gather")
    return _run(g, "gather", dict(dst=dst, **_sig(tensor)), body, async_op)


def scatter(tensor: Any, scatter_list: list | None = None, src: int = 0,
            group: ProcessGroup | None = None, async_op: bool = False):
    """Rank r gets ``scatter_list[r]`` of rank ``src`` in ``tensor`` (direct sends)."""
    g = resolve(group)
    root = g.group_rank(src)
    if g.rank == root:
        _same_as(scatter_list or [], tensor, "scatter_list", g.size)

    def body(g, tag):
        if g.rank != root:
            g.wait([g.irecv(tensor, root, tag)], "scatter")
            return
        g.wait([g.isend(scatter_list[i], i, tag) for i in range(g.size) if i != root], "scatter")
        tensor[...] = scatter_list[root]
    return _run(g, "scatter", dict(src=src, **_sig(tensor)), body, async_op)


def all_to_all(output_list: list, input_list: list, group: ProcessGroup | None = None,
               async_op: bool = False):
    """Rank r sends ``input_list[j]`` to rank j, which receives it in ``output_list[r]``.

    Pairwise exchange: in step s rank r sends to r+s and receives from r-s, so
    every pair meets exactly once and no rank is flooded by all others at once.
    Parts may differ in size between pairs; the dtype must be the same.
    """
    g = resolve(group)
    for what, lst in (("input_list", input_list), ("output_list", output_list)):
        if len(lst) != g.size:
            raise ValueError(f"all_to_all: {what} must hold {g.size} arrays, got {len(lst)}")

    def body(g, tag):
        n, r = g.size, g.rank
        output_list[r][...] = input_list[r]
        for s in range(1, n):
            g.sendrecv(input_list[(r + s) % n], (r + s) % n,
                       output_list[(r - s) % n], (r - s) % n, tag, what=f"all_to_all step {s}")
    return _run(g, "all_to_all", dict(dtype=input_list[0].dtype.name), body, async_op)


def all_to_all_single(output: Any, input: Any, output_split_sizes: list[int] | None = None,
                      input_split_sizes: list[int] | None = None,
                      group: ProcessGroup | None = None, async_op: bool = False):
    """Rank i sends rows ``input_split_sizes[j]`` of ``input`` (cut along axis 0, in
    order) to rank j, which stores them, in rank order, in ``output``.

    ``None`` splits mean N equal parts. What rank i sends to j
    (``input_split_sizes[j]`` on i) must be what j expects from i
    (``output_split_sizes[i]`` on j): otherwise every rank raises
    ``CollectiveMismatchError`` naming the pair, before any data moves.
    On one machine the split sizes, and inputs that fit, travel through the
    board in one post (alltoall_board.py), at 4 ranks inputs up to 4 MiB in
    rounds (alltoall_rounds.py), and larger parts are read straight from the
    peers' inputs (single copy); otherwise pairwise exchange (alltoall.py).
    """
    g = resolve(group)
    key = alltoall_board.call_key(input, output, input_split_sizes, output_split_sizes)
    sp = g.small_plans.get(key)       # a call like an earlier one: straight to the board
    if sp is None and alltoall_board.usable(g):  # one machine: splits, small inputs on the board
        _check_rows(input, output)
        sp = alltoall_board.split_plan(g, key, input, output, input_split_sizes,
                                       output_split_sizes)
    if sp is not None:
        if async_op or not work.idle():
            return work.submit(partial(alltoall_board.call, g, output, input, sp, source_of,
                                       _move_parts), async_op)
        return alltoall_board.call(g, output, input, sp, source_of, _move_parts)
    _check_rows(input, output)
    send = split_sizes(input_split_sizes, input.shape[0], g.size, "input")
    recv = split_sizes(output_split_sizes, output.shape[0], g.size, "output")
    row = 1
    for s in input.shape[1:]:
        row *= s
    plan = alltoall_plan(g, input.dtype, tuple(input.shape[1:]))

    def body(g, tag):
        flat_in = xp.ascontiguousarray(input).reshape(-1)
        flat_out, write_back = _flat(output)
        in_edges, out_edges = offsets(send), offsets(recv)
        matrix = sources = None
        if g.check and g.size > 1:
            matrix, sources = check_splits(g, plan, send, recv, tag,
                                           source_of(g, flat_in, flat_out))
        _move_parts(g, flat_in, in_edges, flat_out, out_edges, row, matrix, sources, tag,
                    plan.done)
        write_back()
    return _run(g, "all_to_all_single", plan.fields, body, async_op, checks_itself=True,
                line=plan.line)


def _check_rows(input: Any, output: Any) -> None:
    """all_to_all_single moves rows: one dtype, one row shape, at least one axis."""
    if input.dtype != output.dtype or tuple(input.shape[1:]) != tuple(output.shape[1:]):
        raise ValueError(f"all_to_all_single: input {tuple(input.shape)} {input.dtype} and "
                         f"output {tuple(output.shape)} {output.dtype} must have the same dtype "
                         f"and the same shape after the first axis")
    if input.ndim == 0:
        raise ValueError("all_to_all_single: input must have at least one axis to split")


def _move_parts(g, flat_in: Any, in_edges: list[int], flat_out: Any, out_edges: list[int],
                row: int, matrix: list | None, sources: list | None, tag: int,
                done: tuple | None) -> None:
    """Move the parts of an all-to-all whose splits ``matrix`` are agreed: read
    from the peers' inputs (``sources``) where worth it and possible, else the
    pairwise exchange (alltoall.py)."""
    if not (sources and worth_single_copy(matrix, row * flat_in.itemsize)
            and single_copy_all_to_all(g, flat_in, in_edges, flat_out, out_edges,
                                       row, matrix, sources, tag, done)):
        pairwise_all_to_all(g, flat_in, in_edges, flat_out, out_edges, row, tag)


def barrier(group: ProcessGroup | None = None, async_op: bool = False):
    """Return only once every rank of the group has entered the barrier.

    Dissemination: in round k rank r signals r + 2**k and waits for r - 2**k;
    after ceil(log2 N) rounds each rank has heard, directly or not, from all.
    """
    def body(g, tag):
        n, r = g.size, g.rank
        empty, sink = xp.empty(0, dtype="uint8"), xp.empty(0, dtype="uint8")
        d = 1
        while d < n:
            g.sendrecv(empty, (r + d) % n, sink, (r - d) % n, tag, what="barrier")
            d *= 2
    return _run(group, "barrier", {}, body, async_op)
