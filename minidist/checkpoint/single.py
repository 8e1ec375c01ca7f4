"""One-file checkpoints: model, optimizer, sampler and RNG state, written atomically.

For one process or plain DDP, where every rank holds the same model and
optimizer: rank 0 writes (``rank0_only``), every rank loads. What is saved is
what a resumed run needs to take exactly the steps the uninterrupted run would:

    model       state_dict (parameter name -> array)
    optimizer   state_dict (per-parameter buffers and step counts, hyperparameters)
    sampler     epoch, seed and position in the epoch's permutation
    rng         the default generator's state (dropout masks)
    extra       anything else (step number, loss-scale state...)

A model whose parameters are pieces cut over ranks (fully_shard, parallelize_module)
is refused where rank 0 writes for all: checkpoint/dtensor.py saves each rank's pieces.
"""
from __future__ import annotations

from typing import Any

import minidist.distributed as dist
from minidist import backend
from minidist.autograd.pieces import piece_layout
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
    if rank0_only and grouped and dist.get_world_size() > 1:
        _refuse_pieces(model)
    if not (rank0_only and grouped and dist.get_rank() != 0):
        state = dict(model=dict(model.state_dict()),
                     optimizer=optimizer.state_dict() if optimizer is not None else None,
                     sampler=sampler.state_dict() if sampler is not None else None,
                     rng=backend.default_generator().get_state(), extra=extra or {})
        save_file(path, state)
    if grouped and rank0_only:
        dist.barrier()


def _refuse_pieces(model: Any) -> None:
    """Raise if a parameter is this rank's piece of a tensor cut over ranks (fully_shard,
    parallelize_module, the tensor- and expert-parallel layers): rank 0's file would hold
    only rank 0's pieces, which every rank would then load as its own."""
    cut = [name for name, p in model.named_parameters() if piece_layout(p) is not None]
    if cut:
        raise CheckpointError(
            f"save_checkpoint writes rank 0's model for every rank, but {cut[0]!r} (and "
            f"{len(cut) - 1} more) is a piece of a tensor cut over ranks: each rank would "
            "load rank 0's pieces. Save every rank's pieces with minidist.checkpoint.dtensor."
            "save_dtensors(path, sharded_state_dict(model)) (fully_shard) or "
            "save_dtensors(path, model.state_dict()) (parallelize_module), or pass "
            "rank0_only=False with a path per rank")


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
