"""35.17 the dynamic loss-scale step: unscale, skip on overflow, back off, grow.

A debug exercise: the starter looks right but tests only for NaN, so a step
whose gradients overflowed to inf is taken and the scale never backs off
(docs/precision.md, "loss scaling"). Graded against calc.dynamic_loss_scale
on runs of steps hypothesis draws, with gradients that overflow to inf, NaN,
or neither.
"""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from minidist import calc
from minidist.exercises.core import Exercise, Property

BAD = {"ok": 1.0, "inf": np.inf, "-inf": -np.inf, "nan": np.nan}
runs = st.lists(st.sampled_from(list(BAD)), min_size=1, max_size=12)


def _follow(subject, run, interval):
    from minidist.backend import from_host, to_host
    scale, tracker = 2.0 ** 10, 0
    for i, kind in enumerate(run):
        grads = [from_host(np.full(3, 2.0 * scale)),
                 from_host(np.array([BAD[kind] * scale, scale]))]
        out, new_scale, tracker = subject.scaler_step(grads, scale, tracker, interval)
        overflow = kind != "ok"
        if overflow:
            assert out is None, f"step {i} ({kind} in a gradient): the step must be skipped (return None)"
        else:
            assert out is not None, f"step {i}: finite gradients, but the step was skipped"
            got = [to_host(g).tolist() for g in out]
            assert got == [[2.0] * 3, [1.0, 1.0]], f"step {i}: unscaled gradients {got}, expected g / S"
        scale = new_scale
    return scale


def _matches_protocol(subject, run, interval):
    got = _follow(subject, run, interval)
    want = calc.dynamic_loss_scale([k != "ok" for k in run], 2.0 ** 10, interval)
    assert got == want, f"steps {run} with growth interval {interval}: scale {got}, expected {want}"


def _backs_off(subject, kind):
    got = _follow(subject, [kind], 5)
    assert got == 2.0 ** 9, f"one step with {kind} in a gradient: scale {got}, expected 2^10 / 2 = 512"


def _count_restarts(subject):
    got = _follow(subject, ["ok", "inf", "ok"], 2)
    assert got == 2.0 ** 9, f"steps ok, inf, ok with growth interval 2: scale {got}, expected " \
        "512 (the overflow restarts the count, so the last good step is the first of 2)"


LOSS_SCALE_STEP = Exercise(
    id="35.17", title="loss scaling: the scale that never backs off", kind="debug",
    filename="ex_35_17_loss_scaling.py",
    docs="docs/precision.md (dynamic loss scaling)",
    starter='''"""Exercise 35.17 (loss scaling): find the bug.

One step of dynamic loss scaling, as GradScaler.unscale_ / step / update do:

    grads were computed from loss * S, so divide them by S;
    if any gradient is not finite (inf or NaN): skip the step, S = S * 0.5,
        and the count of good steps restarts at 0;
    else: take the step; after growth_interval good steps in a row S = S * 2
        (and the count restarts).

A run with this version overflows again and again and the scale stays where
it was. Find out why, fix it, and run `minidist exercise check 35.17`.

Returns (unscaled grads or None if the step is skipped, new S, new count).
The gradients are arrays of minidist.backend.xp (NumPy, or CuPy on a GPU).
"""
from minidist.backend import xp


def scaler_step(grads, scale, good_steps, growth_interval=2000):
    unscaled = [g / scale for g in grads]
    found_inf = any(xp.isnan(g).any() for g in unscaled)
    if found_inf:
        return None, scale * 0.5, 0
    good_steps += 1
    if good_steps == growth_interval:
        return unscaled, scale * 2.0, 0
    return unscaled, scale, good_steps
''',
    properties=[
        Property("an overflow to inf, -inf or NaN skips the step and halves the scale", _backs_off,
                 dict(kind=st.sampled_from(["inf", "-inf", "nan"])), examples=10,
                 hint="docs/precision.md: which values count as an overflow? xp.isfinite"),
        Property("an overflow restarts the count of good steps", _count_restarts,
                 hint="what is the count after a skipped step?"),
        Property("the scale follows the protocol over any run of steps", _matches_protocol,
                 dict(run=runs, interval=st.integers(1, 4)), examples=40,
                 hint="docs/precision.md, 'Mixed precision': dynamic loss scaling, step by step"),
    ],
    solution='''from minidist.backend import xp

from minidist.precision.grad_scaler import GradScaler


def scaler_step(grads, scale, good_steps, growth_interval=2000):
    # the library's rule: GradScaler.update from the same state
    scaler = GradScaler(init_scale=scale, growth_interval=growth_interval)
    scaler._growth_tracker = good_steps
    unscaled = [g / scale for g in grads]
    found_inf = not all(xp.isfinite(g).all() for g in unscaled)
    scaler._per_optimizer[0] = {"found_inf": float(found_inf)}
    scaler.update()
    return (None if found_inf else unscaled), scaler.get_scale(), scaler._growth_tracker
''',
    wrong={
        "the planted bug": "",
        "count kept after an overflow": '''from minidist.backend import xp


def scaler_step(grads, scale, good_steps, growth_interval=2000):
    unscaled = [g / scale for g in grads]
    if not all(xp.isfinite(g).all() for g in unscaled):
        return None, scale * 0.5, good_steps
    good_steps += 1
    if good_steps == growth_interval:
        return unscaled, scale * 2.0, 0
    return unscaled, scale, good_steps
''',
    })

EXERCISES = [LOSS_SCALE_STEP]
