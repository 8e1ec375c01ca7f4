"""Tensor-parallel styles: what a module's parameters, inputs and outputs are, as placements.

    ColwiseParallel     weight (out, in) Shard(0), bias Shard(0): each rank has out/t
                        outputs. Input Replicate -> output Shard(-1).
    FusedColwiseParallel  the same for each of the chunks of a fused weight (c_attn's
                        q, k, v): rank r keeps its heads' rows of each.
    RowwiseParallel     weight (out, in) Shard(1), bias Replicate: each rank sums over
                        in/t inputs. Input Shard(-1) -> output Partial -> Replicate.
                        Embedding: the table Shard(0) (vocab-parallel); ids Replicate ->
                        a lookup that is zero for others' ids, Partial -> Replicate.
    SequenceParallel    LayerNorm / Dropout on this rank's positions: input and output
                        Shard(1), parameters Replicate.
    PrepareModuleInput  turns the module's inputs from ``input_layouts`` into
                        ``desired_input_layouts``.

Megatron's f and g are not written here: they fall out of the placements. A
Colwise input is taken from its input layout to Replicate, and its gradient
comes back from the local matmul as Partial (each rank's dX = dY_r A_r^T is one
summand), so redistribute's backward all-reduces it: f. A Rowwise output is
Partial (each rank's X_r B_r) and goes to Replicate by an all-reduce: g. With
``input_layouts=Shard(1)`` / ``output_layouts=Shard(1)`` the same two become an
all-gather and a reduce-scatter: sequence parallelism.

The module's own forward runs on local tensors (its parameters hold this rank's
pieces as ordinary Parameters, so an optimizer sees nothing new); the styles
wrap it, converting its inputs and outputs through DTensors at the border.
``module._dtensor_placements[name]`` records each parameter's mesh, placements
and global shape (``parameter_as_dtensor`` gives the DTensor; parameters.py,
also for state dicts). Every style hands local tensors to the next module by
default (``use_local_output=True``), also SequenceParallel and
PrepareModuleInput, whose torch defaults hand on DTensors for ops minidist does
not propagate; ``PrepareModuleInput(use_local_output=False)`` hands a DTensor to a
module that gives it only to styled layers (Llama's attention and MLP).
"""
from __future__ import annotations

from typing import Any

from minidist.autograd.tensor import Tensor
from minidist.backend import xp
from minidist.nn import functional as F
from minidist.nn.layers import Embedding, Linear
from minidist.nn.module import Module, Parameter
from minidist.distributed.tensor._api import DTensor
from minidist.distributed.tensor.parallel.async_tp import fusable, gather_matmul, matmul_scatter
from minidist.distributed.tensor.parallel.parameters import (note_layout, parameter_as_dtensor,
                                                             replicated_parameter,
                                                             shard_parameter)
from minidist.distributed.tensor.placement_types import Partial, Placement, Replicate, Shard


def check_sequence_split(length: int, t: int) -> None:
    """Refuse to cut ``length`` positions over ``t`` ranks unevenly (sequence parallelism)."""
    if length % t:
        raise ValueError(f"sequence parallelism cuts the sequence into {t} equal pieces, one "
                         f"per tensor-parallel rank, but its length {length} is not a multiple "
                         f"of {t}: pad the sequences (or, in generate, the prompt) to a "
                         "multiple of the tensor-parallel size, or turn sequence parallelism off")


class ParallelStyle:
    """Base of the styles: ``_apply(module, mesh)`` shards and wraps ``module``."""

    def _apply(self, module: Module, device_mesh: Any) -> Module:
        raise NotImplementedError


# -- borders ---------------------------------------------------------------------

def _to_layout(x: Any, mesh: Any, given: Placement, wanted: Placement,
               grad: Placement | None = None, local: bool = True) -> Any:
    """A local tensor laid out as ``given`` (or a DTensor), as ``wanted``, back to local
    (``local=False``: the DTensor, whose users' gradients then add up before its backward
    moves them once)."""
    if not isinstance(x, (Tensor, DTensor)):
        return x                          # ids, masks: not moved
    if not isinstance(x, DTensor):
        x = DTensor.from_local(x, mesh, [given])
    y = x.redistribute(mesh, [wanted])
    if not local:
        return y
    return y.to_local(grad_placements=None if grad is None else [grad])


def _wrap_forward(module: Module, forward: Any) -> None:
    object.__setattr__(module, "forward", forward)


# -- the styles ----------------------------------------------------------------------

