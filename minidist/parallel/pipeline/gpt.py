"""A GPT cut into pipeline pieces: embeddings + first blocks, ..., last blocks + head.

    piece 0       x = wte[idx] + wpe[pos];  blocks of range 0
    piece k       blocks of range k                           (B, T, C) in and out
    piece P-1     blocks of range P-1;  loss = CE(ln_f(x) W_head^T, targets)

P = p v pieces (stages x virtual stages), the blocks balanced by ``split_layers``.
Works on any model with the GPT's interface: ``blocks``, ``embed(idx)``,
``head(x, targets)`` and ``stage_ends()`` (the modules the first and the last piece
hold), and ``pooled_balance_coef`` if it holds MoE layers (nn/moe.py): the dense
``nn.GPT`` and ``nn.Llama``, and their tensor-parallel versions (whose ``embed``
and ``head`` communicate inside the tensor-parallel group: 3D parallelism).

A piece is a view on the model: it registers only the modules it uses, so
``piece.parameters()`` is what that rank trains. With ``config.checkpoint`` each
block is recomputed in its backward (activation checkpointing, as the whole model
does), so a stage keeps only its blocks' inputs for the micro-batches in flight. With tied embeddings
(``config.dims().tied``) the first and the last piece share W = wte = lm_head; when they
live on different ranks each holds its copy and gets half of the gradient
(the embedding's and the head's part), so ``sync_tied_gradients`` adds the two
(Megatron's embedding group), keeping the copies equal after every step.
A global gradient norm counts that matrix once, on the first stage
(``counted_parameters``; minidist.parallel.clip_grad_norm_).
"""
from __future__ import annotations

import weakref
from typing import Any, Sequence

import minidist.distributed as dist
from minidist.autograd.activation_checkpoint import checkpoint
from minidist.autograd.selective_checkpoint import policy_of
from minidist.autograd.tensor import Tensor
from minidist.backend import xp
from minidist.nn.module import Module, ModuleList
from minidist.nn.moe import adds_balancing_loss, routers
from minidist.parallel.pipeline.executor import split_layers

_TIED_TAG = (1 << 20) - 1
_stages: "weakref.WeakKeyDictionary[Module, int]" = weakref.WeakKeyDictionary()


class GPTPiece(Module):
    """Blocks ``layers`` of ``model``; with the embeddings if first, the head if last."""

    def __init__(self, model: Module, layers: range, first: bool, last: bool):
        super().__init__()
        refuse_balancing_losses(model)
        object.__setattr__(self, "model", model)      # not registered: only the parts below
        self.first, self.last, self.layers = first, last, layers
        embedding, head = model.stage_ends()               # {name: module} each
        for name, module in (embedding.items() if first else ()):
            setattr(self, name, module)
        self.blocks = ModuleList([model.blocks[i] for i in layers])
        for name, module in (head.items() if last else ()):
            setattr(self, name, module)

    def forward(self, x: Any, targets: Any = None) -> Tensor:
        if self.first:
            x = self.model.embed(x)                                    # (B, T, C)
        # config.checkpoint: each block recomputed in its backward, as in the whole model
        recompute = getattr(self.model.config, "checkpoint", False)    # True or "selective"
        recompute = recompute if self.model.training else False
        for block in self.blocks:
            x = checkpoint(block, x, policy=policy_of(recompute)) if recompute else block(x)
        if self.last:
            return self.model.head(x, targets)[1]                      # scalar loss
        return x


def refuse_balancing_losses(model: Module) -> None:
    """A piece passes on activations and the last returns the cross-entropy alone, so
    an MoE router's balancing loss (nn/router.py) would be left out of the objective
    without a word: such a model is refused. Loss-free balancing (DeepSeek-V3's bias)
    needs no loss and is kept."""
    if adds_balancing_loss(model):
        raise ValueError(
            "a pipeline trains on the cross-entropy alone, so the MoE balancing loss of "
            f"{len(routers(model))} layer(s) would be lost: turn it off "
            "(GPTConfig(moe_aux_coef=0, moe_z_coef=0), LlamaConfig(router_aux_loss_coef=0)) and balance with "
            "GPTConfig(moe_bias_rate=...) instead, or train without a pipeline")


def split_gpt(model: Module, stages: int, virtual: int = 1) -> list[GPTPiece]:
    """All p v pieces of ``model``, in model order (piece k = chunk k // p of rank k % p)."""
    n = stages * virtual
    ranges = split_layers(len(model.blocks), n)
    _stages[model] = stages
    return [GPTPiece(model, ranges[k], k == 0, k == n - 1) for k in range(n)]


def pipeline_stages(model: Module) -> int:
    """Over how many ranks a pipeline split ``model`` (1: not split). Every rank builds
    the whole model but trains only its stage's blocks, so a one-file checkpoint of it
    would hold stale copies of the others (checkpoint/pipeline.py saves it by stage)."""
    return _stages.get(model, 1)


def pieces_of_rank(pieces: Sequence[GPTPiece], rank: int, stages: int,
                   placement: str = "loop") -> list[GPTPiece]:
    """The chunks of pipeline rank ``rank``: pieces rank, rank + p, rank + 2p, ...;
    with placement "v" (zb_v), pieces rank and 2p - 1 - rank."""
    if placement == "v":
        return [pieces[rank], pieces[2 * stages - 1 - rank]]
    return list(pieces[rank::stages])


def pipeline_parameters(chunks: Sequence[Module]) -> list:
    """The parameters of a rank's chunks, each once (a tied matrix appears in two)."""
    seen, params = set(), []
    for chunk in chunks:
        for param in chunk.parameters():
            if id(param) not in seen:
                seen.add(id(param))
                params.append(param)
    return params


def counted_parameters(model: Module, chunks: Sequence[GPTPiece]) -> list:
    """This rank's parameters that a global gradient norm counts here: all of them,
    except the last stage's copy of the tied embedding, which the first stage counts
    (after ``sync_tied_gradients`` both copies hold the same gradient)."""
    params = pipeline_parameters(chunks)
    if model.config.dims().tied and not any(c.first for c in chunks):
        params = [q for q in params if q is not model.lm_head.weight]
    return params


def sync_tied_gradients(model: Module, chunks: Sequence[GPTPiece], group: Any = None) -> None:
    """Add the tied embedding's two gradient halves across the first and last stage.

    Only when the model ties wte and lm_head and the two pieces are on different
    ranks of the pipeline ``group``; the sum a + b on one side and b + a on the
    other is the same float, so the copies stay bitwise equal."""
    p = dist.get_world_size(group)
    if not model.config.dims().tied or p == 1:
        return
    has_first = any(c.first for c in chunks)
    has_last = any(c.last for c in chunks)
    if has_first == has_last:   # neither, or both on this rank (zb_v's V): nothing to add
        return
    peer = p - 1 if has_first else 0
    peer = peer if group is None else group.ranks[peer]
    weight = model.lm_head.weight                       # the embedding's matrix, tied
    theirs = xp.empty_like(weight.grad)
    send = dist.isend(xp.ascontiguousarray(weight.grad), peer, group, _TIED_TAG)
    dist.recv(theirs, peer, group, _TIED_TAG)
    send.wait()
    weight.grad = weight.grad + theirs
