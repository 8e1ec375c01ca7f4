"""Exercises: the source documents' implementation exercises, graded by property tests.

Idea: a learner writes the function the documents ask for (ring all-reduce,
the online-softmax tile, a 1F1B schedule ...), or fixes a planted bug, in a
workspace file; ``minidist exercise check ID`` runs the project's property
checks against that file instead of the library ("one suite, two subjects")
and prints each property with a minimal counterexample and a hint. Derive
exercises take a number and compare it with ``minidist.calc``.

Files, in reading order:
    core.py          Exercise, Property, Subject (the code under test; worlds of ranks)
    grading.py       runs the properties with hypothesis; the report
    workspace.py     the learner's folder and progress file
    command.py       ``minidist exercise list | start | check``
    workbook.py      the workbook's Build / Debug calculators of chapters 0-4 (0.5, 0.6, 2.4, 4.5)
    workbook_5_8.py  ... and of chapters 5-8 (5.5, 7.5, 8.6)
    collectives.py   35.1 collectives from send/recv, 35.2 ring all-reduce (on real processes)
    swallow.py       35.1b the receive that swallows the next message (debug)
    ddp.py           35.4 DDP with bucket hooks, 35.6 accumulation with no_sync
    zero.py          35.12 ZeRO stage 1: the optimizer state in shards
    zero_clip.py     35.23 the ZeRO clip on a shard (debug)
    sampler.py       26.2 the sampler that forgets set_epoch (debug)
    schedule.py      35.9 a 1F1B schedule as data
    tensor_parallel.py 35.10 column- and row-parallel linear (Megatron's f and g)
    online_softmax.py 26.10 the online-softmax tile of flash attention
    rounding.py      35.18 bf16 and fp16 rounding, to the bit
    loss_scale.py    35.17 the loss scale that never backs off (debug)
    derive.py        the workbook's Derive exercises, graded against minidist.calc: chapters 0-4
    derive_5_9.py    ... chapters 5-9: pipelines, TP, checkpoints, precision, the 405B capstone

Docs: docs/exercises.md (course order). Tests: tests/exercises/.
"""
from __future__ import annotations

from minidist.exercises import (collectives, ddp, derive, derive_5_9, loss_scale, online_softmax,
                                 rounding, sampler, schedule, swallow, tensor_parallel, workbook,
                                 workbook_5_8, zero, zero_clip)
from minidist.exercises.core import Exercise, Property, Subject
from minidist.exercises.derive import Derive

# course order (docs/exercises.md)
EXERCISES: list[Exercise] = [
    *workbook.EXERCISES[:2],            # 0.5, 0.6: the ring's cost, before writing one
    *collectives.EXERCISES,             # 35.1, 35.2
    *swallow.EXERCISES,                 # 35.1b
    *sampler.EXERCISES,                 # 26.2
    *ddp.EXERCISES,                     # 35.4, 35.6
    *zero.EXERCISES,                    # 35.12
    *zero_clip.EXERCISES,               # 35.23
    *workbook.EXERCISES[2:4],           # 2.4, 4.5
    *tensor_parallel.EXERCISES,         # 35.10
    *schedule.EXERCISES,                # 35.9
    workbook_5_8.EXERCISES[0],          # 5.5
    *online_softmax.EXERCISES,          # 26.10
    *rounding.EXERCISES,                # 35.18
    workbook_5_8.EXERCISES[2],          # 8.6
    *loss_scale.EXERCISES,              # 35.17
    workbook_5_8.EXERCISES[1],          # 7.5
]

DERIVE: list[Derive] = [*derive.CHAPTERS_0_4, *derive_5_9.CHAPTERS_5_9]   # workbook order


def find(exercise_id: str):
    """The implement, debug or derive exercise numbered ``exercise_id``, or None."""
    for ex in [*EXERCISES, *DERIVE]:
        if ex.id == exercise_id:
            return ex
    return None


__all__ = ["EXERCISES", "DERIVE", "Derive", "Exercise", "Property", "Subject", "find"]
