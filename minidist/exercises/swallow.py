"""35.1b the receive that swallows the next message (debug), on real processes.

Messages between a pair of ranks with the same tag are matched in the order
they were sent (minidist/comm/transport/base.py, as in MPI): a receive takes
the *next* message from that rank, whatever it was meant for. The planted bug
is a learner-level sum of gradients to rank 0 in which a rank that did not
use a parameter (an expert no token went to) skips its send "to save a
message", while rank 0 posts one receive per parameter per rank. Rank 0's
receive then takes the sender's next message, of the same shape: the next
parameter's gradient, or the next call's. The transport cannot see it (a
message of another size would raise ``MessageMismatchError``); only the
numbers are wrong, and the last receive of the run waits for ever.
"""
from __future__ import annotations

from hypothesis import strategies as st

from minidist.exercises.core import Exercise, Property


def _grads(rank: int, count: int, length: int, call: int, unused: set) -> list:
    """Rank ``rank``'s gradients in call ``call``: parameter i holds 100*call + 10*rank + i + 1."""
    from minidist.backend import xp
    return [None if (rank, i) in unused else xp.full(length, 100.0 * call + 10 * rank + i + 1)
            for i in range(count)]


def drive_calls(module, count, length, unused_pairs):
    """In rank r: two calls of ``sum_to_root``, the first with some parameters unused,
    the second with all of them; rank 0 checks each call's sums as it gets them."""
    from minidist.backend import to_host
    from minidist.comm import get_rank, get_world_size
    r, n = get_rank(), get_world_size()
    for call, unused in enumerate([set(map(tuple, unused_pairs)), set()], 1):
        out = module.sum_to_root(_grads(r, count, length, call, unused), (length,))
        if r != 0:
            continue
        assert out is not None and len(out) == count, \
            f"call {call}: rank 0 got {out!r}; return one sum per parameter on rank 0"
        for i, got in enumerate(out):
            want = sum(100.0 * call + 10 * s + i + 1 for s in range(n) if (s, i) not in unused)
            parts = " + ".join(f"{100 * call + 10 * s + i + 1}" for s in range(n)
                               if (s, i) not in unused) or "0"
            got = to_host(got).tolist()
            assert got == [want] * length, \
                f"call {call}, parameter {i}: rank 0's sum is {got[0]:g}, the ranks that used " \
                f"it sent {parts} = {want:g} (unused: {sorted(unused)}){_whose(got[0] - want)}"
    return None


def _whose(extra: float) -> str:
    """Name the message a wrong sum took or missed, when one explains it."""
    for call in (1, 2):
        for s in range(4):
            for i in range(3):
                value = 100 * call + 10 * s + i + 1
                if abs(extra) == value:
                    what = "holds" if extra > 0 else "misses"
                    return (f"; it {what} {value}: rank {s}'s gradient of parameter {i} "
                            f"in call {call}")
    return ""


usage = dict(world=st.integers(2, 4), count=st.integers(1, 3), length=st.integers(1, 2),
             unused=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2)), max_size=4))


def _sums_with_unused(s, world, count, length, unused):
    pairs = sorted({(r, i) for r, i in unused if r < world and i < count})
    s.run(world, drive_calls, count, length, pairs)


def _sums_all_used(s, world, count):
    s.run(world, drive_calls, count, 1, [])


STARTER = '''"""Exercise 35.1b (the receive that swallows the next message): find the bug.

Sum every rank's gradients on rank 0, parameter by parameter, with send and
recv. A rank that did not use a parameter in this step (an expert that no
token was routed to) has no gradient for it: None, which counts as zeros.

    rank 0 returns [sum over ranks of grads[i] for each parameter i]
    every other rank returns None

It gives the right sums when every rank used every parameter. When some rank
did not, rank 0's sums are wrong, and a later call waits for ever. Find out
why (docs/collectives.md; minidist/comm/transport/base.py says how a receive
picks its message), fix it, and run `minidist exercise check 35.1b`.

Interface: minidist.comm get_rank(), get_world_size(), send(array, dst),
recv(array, src) (fills an array of the sender's shape and dtype).
"""
from minidist.backend import xp
from minidist.comm import get_rank, get_world_size, recv, send


def sum_to_root(grads, shape):
    """grads: this rank's gradients (arrays of `shape`, or None if unused)."""
    if get_rank() != 0:
        for g in grads:
            if g is None:
                continue                # nothing to add: save a message
            send(g, 0)
        return None
    sums = [xp.zeros(shape) if g is None else g.copy() for g in grads]
    for src in range(1, get_world_size()):
        for i in range(len(grads)):
            incoming = xp.empty(shape)
            recv(incoming, src)
            sums[i] += incoming
    return sums
'''

# the fix (every rank sends one message per parameter), to show that the starter
# is right everywhere else (tests/exercises)
FIXED = STARTER.replace('''            if g is None:
                continue                # nothing to add: save a message
            send(g, 0)''', '''            send(xp.zeros(shape) if g is None else g, 0)''')

SWALLOW = Exercise(
    id="35.1b", processes=True, title="the receive that swallows the next message", kind="debug",
    filename="ex_35_1b_swallowed_message.py",
    docs="docs/collectives.md; minidist/comm/transport/base.py (how a receive is matched)",
    starter=STARTER, fixed=FIXED,
    properties=[
        Property("every rank used every parameter: rank 0 holds the sums", _sums_all_used,
                 dict(world=st.integers(2, 4), count=st.integers(1, 3)), examples=3,
                 hint="docs/collectives.md: one receive per message sent"),
        Property("some parameters unused: rank 0 holds the sums, call after call",
                 _sums_with_unused, usage, examples=10,
                 explicit=[dict(world=2, count=2, length=1, unused=[(1, 0)]),
                           dict(world=2, count=1, length=1, unused=[(0, 0)])],
                 hint="minidist/comm/transport/base.py: a receive takes the next message from "
                      "that rank with that tag, whatever it was meant for; do both sides agree "
                      "on how many messages a call sends?"),
    ],
    solution='''from minidist.backend import xp
from minidist.comm import get_rank, reduce


def sum_to_root(grads, shape):
    sums = [xp.zeros(shape) if g is None else g.copy() for g in grads]
    for s in sums:
        reduce(s, dst=0)                # the library's reduce: every rank takes part
    return sums if get_rank() == 0 else None
''',
    wrong={
        "the planted bug": "",
        "rank 0 skips where its own gradient is None": FIXED.replace(
            '''        for i in range(len(grads)):
            incoming''', '''        for i in range(len(grads)):
            if grads[i] is None:
                continue                # rank 0 did not use it either
            incoming'''),
    })

EXERCISES = [SWALLOW]
