"""One-file checkpoints: model, optimizer, sampler and RNG state, written atomically.

For one process or plain DDP, where every rank holds the same model and
optimizer: rank 0 writes (``rank0_only``), every rank loads. What is saved is
what a resumed run needs to take exactly the steps the uninterrupted run would:

    model       state_dict (parameter name -> array)
    optimizer   state_dict (per-parameter buffers and step counts, hyperparameters)
    sampler     epoch, seed and position in the epoch's permutation
    rng         the default generator's state (dropout masks)
    extra       anything else (step number, loss-scale state...)
"""
from __future__ import annotations

from typing import Any

import minidist.distributed as dist
from minidist import backend
from minidist.checkpoint.io import CheckpointError, load_file, save_file
from minidist.parallel.pipeline.gpt import pipeline_stages


def save_checkpoint(path: str, model: Any, optimizer: Any = None, sampler: Any = None,
                    extra: dict | None = None, rank0_only: bool = True) -> None:
    """Write one checkpoint file (atomically). Under a process group, only rank 0
    writes when ``rank0_only``, and every rank waits until it has."""
    grouped = dist.is_initialized()
    stages = pipeline_stages(model)
    if stages > 1 and grouped:
        raise CheckpointError(
            f"this model is split over {stages} pipeline stages: each rank trains only its "
            "stage's blocks, so one file from rank 0 would hold stale copies of the others. "
            "Save it by stage with minidist.checkpoint.save_pipeline(directory, three_d, "
            "optimizer) (load_pipeline reads it back, at any pipeline degree)")
    if not (rank0_only and grouped and dist.get_rank() != 0):
        state = dict(model=dict(model.state_dict()),
                     optimizer=optimizer.state_dict() if optimizer is not None else None,
                     sampler=sampler.state_dict() if sampler is not None else None,
                     rng=backend.default_generator().get_state(), extra=extra or {})
        save_file(path, state)
    if grouped and rank0_only:
        dist.barrier()


def load_checkpoint(path: str, model: Any, optimizer: Any = None, sampler: Any = None,
                    restore_rng: bool = True) -> dict:
    """Restore what ``save_checkpoint`` wrote; returns its ``extra`` dict."""
    state = load_file(path)
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(f"{path} is not a minidist checkpoint (no 'model' entry)")
    try:
        model.load_state_dict(state["model"])
        if optimizer is not None:
            optimizer.load_state_dict(state["optimizer"])
    except (KeyError, ValueError, TypeError) as e:
        raise CheckpointError(f"checkpoint {path} does not fit this model / optimizer: "
                              f"{e}") from None
    if sampler is not None and state.get("sampler") is not None:
        sampler.load_state_dict(state["sampler"])
    if restore_rng:
        backend.default_generator().set_state(state["rng"])
    return state["extra"]
