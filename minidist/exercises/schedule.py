"""35.9 a 1F1B pipeline schedule, as data.

The learner returns, for each stage, the order of its forwards F(i) and
backwards B(i). Graded by the library's idealised machine
(minidist.parallel.pipeline.schedule.simulate): no deadlock, the 1F1B bubble,
and at most p - r micro-batches in flight on stage r.
"""
from __future__ import annotations

from hypothesis import strategies as st

from minidist.exercises.core import Exercise, Property


def _ops(subject, p, m):
    from minidist.parallel.pipeline.schedule import Op
    raw = subject.one_f_one_b(p, m)
    assert len(raw) == p, f"one_f_one_b({p}, {m}) has {len(raw)} stages, expected {p}"
    out = []
    for ops in raw:
        stage = []
        for op in ops:
            text = str(op)
            assert text[:1] in ("F", "B") and text[1:].isdigit(), \
                f"ops are strings 'F3' / 'B3', got {op!r}"
            stage.append(Op(text[0], int(text[1:])))
        out.append(stage)
    return out


def _each_once(subject, p, m):
    for r, ops in enumerate(_ops(subject, p, m)):
        names = [str(o) for o in ops]
        for i in range(m):
            assert names.count(f"F{i}") == 1 and names.count(f"B{i}") == 1, \
                f"p={p}, m={m}: stage {r} runs {names}; every F(i) and B(i) exactly once"
            assert names.index(f"F{i}") < names.index(f"B{i}"), \
                f"p={p}, m={m}: stage {r} runs B{i} before F{i}: {names}"


def _no_deadlock_and_1f1b_time(subject, p, m):
    from minidist.parallel.pipeline.schedule import simulate
    ops = _ops(subject, p, m)
    try:
        timings = simulate(ops)
    except RuntimeError as e:
        raise AssertionError(f"p={p}, m={m}: {e}") from None
    end = max(t[-1][2] for t in timings if t)
    want = 2 * (m + p - 1)     # (m + p - 1)(t_f + t_b) with t_f = t_b = 1
    assert end == want, f"p={p}, m={m}: the step takes {end} slots, 1F1B takes (m+p-1)(t_f+t_b) = {want}"


def _in_flight(subject, p, m):
    for r, ops in enumerate(_ops(subject, p, m)):
        live = peak = 0
        for op in ops:
            live += 1 if op.kind == "F" else -1
            peak = max(peak, live)
        assert peak <= min(p - r, m), \
            f"p={p}, m={m}: stage {r} holds {peak} micro-batches' activations at once; " \
            f"1F1B holds at most p - r = {p - r}: {[str(o) for o in ops]}"


sizes = dict(p=st.integers(1, 6), m=st.integers(1, 10))

SCHEDULE = Exercise(
    id="35.9", title="a 1F1B pipeline schedule as data", kind="implement",
    filename="ex_35_9_one_f_one_b.py",
    docs="docs/pipeline.md (schedules)",
    starter='''"""Exercise 35.9 (pipeline parallelism): the 1F1B schedule, as data.

A model cut into p stages trains on m micro-batches. Return, for each stage
r = 0 .. p-1, the order in which it runs its ops: "F3" is the forward of
micro-batch 3, "B3" its backward.

    stage r: p - r - 1 warm-up forwards (at most m), then alternate one
    forward, one backward, then the remaining backwards.

F(i) on stage r needs F(i) of stage r-1; B(i) on stage r needs B(i) of stage
r+1. With equal op costs a step then takes (m + p - 1)(t_f + t_b) and stage r
holds at most p - r micro-batches' activations (GPipe, all forwards first,
holds m).

Interface: plain Python. Check: `minidist exercise check 35.9`.
"""


def one_f_one_b(stages: int, microbatches: int) -> list[list[str]]:
    raise NotImplementedError
''',
    properties=[
        Property("every stage runs each F(i) and B(i) once, F before B", _each_once, sizes,
                 examples=25, hint="docs/pipeline.md"),
        Property("no deadlock, and the step takes (m + p - 1)(t_f + t_b)",
                 _no_deadlock_and_1f1b_time, sizes, examples=25,
                 hint="count the warm-up forwards of the last stage: it has none to wait for"),
        Property("at most p - r micro-batches in flight on stage r", _in_flight, sizes,
                 examples=25, hint="docs/pipeline.md: the warm-up is p - r - 1 forwards, not p - r"),
    ],
    solution='''from minidist.parallel.pipeline.schedule import one_f_one_b as library


def one_f_one_b(stages, microbatches):
    return [[str(op) for op in ops] for ops in library(stages, microbatches)]
''',
    wrong={
        "GPipe (all forwards first)": '''def one_f_one_b(stages, microbatches):
    fwd = [f"F{i}" for i in range(microbatches)]
    bwd = [f"B{i}" for i in range(microbatches)]
    return [fwd + bwd for _ in range(stages)]
''',
        "one warm-up forward too many": '''def one_f_one_b(stages, microbatches):
    out = []
    for r in range(stages):
        warm = min(stages - r, microbatches)
        ops = [f"F{i}" for i in range(warm)]
        f, b = warm, 0
        while f < microbatches:
            ops += [f"F{f}", f"B{b}"]
            f, b = f + 1, b + 1
        ops += [f"B{i}" for i in range(b, microbatches)]
        out.append(ops)
    return out
''',
    })

EXERCISES = [SCHEDULE]
