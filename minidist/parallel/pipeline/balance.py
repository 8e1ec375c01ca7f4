"""The MoE balancing loss across pipeline pieces: each piece adds its routers' terms.

A Llama's balancing loss pools every layer's routing (nn/router.py, Mixtral's):

    balance = E * sum_i F_i * (1/L) sum_l P_l,i      F = (sum_l counts_l) / (sum_l tokens_l)

F has no gradient, so the loss is a sum over layers once F is known:

    d balance / d P_l = (E / L) * F         for every layer l, on whichever piece holds it

but F needs every layer's counts, and a piece has only its own. Per micro-batch j:

    forward   piece k < P-1   sends [counts_k, tokens_k, sum_l P_k,l] (2E + 1 numbers) to the
                              last piece, and passes its output through ``CarryTerm``
              last piece      receives them all (their forwards came first), adds its own,
                              loss_j = CE_j + alpha * E * sum_i F_i (sum_l P_l,i) / L, and
                              sends F back to every other piece
    backward  piece k         ``CarryTerm`` receives F (sent at the last piece's forward,
                              which came before this backward) and hands
                              dL/dP_k,l = (alpha / m) (E / L) F to its routers' graph

Every send is non-blocking and every receive waits for a message its sender posted
earlier in the step's causal order (as the executor's own), so no new wait can
deadlock. Pieces on one rank (zb_v's first and last) hand the numbers over in memory.
The counts are those the routers already summed over the ranks sharing the batch
(data and context parallelism: distributed/_shared_tokens.py), so every F is the one
one process computes for micro-batch j; the shown loss (the last piece's) includes
every layer's term. A piece's forwards run in micro-batch order in every schedule,
so the k-th forward of a step is micro-batch k mod m.
"""
from __future__ import annotations

from typing import Any

import minidist.distributed as dist
from minidist import backend
from minidist.autograd.function import Function
from minidist.autograd.tensor import Tensor
from minidist.backend import xp
from minidist.nn.moe import pooled_balance_only, routers
from minidist.parallel.pipeline.op import rank_and_chunk

_BALANCE_TAG = 1 << 19   # + 2 (piece m + micro-batch) + {0: counts to the last, 1: F back}


