"""Pipeline-aware checkpoints: each stage writes the part of the model it trains.

Under a pipeline every rank builds the whole model but trains only its stage's
blocks; the other blocks stay as they were initialised. One file written by rank 0
(single.py) would hold rank 0's stale copy of every other stage, so
``save_checkpoint`` refuses a model that a pipeline split (``pipeline_stages``), and
this module saves it instead:

    directory/pp{s}_tp{t}.ckpt    written by replica 0 of stage s, tensor rank t:
                                  {"model": name -> array (the parameters it trains and
                                   the persistent buffers of its blocks, the routers'
                                   expert_bias, named as in the whole model),
                                   "optimizer": its state,
                                   "layout": {"pp": p, "tp": T, "stage": s, "tensor": t}}

``load_pipeline`` gives every rank the parameters it holds from whichever files hold
them, so the same checkpoint loads at another pipeline degree (the names do not
depend on the cut); the tensor-parallel degree must be the same (each file holds its
tensor rank's slices). The optimizer's state follows its parameters only at the
pipeline degree it was saved at (it is kept per parameter position), and is left out
otherwise. Docs: docs/checkpoints.md.
"""
from __future__ import annotations

import glob
import os
from typing import Any

import minidist.distributed as dist
from minidist.checkpoint.io import CheckpointError, load_file, save_file


def _coords(three_d: Any) -> tuple[int, int, int, int, int]:
    """(pp, stage, tp, tensor rank, dp rank) of this rank in ``three_d``'s mesh."""
    return (dist.get_world_size(three_d.pp), dist.get_rank(three_d.pp),
            dist.get_world_size(three_d.tp), dist.get_rank(three_d.tp),
            dist.get_rank(three_d.dp))


def save_pipeline(directory: str, three_d: Any, optimizer: Any = None) -> None:
    """Write this stage's part of a ``ThreeDParallelGPT`` (module docstring); a collective:
    every rank calls it, the first data-parallel replica writes, all wait for it."""
    pp, stage, tp, tensor, replica = _coords(three_d)
    if replica == 0:
        os.makedirs(directory, exist_ok=True)
        state = dict(model={**{n: q.data for n, q in three_d.named_parameters().items()},
                            **three_d.named_buffers()},
                     optimizer=optimizer.state_dict() if optimizer is not None else None,
                     layout=dict(pp=pp, tp=tp, stage=stage, tensor=tensor))
        save_file(os.path.join(directory, f"pp{stage}_tp{tensor}.ckpt"), state)
    dist.barrier()


def load_pipeline(directory: str, three_d: Any, optimizer: Any = None) -> None:
    """Give every parameter of this rank of ``three_d`` its saved value (bit for bit),
    from the files of its tensor rank, at any pipeline degree; the optimizer's state
    too when the pipeline degree is the one saved."""
    pp, stage, tp, tensor, _ = _coords(three_d)
    paths = sorted(glob.glob(os.path.join(directory, f"pp*_tp{tensor}.ckpt")))
    if not paths:
        raise CheckpointError(f"{directory} holds no pipeline checkpoint for tensor rank "
                              f"{tensor} (files pp<stage>_tp<rank>.ckpt, save_pipeline)")
    saved, own = {}, None
    for path in paths:
        state = load_file(path)
        layout = state["layout"]
        if layout["tp"] != tp:
            raise CheckpointError(f"{path} was saved at tensor-parallel degree {layout['tp']}, "
                                  f"this model has {tp}: load it at the same degree")
        saved.update(state["model"])
        if layout["pp"] == pp and layout["stage"] == stage:
            own = state
    mine = {**{n: q.data for n, q in three_d.named_parameters().items()},
            **three_d.named_buffers()}
    missing = sorted(set(mine) - set(saved))
    if missing:
        raise CheckpointError(f"{directory} lacks {len(missing)} parameter(s) or buffer(s) "
                              f"this stage holds, e.g. {missing[0]!r}: some stage's file is "
                              f"missing, or it predates buffers")
    for name, array in mine.items():
        if tuple(saved[name].shape) != tuple(array.shape):
            raise CheckpointError(f"{name}: saved shape {tuple(saved[name].shape)}, "
                                  f"model shape {tuple(array.shape)}")
        array[...] = saved[name].astype(array.dtype)
    if optimizer is not None and own is not None and own["optimizer"] is not None:
        optimizer.load_state_dict(own["optimizer"])