class ColwiseParallel(ParallelStyle):
    """Linear: weight and bias Shard(0) (Embedding: weight Shard(1)); input ``input_layouts``
    (Replicate) gathered to Replicate; output Shard(-1) redistributed to ``output_layouts``.
    With ``async_tp`` (set by parallelize_module) a Shard input's gather is fused with
    the matmul (async_tp.py)."""

    async_tp = False     # parallelize_module(..., async_tp=True) turns it on, in a copy

    def __init__(self, *, input_layouts: Placement | None = None,
                 output_layouts: Placement | None = None, use_local_output: bool = True):
        self.input_layout = input_layouts or Replicate()
        self.output_layout = output_layouts or Shard(-1)
        self.use_local_output = use_local_output

    def _shard_parameters(self, module: Module, device_mesh: Any) -> None:
        if isinstance(module, Linear):
            shard_parameter(module, "weight", device_mesh, Shard(0))
            shard_parameter(module, "bias", device_mesh, Shard(0))
        elif isinstance(module, Embedding):
            shard_parameter(module, "weight", device_mesh, Shard(1))
        else:
            raise ValueError(f"{type(self).__name__} shards Linear and Embedding, not "
                             f"{type(module).__name__}")

    def _apply(self, module: Module, device_mesh: Any) -> Module:
        self._shard_parameters(module, device_mesh)
        inner = module.forward
        embedding = isinstance(module, Embedding)

        def forward(x: Any) -> Any:
            if fusable(self.async_tp, module, self.input_layout):    # gather and matmul, a ring
                x = _to_layout(x, device_mesh, self.input_layout, self.input_layout)
                y = gather_matmul(module, x, self.input_layout, device_mesh)   # (B, T, out/t)
            else:
                if not embedding:   # the local matmul's dX is a summand: f all-reduces it
                    x = _to_layout(x, device_mesh, self.input_layout, Replicate(), Partial())
                y = inner(x)                                            # (..., out/t)
            out = DTensor.from_local(y, device_mesh, [Shard(y.ndim - 1)])
            out = out.redistribute(device_mesh, [self.output_layout])
            return out.to_local() if self.use_local_output else out
        _wrap_forward(module, forward)
        return module