class BalanceRelay:
    """One rank's side of the exchange above, for all its pieces."""

    def __init__(self, n_layers: int, n_expert: int, coef: float, pieces: int,
                 microbatches: int, group: Any = None, placement: str = "loop"):
        self.n_layers, self.n_expert, self.coef = n_layers, n_expert, coef
        self.pieces, self.m, self.group, self.placement = pieces, microbatches, group, placement
        self.p = dist.get_world_size(group)
        self.me = dist.get_rank(group)
        self.forwards: dict[int, int] = {}        # piece -> forwards this step
        self.mailbox: dict[tuple, Any] = {}       # (tag) -> array, between pieces of this rank
        self.sends: list = []

    def finish(self) -> None:
        """After a step: wait for its sends (each received within the step), count the
        forwards from 0 again."""
        for handle, _ in self.sends:
            handle.wait()
        self.sends, self.forwards, self.mailbox = [], {}, {}

    def microbatch(self, piece: int) -> int:
        """The micro-batch of ``piece``'s forward now starting."""
        n = self.forwards.get(piece, 0)
        self.forwards[piece] = n + 1
        return n % self.m

    def _rank_of(self, piece: int) -> int:
        return rank_and_chunk(piece, self.p, self.placement)[0]

    def _tag(self, piece: int, mb: int, kind: int) -> int:
        return _BALANCE_TAG + 2 * (piece * self.m + mb) + kind

    def _send(self, arr: Any, piece_to: int, tag: int) -> None:
        dst = self._rank_of(piece_to)
        if dst == self.me:
            self.mailbox[tag] = arr
            return
        peer = dst if self.group is None else self.group.ranks[dst]
        self.sends.append((dist.isend(arr, peer, self.group, tag), arr))

    def _recv(self, piece_from: int, size: int, tag: int) -> Any:
        src = self._rank_of(piece_from)
        if src == self.me:
            return self.mailbox.pop(tag)
        buf = xp.empty((size,), dtype="float64")
        dist.recv(buf, src if self.group is None else self.group.ranks[src], self.group, tag)
        return buf

    # -- a piece that is not the last --------------------------------------------
    def carry(self, piece: int, y: Tensor, routings: list, probs: list) -> Tensor:
        """Send this piece's counts and P sums to the last piece; ``y`` with the term's
        gradient attached (``CarryTerm``)."""
        mb = self.microbatch(piece)
        if not routings:                     # no router here: nothing to add (zeros)
            self._send(xp.zeros((2 * self.n_expert + 1,), dtype="float64"), self.pieces - 1,
                       self._tag(piece, mb, 0))
            return y
        counts, tokens, p_sum = _pooled(routings, probs)
        message = xp.concatenate([counts.astype("float64"), xp.asarray([tokens], "float64"),
                                  p_sum.data.astype("float64")])
        self._send(message, self.pieces - 1, self._tag(piece, mb, 0))
        return CarryTerm.apply(y, p_sum, relay=self, piece=piece, mb=mb)

    def slots_for(self, piece: int, mb: int, dtype: Any) -> Any:
        """(backward) F of micro-batch ``mb``, sent by the last piece."""
        return self._recv(self.pieces - 1, self.n_expert, self._tag(piece, mb, 1)).astype(dtype)

    # -- the last piece ----------------------------------------------------------------
    def loss(self, piece: int, ce: Tensor, routings: list, probs: list) -> Tensor:
        """CE + alpha * the pooled balancing loss of every layer of the model, the others'
        P as constants (their pieces add their gradients); sends F to the other pieces."""
        mb = self.microbatch(piece)
        E = self.n_expert
        counts, tokens, p_sum = _pooled(routings, probs)
        counts = counts.astype("float64")
        others = xp.zeros((E,), dtype="float64")
        routed = []                                     # the pieces that sent a term
        for k in range(self.pieces - 1):
            got = self._recv(k, 2 * E + 1, self._tag(k, mb, 0))
            counts, tokens = counts + got[:E], tokens + int(backend.to_host(got[E:E + 1])[0])
            others = others + got[E + 1:]
            if bool(backend.to_host(got[E:E + 1])[0] > 0):
                routed.append(k)
        dtype = ce.data.dtype
        slots = counts.astype(dtype) / tokens                            # (E,) F_i
        for k in routed:
            self._send(xp.ascontiguousarray(slots.astype("float64")), k, self._tag(k, mb, 1))
        mean_p = (p_sum + Tensor(others.astype(dtype))) / self.n_layers    # (E,)
        return ce + self.coef * ((Tensor(slots) * mean_p).sum() * E)


def _pooled(routings: list, probs: list) -> tuple[Any, int, Tensor]:
    """(counts summed over the layers (E,), their tokens, sum of the layers' P (E,))."""
    counts = sum(r.counts for r in routings)
    tokens = sum(r.tokens for r in routings)
    p_sum = probs[0]
    for p in probs[1:]:
        p_sum = p_sum + p
    return counts, int(tokens), p_sum


class CarryTerm(Function):
    """y -> y; backward: dy unchanged, and dP = (alpha / m) (E / L) F for the piece's sum
    of its layers' P (F received from the last piece)."""

    @staticmethod
    def forward(ctx, y, p_sum, relay=None, piece=0, mb=0):
        ctx.relay, ctx.piece, ctx.mb, ctx.dtype = relay, piece, mb, p_sum.dtype
        return y

    @staticmethod
    def backward(ctx, grad):
        relay = ctx.relay
        slots = relay.slots_for(ctx.piece, ctx.mb, ctx.dtype)            # (E,)
        scale = relay.coef / relay.m * relay.n_expert / relay.n_layers
        return grad, slots * scale


def balance_relay(model: Any, stages: int, virtual: int, microbatches: int, group: Any,
                  placement: str) -> BalanceRelay | None:
    """The relay for ``model`` (a Llama with a pooled balancing loss), else None."""
    if not pooled_balance_only(model):
        return None
    return BalanceRelay(len(model.blocks), routers(model)[0].n_expert,
                        model.pooled_balance_coef, stages * virtual, microbatches, group,
                        placement)
