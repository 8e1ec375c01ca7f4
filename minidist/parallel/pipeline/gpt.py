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
from functools import partial
from typing import Any, Sequence

import minidist.distributed as dist
from minidist.autograd.tensor import Tensor
from minidist.backend import xp
from minidist.nn.module import Module, ModuleList
from minidist.nn.moe import (adds_balancing_loss, layer_mean_probs, pooled_balance_only,
                             routers, routing_mlp, run_block)
from minidist.parallel.pipeline.executor import split_layers

_TIED_TAG = (1 << 20) - 1
_stages: "weakref.WeakKeyDictionary[Module, int]" = weakref.WeakKeyDictionary()
# id(tied weight) -> (the weight held weakly, the .grad array its last sync left: held
# weakly where the array type allows, as numpy's and CuPy's do)
_synced: dict[int, tuple[weakref.ref, Any]] = {}


class GPTPiece(Module):
    """Blocks ``layers`` of ``model``; with the embeddings if first, the head if last."""

    def __init__(self, model: Module, layers: range, first: bool, last: bool, index: int = 0,
                 carry_balance: bool = False):
        super().__init__()
        if not (carry_balance and pooled_balance_only(model)):
            refuse_balancing_losses(model)
        object.__setattr__(self, "model", model)      # not registered: only the parts below
        self.first, self.last, self.layers, self.index = first, last, layers, index
        self.relay = None          # a BalanceRelay (balance.py) when the model balances by loss
        self.position_ids = None   # this rank's tokens' global positions (context parallel)
        embedding, head = model.stage_ends()               # {name: module} each
        for name, module in (embedding.items() if first else ()):
            setattr(self, name, module)
        self.blocks = ModuleList([model.blocks[i] for i in layers])
        for name, module in (head.items() if last else ()):
            setattr(self, name, module)

    def forward(self, x: Any, targets: Any = None) -> Tensor:
        if self.first:
            x = self.model.embed(x)                                    # (B, T, C)
        if self.relay is None and pooled_balance_only(self.model):
            raise ValueError("this piece was cut with carry_balance=True but has no relay: "
                             "set piece.relay = balance_relay(...) (pipeline/balance.py)")
        # config.checkpoint: each block recomputed in its backward, as in the whole model
        recompute = getattr(self.model.config, "checkpoint", False)    # True or "selective"
        recompute = recompute if self.model.training else False
        routings, probs = [], []        # this piece's routers' decisions and P (with graph)
        for block in self.blocks:
            run = block
            if self.position_ids is not None:       # a Llama layer: RoPE at these positions
                run = partial(block, position_ids=self.position_ids)
            moe = routing_mlp(block)
            x, p = run_block(run, moe, x, layer_mean_probs, recompute)
            if p is not None:
                routings.append(moe.last)
                probs.append(p)
        if self.last:
            loss = self.model.head(x, targets)[1]                      # scalar loss
            if self.relay is None:
                return loss
            return self.relay.loss(self.index, loss, routings, probs)
        return x if self.relay is None else self.relay.carry(self.index, x, routings, probs)


def refuse_balancing_losses(model: Module) -> None:
    """A piece passes on activations and the last returns the cross-entropy alone, so
    an MoE router's balancing loss (nn/router.py) would be left out of the objective
    without a word: such a model is refused. Loss-free balancing (DeepSeek-V3's bias)
    needs no loss and is kept."""
    if adds_balancing_loss(model):
        raise ValueError(
            "a pipeline trains on the cross-entropy alone, so the MoE balancing loss of "
            f"{len(routers(model))} layer(s) would be lost: turn it off (GPTConfig(moe_aux_coef=0, "
            "moe_z_coef=0), LlamaConfig(router_aux_loss_coef=0)) and balance with "
            "GPTConfig(moe_bias_rate=...) instead, or train without a pipeline; a Llama's "
            "pooled loss each stage can add its share of: split_gpt(..., carry_balance=True) "
            "with a BalanceRelay (pipeline/balance.py), as parallelize_llama does")


def split_gpt(model: Module, stages: int, virtual: int = 1,
              carry_balance: bool = False) -> list[GPTPiece]:
    """All p v pieces of ``model``, in model order (piece k = chunk k // p of rank k % p).
    ``carry_balance``: a Llama's pooled balancing loss is carried across the pieces
    (each then needs its ``relay``, pipeline/balance.py); otherwise a balancing loss
    is refused."""
    n = stages * virtual
    ranges = split_layers(len(model.blocks), n)
    _stages[model] = stages
    return [GPTPiece(model, ranges[k], k == 0, k == n - 1, k, carry_balance)
            for k in range(n)]


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
    other is the same float, so the copies stay bitwise equal.

    Once per optimizer step, after the last ``run_pipeline`` of a gradient
    accumulation: a second sync of the same gradient would add the other stage's
    half again (a + b + b'). So each sync notes the array it leaves in ``.grad``,
    and a sync that finds it there (not set to None by ``zero_grad()`` since) raises,
    on both stages, before exchanging anything."""
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
    _refuse_synced_twice(weight)
    theirs = xp.empty_like(weight.grad)
    send = dist.isend(xp.ascontiguousarray(weight.grad), peer, group, _TIED_TAG)
    dist.recv(theirs, peer, group, _TIED_TAG)
    send.wait()
    weight.grad = weight.grad + theirs
    key = id(weight)
    _synced[key] = (weakref.ref(weight, lambda _: _synced.pop(key, None)), _held(weight.grad))


def _held(array: Any) -> Any:
    """A callable giving ``array`` back: a weak reference, or a strong one where the
    array type takes no weak references."""
    try:
        return weakref.ref(array)
    except TypeError:
        return lambda: array


def _refuse_synced_twice(weight: Any) -> None:
    """Raise if ``weight.grad`` is still the array the last sync left (backward adds
    into it in place, so a gradient accumulated onto a synced one is that array)."""
    last = _synced.get(id(weight))
    if last is not None and last[0]() is weight and last[1]() is weight.grad:
        raise RuntimeError(
            "sync_tied_gradients: the tied embedding's gradient was synced already and not "
            "zeroed since; a second sync would add the other stage's half again. Sync once "
            "per optimizer step, after the last run_pipeline of a gradient accumulation, "
            "then step and zero_grad() (which sets the gradients to None)")