class FusedColwiseParallel(ColwiseParallel):
    """A Linear whose output is ``chunks`` projections side by side (GPT's c_attn:
    [q | k | v], each C wide), each chunk cut as ColwiseParallel cuts a weight: rank r
    holds rows [r C/t, (r+1) C/t) of W_q, of W_k and of W_v, the q, k, v of its heads.
    The weight read as (chunks, C, in) is Shard(1), the bias (chunks, C) too. The output,
    (..., chunks C/t) = [q_r | k_r | v_r], goes on as a local tensor (no one placement of
    [q | k | v] describes it; the attention reads its head count off it)."""

    def __init__(self, chunks: int = 3, *, input_layouts: Placement | None = None,
                 use_local_output: bool = True):
        if chunks < 1:
            raise ValueError(f"FusedColwiseParallel: chunks must be at least 1, got {chunks}")
        if not use_local_output:
            raise ValueError("FusedColwiseParallel hands on local tensors: its output "
                             "[q_r | k_r | v_r] is no one placement of [q | k | v]")
        super().__init__(input_layouts=input_layouts)
        self.chunks = chunks

    def _shard_parameters(self, module: Module, device_mesh: Any) -> None:
        if not isinstance(module, Linear):
            raise ValueError(f"FusedColwiseParallel shards a Linear, not {type(module).__name__}")
        k, (out, fan_in) = self.chunks, module.weight.shape
        if out % k:
            raise ValueError(f"FusedColwiseParallel(chunks={k}): a weight of {out} outputs is "
                             f"not {k} equal chunks")
        shard_parameter(module, "weight", device_mesh, Shard(1), view=(k, out // k, fan_in))
        shard_parameter(module, "bias", device_mesh, Shard(1), view=(k, out // k))


class RowwiseParallel(ParallelStyle):
    """Linear: weight Shard(1), bias Replicate (added once, after the sum); input
    ``input_layouts`` (Shard(-1)); output Partial, redistributed to ``output_layouts``
    (Replicate: all-reduce; Shard(1): reduce-scatter; fused with the matmul under
    ``async_tp``, set by parallelize_module: async_tp.py)."""

    async_tp = False     # parallelize_module(..., async_tp=True) turns it on, in a copy

    def __init__(self, *, input_layouts: Placement | None = None,
                 output_layouts: Placement | None = None, use_local_output: bool = True):
        self.input_layout = input_layouts or Shard(-1)
        self.output_layout = output_layouts or Replicate()
        self.use_local_output = use_local_output

    def _apply(self, module: Module, device_mesh: Any) -> Module:
        if isinstance(module, Embedding):
            return self._apply_embedding(module, device_mesh)
        if not isinstance(module, Linear):
            raise ValueError(f"RowwiseParallel shards Linear and Embedding, not "
                             f"{type(module).__name__}")
        shard_parameter(module, "weight", device_mesh, Shard(1))
        if module.bias is not None:
            note_layout(module, "bias", device_mesh, (Replicate(),), tuple(module.bias.shape))

        def forward(x: Any) -> Any:
            x = _to_layout(x, device_mesh, self.input_layout, Shard(x.ndim - 1))
            y, shape = self._sum(module, x, device_mesh)
            # the bias is added once, after the sum; where each rank holds only its
            # positions (Shard), its gradient is a summand, all-reduced backward
            grad = Replicate() if self.output_layout.is_replicate() else Partial()
            bias = replicated_parameter(module, "bias", grad)
            y = y if bias is None else y + bias
            if self.use_local_output:
                return y
            return DTensor.from_local(y, device_mesh, [self.output_layout], shape=shape)
        _wrap_forward(module, forward)
        return module

    def _sum(self, module: Module, x: Any, device_mesh: Any) -> tuple[Any, tuple]:
        """The summed product in ``output_layouts``, local, and its global shape: g, or
        the matmul and reduce-scatter fused as a ring under async TP."""
        if fusable(self.async_tp, module, self.output_layout):
            y = matmul_scatter(module, x, self.output_layout, device_mesh)    # (B, T/t, out)
            shape = list(y.shape)
            shape[self.output_layout.dim % y.ndim] *= device_mesh.size()
            return y, tuple(shape)
        partial = F.linear(x, module.weight)                            # (..., out) summand
        out = DTensor.from_local(partial, device_mesh, [Partial()])
        out = out.redistribute(device_mesh, [self.output_layout])       # g
        return out.to_local(), out.shape


    def _apply_embedding(self, module: Embedding, device_mesh: Any) -> Module:
        """A vocab-sharded table (Shard(0)): each rank looks up the ids in its rows and
        gives zeros for the others, a Partial summand; the sum is the lookup."""
        shard_parameter(module, "weight", device_mesh, Shard(0))
        rows = module.weight.shape[0]
        first = device_mesh.get_local_rank() * rows                    # my rows' first id

        def forward(ids: Any) -> Any:
            mine = (ids >= first) & (ids < first + rows)
            local_ids = xp.where(mine, ids - first, 0)
            y = F.embedding(local_ids, module.weight)                  # (*ids.shape, dim)
            y = y * xp.expand_dims(mine, -1).astype(y.dtype)         # zeros for others' ids
            if isinstance(self.output_layout, Shard):   # sequence parallel: T cut evenly
                check_sequence_split(y.shape[self.output_layout.dim], device_mesh.size())
            out = DTensor.from_local(y, device_mesh, [Partial()])
            out = out.redistribute(device_mesh, [self.output_layout])  # all-reduce
            return out.to_local() if self.use_local_output else out
        _wrap_forward(module, forward)
        return module


class SequenceParallel(ParallelStyle):
    """LayerNorm, Dropout (any module of work per position) on this rank's positions:
    input Shard(``sequence_dim``), output the same; the parameters stay whole and their
    gradients, summands of every rank's positions, are all-reduced backward."""

    def __init__(self, *, sequence_dim: int = 1, use_local_output: bool = True):
        self.sequence_dim = sequence_dim
        self.use_local_output = use_local_output

    def _apply(self, module: Module, device_mesh: Any) -> Module:
        seq = Shard(self.sequence_dim)
        for name, param in module._parameters.items():
            if param is not None:
                note_layout(module, name, device_mesh, (Replicate(),), tuple(param.shape))
        inner = module.forward

        def forward(x: Any) -> Any:
            x = _to_layout(x, device_mesh, seq, seq)
            names = [n for n, p in module._parameters.items() if p is not None]
            for name in names:        # whole weights whose gradients are summands
                module.put_in_place(name, replicated_parameter(module, name, Partial()))
            try:
                y = inner(x)                                            # (B, T/t, C)
            finally:
                for name in names:
                    module.put_in_place(name, module._parameters[name])
            if self.use_local_output:
                return y
            return DTensor.from_local(y, device_mesh, [seq])
        _wrap_forward(module, forward)
        return module


class PrepareModuleInput(ParallelStyle):
    """Take the module's positional inputs from ``input_layouts`` to
    ``desired_input_layouts`` (one per input; None leaves an input alone).

    ``use_local_output=False`` hands the module DTensors, for modules whose only use of
    the input is styled layers (Llama's q/k/v_proj): each ColwiseParallel takes the
    Replicate DTensor as it is, their Partial gradients add up on it, and one
    collective brings the sum home (Megatron's one f for the three projections)."""

    def __init__(self, *, input_layouts: Any = None, desired_input_layouts: Any = None,
                 use_local_output: bool = True):
        self.input_layouts = _as_tuple(input_layouts)
        self.desired = _as_tuple(desired_input_layouts)
        if len(self.input_layouts) != len(self.desired):
            raise ValueError(f"PrepareModuleInput: {len(self.input_layouts)} input_layouts but "
                             f"{len(self.desired)} desired_input_layouts; give one of each per "
                             "input")
        self.use_local_output = use_local_output

    def _apply(self, module: Module, device_mesh: Any) -> Module:
        inner = module.forward

        def forward(*args: Any, **kwargs: Any) -> Any:
            args = list(args)
            for i, (given, wanted) in enumerate(zip(self.input_layouts, self.desired)):
                if given is not None and i < len(args):
                    args[i] = _to_layout(args[i], device_mesh, given, wanted,
                                         local=self.use_local_output)
            return inner(*args, **kwargs)
        _wrap_forward(module, forward)
        return module


def _as_tuple(layouts: Any) -> tuple:
    if layouts is None:
        return ()
    return tuple(layouts) if isinstance(layouts, (tuple, list)) else (layouts,)
