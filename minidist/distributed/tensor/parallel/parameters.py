"""A parallelized module's parameters: this rank's pieces, described as DTensors.

A style cuts each parameter once, when it is applied: ``module.weight`` becomes the
Parameter of this rank's piece (rank 0's values, as torch's ``distribute_tensor``),
so the module's own forward and any optimizer see an ordinary, smaller Parameter
(with the parameter's ``requires_grad``: a frozen weight stays frozen).
``module._dtensor_placements[name] = (mesh, placements, global shape)`` says what the
piece is a piece of; ``parameter_as_dtensor`` gives the DTensor (its local tensor is
the Parameter, so gradients reach it).

A fused weight (GPT's c_attn: [W_q; W_k; W_v] stacked on the output dim, (3C, C))
is cut chunk by chunk: read as the stack (3, C, C) it is ``Shard(1)``, so each rank
holds the same rows of q, k and v, those of its heads. Its DTensor has that (3, C, C)
shape (torch writes the layout as ``_StridedShard(0, split_factor=3)`` on the
(3C, C) matrix); the Parameter stays (3C/t, C).

State dicts, as torch after ``parallelize_module``: ``model.state_dict()`` gives
each cut (or replicated) parameter as a DTensor over its mesh, which
``minidist.checkpoint.dtensor`` saves rank by rank and loads at another degree;
``model.load_state_dict`` takes DTensors (redistributed if laid out otherwise) or
whole arrays (each rank keeps its piece; a fused weight's whole (3C, C) array is
read as its stack). Two hooks on the module do it (``nn.Module``'s
``register_state_dict_post_hook`` / ``register_load_state_dict_pre_hook``).
``full_state_dict(model)`` gathers them whole, in the dense model's shapes.
"""
from __future__ import annotations

import math
from typing import Any

from minidist.autograd.tensor import Tensor
from minidist.backend import from_host, is_array
from minidist.nn.module import Module, Parameter
from minidist.distributed.tensor._api import DTensor, distribute_tensor
from minidist.distributed.tensor._piece_norm import note_piece
from minidist.distributed.tensor._redistribute import DTensorSpec, GradPlacements
from minidist.distributed.tensor.placement_types import Placement, Shard


def note_layout(module: Module, name: str, mesh: Any, placements: tuple,
                shape: tuple) -> None:
    """Record that ``module.<name>`` is this rank's piece of a ``shape`` tensor laid out
    as ``placements``; the first record installs the state-dict hooks."""
    layouts = module.__dict__.setdefault("_dtensor_placements", {})
    if not layouts:
        module.register_state_dict_post_hook(_dtensors_into_state_dict)
        module.register_load_state_dict_pre_hook(_pieces_from_state_dict)
    layouts[name] = (mesh, tuple(placements), tuple(shape))
    note_piece(getattr(module, name), mesh, placements)   # clip_grad_norm_ counts the whole


def shard_parameter(module: Module, name: str, mesh: Any, placement: Placement,
                    view: tuple | None = None) -> None:
    """Replace ``module.<name>`` by this rank's piece (rank 0's values, as torch) and note
    its layout. ``view``: cut the parameter read as this shape (a fused weight's stack),
    keeping the Parameter's own rank."""
    param = getattr(module, name)
    if param is None:
        return
    full = param.data if view is None else param.data.reshape(view)     # (3, C, in) when fused
    if isinstance(placement, Shard) and full.shape[placement.dim] % mesh.size() != 0:
        raise ValueError(f"{type(module).__name__}.{name} of shape {tuple(full.shape)} does not "
                         f"split into {mesh.size()} equal pieces along dim {placement.dim}")
    local = distribute_tensor(full, mesh, [placement]).to_local().data
    if view is not None:
        local = local.reshape((-1,) + tuple(param.shape[1:]))             # (3 out/t, in)
    setattr(module, name, Parameter(local.copy(), requires_grad=param.requires_grad))
    note_layout(module, name, mesh, (placement,), tuple(full.shape))


def parameter_as_dtensor(module: Module, name: str) -> DTensor:
    """The parameter ``name`` of a parallelized module as a DTensor on its mesh (its local
    tensor is the Parameter itself, so gradients reach the optimizer's tensor)."""
    mesh, placements, shape = module._dtensor_placements[name]
    param = getattr(module, name)
    spec = DTensorSpec(mesh, placements, shape)
    local = param if param.shape == spec.local_shape() else param.reshape(spec.local_shape())
    return DTensor(local, spec, GradPlacements(placements, fixed=True))


def _dtensors_into_state_dict(module: Module, state: dict, prefix: str) -> None:
    """State-dict post hook: each recorded parameter as a DTensor (detached; its local
    tensor shares the Parameter's memory, as torch's state dicts do)."""
    for name, (mesh, placements, shape) in module._dtensor_placements.items():
        key, param = prefix + name, module._parameters.get(name)
        if key not in state or param is None:
            continue                                   # a tied weight, named elsewhere
        spec = DTensorSpec(mesh, placements, shape)
        if math.prod(spec.local_shape()) != param.numel():
            continue                                   # cut again (fully_shard): its own dict
        local = Tensor(param.data.reshape(spec.local_shape()))
        state[key] = DTensor(local, spec, GradPlacements(placements, fixed=True))


def _pieces_from_state_dict(module: Module, state: dict, prefix: str) -> None:
    """Load pre hook: a DTensor or a whole array becomes this rank's piece."""
    for name, (mesh, placements, shape) in module._dtensor_placements.items():
        key, param = prefix + name, module._parameters.get(name)
        if key not in state or param is None:
            continue
        value = state[key]
        if isinstance(value, DTensor):
            if tuple(value.shape) != shape:
                raise ValueError(f"{key}: a DTensor of shape {tuple(value.shape)} in the state "
                                 f"dict, {shape} in the model")
            if value.placements != placements:
                value = value.redistribute(value.device_mesh, placements)
            piece = value.to_local().data
        else:
            value = value if is_array(value) else from_host(value)
            if len(shape) != param.ndim and math.prod(value.shape) == math.prod(shape):
                value = value.reshape(shape)           # a fused weight's (3C, C) as (3, C, C)
            if tuple(value.shape) != shape:
                continue                               # load_state_dict names the mismatch
            piece = distribute_tensor(value, mesh, placements, src_data_rank=None)
            piece = piece.to_local().data              # my cut, no communication
        state[key] = piece.reshape(param.shape)


def full_state_dict(module: Module) -> dict:
    """Every parameter whole, in the dense model's shapes (a fused weight's (3, C, C) stack
    back to (3C, C)), what the unparallelized model's ``load_state_dict`` takes: one
    process resumes a tensor-parallel run. A collective (an all-gather per cut
    parameter); torch's ``get_model_state_dict(..., full_state_dict=True)``."""
    params = dict(module.named_parameters())
    out = {}
    for name, value in module.state_dict().items():
        if isinstance(value, DTensor):
            whole = value.full_tensor().data                   # (3, C, C) when fused
            if whole.ndim > params[name].ndim:
                whole = whole.reshape((-1,) + tuple(whole.shape[2:]))   # (3C, C)
            value = whole
        out[name] = value
    return out


def replicated_parameter(module: Module, name: str, grad: Placement) -> Tensor | None:
    """A Replicate parameter for local use; its gradient is read as ``grad`` (Partial where
    each rank saw only its positions: then backward all-reduces it)."""
    param = getattr(module, name)          # what the forward sees (fully_shard: gathered)
    if param is None or grad.is_replicate():
        return param
    return parameter_as_dtensor(module, name).to_local(grad_placements=[grad])
