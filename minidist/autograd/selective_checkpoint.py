"""Selective activation checkpointing: a policy over a block's ops says which to keep.

    y = checkpoint(block, x, policy=SavePolicy())          # activation_checkpoint.py

Full checkpointing keeps a block's input and recomputes everything in backward.
Selective checkpointing keeps, besides, the results of the ops a policy names
(torchtitan's ``op_sac_save_list``: the matrix products and attention, the ops
that cost FLOPs) and recomputes the rest (norms, activations, adds: cheap in
FLOPs, costly in bytes). In the checkpoint's forward each op the policy saves
leaves its output and what its backward needs (its ``Context``); in the
recompute that op is not run again: its output and context are handed back, in
the order the forward made them, and only the other ops run. The gradients are
those of no checkpointing, bit for bit (the same arrays, or the same ops on them).

Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
Models"), per layer, fp16 with one-byte dropout masks:

    none        s b h (34 + 5 a s / h)       selective   34 s b h      full   2 s b h

their selective recomputing only the attention scores (the a s^2 b terms), as a
policy that saves flash attention (which keeps no scores) does here.

The one hook: ``Function.apply`` asks ``replay`` before it runs an op and tells
``record`` after; both do nothing unless a selective checkpoint is running.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from minidist import backend

MATMULS = ("Linear", "MatMul")
# torchtitan's op_sac_save_list in minidist's op names: matrix products and attention
OP_SAC_SAVE_LIST = MATMULS + ("FlashAttention", "NaiveAttention")


@dataclass(frozen=True)
class SavePolicy:
    """Which ops' results a selective checkpoint keeps (the rest are recomputed)."""
    save: tuple[str, ...] = OP_SAC_SAVE_LIST   # op (Function class) names kept
    every_other_matmul: bool = False           # keep only the 1st, 3rd, ... matmul
                                               # (torchtitan's per-op "mm" policy)

    def check(self, known: set[str]) -> None:
        """Raise ValueError naming any op of ``save`` that no Function defines (the
        default list's names count as known: its attention ops are defined in
        minidist.attention, which may not be imported yet)."""
        unknown = sorted(set(self.save) - known - set(OP_SAC_SAVE_LIST))
        if unknown:
            raise ValueError(f"selective checkpointing: no op named {unknown}; ops are "
                             f"Function classes, e.g. {sorted(known)[:12]}...")


class _Session:
    """One selective checkpoint's kept ops: recorded in forward, replayed in backward."""

    def __init__(self, policy: SavePolicy, kept: list | None = None):
        self.policy = policy
        # (op name, Context, output, the default generator's state after the op), in order
        self.kept = [] if kept is None else kept
        self.replaying = kept is not None
        self.position = 0                             # next kept op to hand back
        self.matmuls = 0                              # matmuls seen so far

    def keeps(self, name: str) -> bool:
        """Whether the policy keeps this op (counting matmuls for every_other_matmul)."""
        if name not in self.policy.save:
            return False
        if self.policy.every_other_matmul and name in MATMULS:
            self.matmuls += 1
            return self.matmuls % 2 == 1
        return True


_local = threading.local()   # .active: this thread's _Session (DualPipeV runs a forward
                             # and another micro-batch's recompute on two threads, in turns)


def _active() -> _Session | None:
    return getattr(_local, "active", None)


def replay(name: str) -> tuple[Any, Any] | None:
    """In a recompute: the (Context, output) the forward kept for this op, or None
    (not recomputing selectively, or an op to run again)."""
    active = _active()
    if active is None or not active.replaying or not active.keeps(name):
        return None
    kept_name, ctx, out, random_state = active.kept[active.position]
    if kept_name != name:
        raise RuntimeError(f"selective checkpoint: the recompute ran {name} where the "
                           f"forward ran {kept_name}: the block must run the same ops")
    active.position += 1
    # a kept op that drew random numbers (a Dropout) is not run again: move the
    # generator on as it did, so the draws after it repeat the forward's
    backend.default_generator().set_state(random_state)
    return ctx, out


def record(name: str, ctx: Any, out: Any) -> None:
    """In a selective checkpoint's forward: keep this op's context and output if the
    policy saves it."""
    active = _active()
    if active is not None and not active.replaying and active.keeps(name):
        active.kept.append((name, ctx, out, backend.default_generator().get_state()))


class selective:
    """``with selective(policy[, kept]):`` the forward (records) or its recompute
    (replays ``kept``); nests, restoring the outer one on exit."""

    def __init__(self, policy: SavePolicy, kept: list | None = None):
        self.session = _Session(policy, kept)

    def __enter__(self) -> list:
        self.outer, _local.active = _active(), self.session
        return self.session.kept

    def __exit__(self, *exc: Any) -> None:
        _local.active = self.outer


def kept_arrays(kept: list) -> list:
    """Every array the kept ops hold (outputs and saved), to show in saved_bytes."""
    arrays = []
    for _, ctx, out, _ in kept:
        arrays.extend(out if isinstance(out, tuple) else (out,))
        arrays.extend(getattr(ctx, "saved", ()))
    return arrays


def policy_of(option: bool | str) -> SavePolicy | None:
    """The blocks' ``checkpoint`` option as a checkpoint policy: True or "full" ->
    None (full checkpointing), "selective" -> the default SavePolicy."""
    if option is True or option == "full":
        return None
    if option == "selective":
        return SavePolicy()
    raise ValueError(f"checkpoint is False, True / 'full' or 'selective', got {option!r}")
