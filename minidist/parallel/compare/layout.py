"""A layout: how one training run is spread over ranks, in torchtitan's words.

    parse_layout("dp_replicate=2 tp=2")      # 4 ranks: 2 replicas of a 2-way TP model
    parse_layout("pp=2 schedule=gpipe mb=2") # a 2-stage pipeline, 2 micro-batches
    parse_layout("single")                   # one process, the plain model: the oracle
    parse_layout("tp=2 amp=bf16")            # matmuls rounded to bf16 (precision/autocast)

The degrees are torchtitan's ``ParallelDims`` (parallel/compose/parallel_dims.py): ``dp_replicate``
(DDP replicas), ``dp_shard`` (FSDP), ``cp`` (context), ``tp`` (Megatron tensor), ``pp``
(pipeline), ``ep`` (experts); ``dp`` is read as ``dp_replicate``. World size = the
product of dp_replicate, dp_shard, cp, tp and pp (ep borrows from dp_shard x cp). A
layout of dp_replicate, tp and pp alone runs on the 3D entry point
(parallel/three_d.py); any other on ``parallelize_llama`` / ``parallelize_gpt``
(parallel/compose/parallelize.py), of which the 3D entry point is the case cp = ep = 1 without
dp_shard. Every refusal is a ``LayoutError`` (the command's exit 2) that names the fix.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

DEGREES = ("dp_replicate", "dp_shard", "cp", "tp", "pp", "ep")   # torchtitan's ParallelDims
ALIASES = {"dp": "dp_replicate"}
SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb_v")
AMP = ("bf16", "fp16")
THREE_D = ("dp_replicate", "tp", "pp")        # what parallel/three_d.py composes


class LayoutError(ValueError):
    """A layout that cannot run; the message names the fix (the command exits 2)."""


@dataclass(frozen=True)
class Layout:
    dp_replicate: int = 1     # replicas, gradients averaged (DDP)
    dp_shard: int = 1         # FSDP shards of every parameter
    cp: int = 1               # context-parallel ranks cutting the sequence
    tp: int = 1               # Megatron tensor-parallel ranks
    pp: int = 1               # pipeline stages
    ep: int = 1               # expert-parallel ranks (borrowed from dp_shard x cp)
    schedule: str = "1f1b"    # the pipeline's schedule (pipeline/schedule.py)
    microbatches: int = 1     # micro-batches per step and data-parallel shard
    amp: str | None = None    # None: the model's dtype throughout; "bf16": matmuls rounded
    single: bool = False      # one process and the plain model, no parallel wrapper

    @property
    def world_size(self) -> int:
        return 1 if self.single else math.prod(
            getattr(self, d) for d in DEGREES if d != "ep")

    def __str__(self) -> str:
        if self.single:
            words = ["single"]
        else:
            words = [f"{d}={getattr(self, d)}" for d in DEGREES if getattr(self, d) > 1]
            words = words or ["dp_replicate=1"]
            if self.pp > 1:
                words += [f"schedule={self.schedule}", f"mb={self.microbatches}"]
        return " ".join(words + ([f"amp={self.amp}"] if self.amp else []))


def _value(key: str, text: str, word: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise LayoutError(f"{word!r}: {key} takes a whole number, e.g. {key}=2") from None
    if value < 1:
        raise LayoutError(f"{word!r}: {key} must be at least 1")
    return value


def parse_layout(text: str) -> Layout:
    """A Layout from words ``name=value`` (module docstring), or a LayoutError."""
    fields: dict = {}
    for word in text.split():
        if word == "single":
            fields["single"] = True
            continue
        key, eq, value = word.partition("=")
        key = ALIASES.get(key, key)
        if not eq:
            raise LayoutError(f"{word!r} in layout {text!r}: write name=value, e.g. tp=2, "
                              "or 'single'")
        if key in DEGREES or key in ("mb", "microbatches"):
            fields["microbatches" if key == "mb" else key] = _value(key, value, word)
        elif key == "schedule" and value in SCHEDULES:
            fields[key] = value
        elif key == "amp" and value in AMP:
            fields[key] = value
        else:
            raise LayoutError(f"unknown {word!r} in layout {text!r}: the dimensions are "
                              f"{', '.join(DEGREES)} (dp = dp_replicate); also schedule="
                              f"{'|'.join(SCHEDULES)}, mb=N, amp={'|'.join(AMP)}, single")
    layout = Layout(**fields)
    check_layout(layout, text)
    return layout


def check_layout(layout: Layout, text: str, world_size: int | None = None) -> None:
    """Refuse what cannot run, naming the fix (ParallelDims' rules)."""
    from minidist.parallel.compose.parallel_dims import ParallelDims, ParallelDimsError
    if layout.single and any(getattr(layout, d) > 1 for d in DEGREES):
        raise LayoutError(f"layout {text!r}: 'single' is one process; drop the degrees")
    try:
        ParallelDims(**{d: getattr(layout, d) for d in DEGREES})
    except ParallelDimsError as e:
        raise LayoutError(f"layout {text!r}: {e}") from None
    if world_size is not None and not layout.single and layout.world_size != world_size:
        product = " x ".join(f"{d}={getattr(layout, d)}" for d in DEGREES if d != "ep")
        raise LayoutError(f"layout {text!r}: {product} is {layout.world_size} ranks, not the "
                          f"world size {world_size}; make the degrees multiply to {world_size}")


def runs_on_three_d(layout: Layout) -> bool:
    """Whether the layout is one of the 3D entry point's (dp_replicate, tp, pp only)."""
    return all(getattr(layout, d) == 1 for d in DEGREES if d not in THREE_D)
