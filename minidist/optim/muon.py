"""Muon: momentum, then the nearest semi-orthogonal matrix, one weight matrix at a time.

Keller Jordan, "Muon: An optimizer for hidden layers in neural networks" (2024);
Moonshot AI, "Muon is Scalable for LLM Training" (arXiv 2502.16982). For a weight
matrix W (A, B) with gradient G_t, momentum mu, learning rate eta, weight decay
lambda (``torch.optim.Muon``'s conventions exactly):

    M_t = lerp(M_{t-1}, G_t, 1 - mu)  = mu M_{t-1} + (1 - mu) G_t     (M_0 = 0)
    U_t = lerp(G_t, M_t, mu)          = (1 - mu) G_t + mu M_t          (nesterov)
          M_t                                                          (otherwise)
    O_t = NS_k(U_t)                     ~ U V^T where U_t = U S V^T   (below)
    W_t = (1 - eta lambda) W_{t-1} - eta' O_t                         (decoupled decay)
    eta' = eta sqrt(max(1, A / B))      (adjust_lr_fn None / "original": Keller's)
           eta 0.2 sqrt(max(A, B))      ("match_rms_adamw": Moonlight's, so that the
                                         update's RMS is AdamW's and its eta carries over)

The Newton-Schulz iteration NS_k (``newton_schulz``) maps the singular values of X
towards 1 without an SVD, using only matmuls. Transpose X to be wide (A <= B), scale
it to unit Frobenius norm (so every singular value is <= 1), and k times:

    G = X X^T                     (A, A)
    X <- a X + (b G + c G G) X    i.e. each singular value s -> a s + b s^3 + c s^5

The quintic's coefficients (3.4445, -4.775, 2.0315) are chosen to make the slope at
0 as steep as possible (a = 3.4445) so that five steps lift even tiny singular values
near 1; they do not converge to exactly 1 but oscillate in about [0.7, 1.2], which
trains as well as the exact U V^T. (a, b, c) = (1.875, -1.25, 0.375) is the classical
quintic that does converge.

Why the whole matrix: O_t depends on every entry of U_t (X X^T mixes all rows), so a
rank holding a piece of W cannot compute its piece of O_t alone, unlike SGD or AdamW.
distributed/muon.py brings the pieces together, two ways.

Precision: the iteration runs in the parameter's dtype by default (float64: exact
enough to compare at 1e-12). ``ns_dtype="bfloat16"`` does as ``torch.optim.Muon``,
which always iterates in bf16: every intermediate is rounded to bf16 (precision/
rounding.py), the matmuls accumulating in the storage dtype before rounding.

Matrices only: biases, norms' gains (1-D) and stacked experts (3-D) are refused;
embeddings and the output head are matrices but train better with AdamW (Moonlight,
torchtitan): ``muon_param_groups`` splits a model's parameters so. Demo:
demos/26_muon.py; docs: docs/optimizers.md.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable, NamedTuple

from minidist.autograd.pieces import piece_layout
from minidist.backend import xp
from minidist.optim.optimizer import Optimizer, check_non_negative
from minidist.precision import get_format, quantize

DEFAULT_COEFFICIENTS = (3.4445, -4.775, 2.0315)   # Keller Jordan's quintic (a, b, c)
MAX_NS_STEPS = 100                                # torch's bound: more is wasted compute
ADJUST_LR_FNS = (None, "original", "match_rms_adamw")
# names (a part of the dotted name) of matrices that belong to AdamW (muon_param_groups):
# the embeddings and the output head of minidist's GPT and Llama, torchtitan's and HF's
ADAMW_NAME_PARTS = ("wte", "wpe", "embed", "embed_tokens", "tok_embeddings", "embedding",
                    "embeddings", "lm_head", "output", "head")


class MatrixUpdate(NamedTuple):
    """One matrix (or one rank's piece of it) in a step, between the momentum and the
    iteration."""
    target: Any       # the array the step writes: the parameter (or a view of its piece)
    update: Any       # U_t, shaped like target
    shape: tuple      # the whole matrix's (A, B): the learning rate's adjustment uses it
    pieces: Any       # None for a whole matrix; how it is cut (distributed/muon.py)


def lerp_(start: Any, end: Any, weight: float) -> Any:
    """start <- start + weight (end - start), in place, in torch's two-sided form (from
    the nearer end, so weight 0 gives start and weight 1 gives end exactly)."""
    if abs(weight) < 0.5:
        start += weight * (end - start)
    else:
        start[...] = end - (end - start) * (1 - weight)
    return start


def _rounder(ns_dtype: str | None, dtype: Any) -> tuple[Any, Callable[[Any], Any]]:
    """(the storage dtype of the iteration, the rounding after each of its ops)."""
    if ns_dtype is None:
        return dtype, lambda a: a
    if ns_dtype in ("float32", "float64"):
        return xp.dtype(ns_dtype), lambda a: a
    return xp.dtype("float32"), lambda a: quantize(a, ns_dtype)   # emulated: bf16, fp16


def newton_schulz(update: Any, coefficients: tuple = DEFAULT_COEFFICIENTS, steps: int = 5,
                  eps: float = 1e-7, ns_dtype: str | None = None) -> Any:
    """NS_k(U): the quintic Newton-Schulz iteration on the matrix ``update`` (A, B)
    (module docstring); returns a new (A, B) array in the iteration's storage dtype."""
    if update.ndim != 2:
        raise ValueError(f"the Newton-Schulz iteration takes a matrix, got shape "
                         f"{tuple(update.shape)}")
    a, b, c = coefficients
    dtype, rnd = _rounder(ns_dtype, update.dtype)
    x = rnd(update.astype(dtype))                                        # (A, B)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T                                                          # (B, A): wide
    norm = rnd(xp.sqrt(xp.sum(x * x)).reshape(1).astype(dtype))         # (1,): ||X||_F
    x = rnd(x / xp.maximum(norm, dtype.type(eps)))                       # ||X||_F <= 1
    for _ in range(steps):
        gram = rnd(x @ x.T)                                              # (A, A)
        poly = rnd(b * gram + c * (gram @ gram))                         # b G + c G^2
        x = rnd(a * x + poly @ x)                                        # (A, B)
    return x.T if tall else x


def adjusted_lr(lr: float, adjust_lr_fn: str | None, shape: tuple) -> float:
    """eta' from eta and the whole matrix's shape (A, B) (module docstring)."""
    rows, cols = shape[0], shape[1]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        return lr * math.sqrt(max(1.0, rows / cols))
    if adjust_lr_fn == "match_rms_adamw":
        return lr * 0.2 * math.sqrt(max(rows, cols))
    raise ValueError(f"adjust_lr_fn must be one of {ADJUST_LR_FNS}, got {adjust_lr_fn!r}")


def muon_direction(grad: Any, buf: Any, *, momentum: float, nesterov: bool) -> Any:
    """Advance the momentum buffer in place; return U_t (a new array, or ``buf``).
    Elementwise: a piece of the matrix gives the same piece of U_t."""
    lerp_(buf, grad, 1 - momentum)                                       # M_t
    if nesterov:
        return lerp_(grad.copy(), buf, momentum)                         # (1-mu) G + mu M
    return buf


def apply_muon(param: Any, ortho: Any, *, lr: float, weight_decay: float,
               adjusted: float) -> None:
    """W <- (1 - eta lambda) W - eta' O, in place (``ortho`` may be a piece's rows)."""
    param *= 1 - lr * weight_decay
    param -= adjusted * ortho.astype(param.dtype)


def muon_update(param: Any, grad: Any, buf: Any, *, lr: float, weight_decay: float = 0.1,
                momentum: float = 0.95, nesterov: bool = True,
                ns_coefficients: tuple = DEFAULT_COEFFICIENTS, eps: float = 1e-7,
                ns_steps: int = 5, adjust_lr_fn: str | None = None,
                ns_dtype: str | None = None) -> None:
    """One Muon step on a whole matrix, in place (param and momentum buffer)."""
    update = muon_direction(grad, buf, momentum=momentum, nesterov=nesterov)
    ortho = newton_schulz(update, ns_coefficients, ns_steps, eps, ns_dtype)
    apply_muon(param, ortho, lr=lr, weight_decay=weight_decay,
               adjusted=adjusted_lr(lr, adjust_lr_fn, param.shape))


def check_muon_args(lr: float, momentum: float, weight_decay: float, ns_coefficients: tuple,
                    ns_steps: int, eps: float, adjust_lr_fn: str | None) -> None:
    check_non_negative(lr=lr, momentum=momentum, weight_decay=weight_decay, eps=eps)
    if len(tuple(ns_coefficients)) != 3:
        raise ValueError(f"ns_coefficients must be three numbers (a, b, c) of the quintic "
                         f"a s + b s^3 + c s^5, got {ns_coefficients!r}")
    if not 0 <= ns_steps < MAX_NS_STEPS:
        raise ValueError(f"ns_steps must be in [0, {MAX_NS_STEPS}), got {ns_steps} (five "
                         "steps already bring the singular values near 1)")
    if adjust_lr_fn not in ADJUST_LR_FNS:
        raise ValueError(f"adjust_lr_fn must be one of {ADJUST_LR_FNS}, got {adjust_lr_fn!r}")


def check_ns_dtype(ns_dtype: str | None) -> None:
    if ns_dtype not in (None, "float32", "float64"):
        get_format(ns_dtype)   # raises, listing the formats, for an unknown name


def refuse_non_matrix(shape: tuple, what: str = "a parameter") -> None:
    if len(shape) != 2:
        raise ValueError(f"Muon updates matrices only, but {what} has shape {tuple(shape)}: "
                         "give biases, norm gains, embeddings, the output head and stacked "
                         "(3-D) experts to AdamW in a second optimizer "
                         "(optim.muon_param_groups(model) splits them)")


class Muon(Optimizer):
    """Muon (rule in the module docstring); arguments and defaults as ``torch.optim.Muon``,
    plus ``ns_dtype`` (None: the parameter's dtype; "bfloat16": as torch computes).

    State per parameter: ``'momentum_buffer'`` (M, shaped like the parameter). The step
    runs in three phases over each group (momentum, orthogonalise, apply) so that a
    sharded subclass can bring the pieces together in between (``_orthogonalize``).
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, weight_decay: float = 0.1,
                 momentum: float = 0.95, nesterov: bool = True,
                 ns_coefficients: tuple = DEFAULT_COEFFICIENTS, eps: float = 1e-7,
                 ns_steps: int = 5, adjust_lr_fn: str | None = None,
                 ns_dtype: str | None = None):
        # add_param_group checks the hyperparameters of every group, these defaults too
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, momentum=momentum,
                                      nesterov=bool(nesterov),
                                      ns_coefficients=tuple(ns_coefficients), eps=eps,
                                      ns_steps=int(ns_steps), adjust_lr_fn=adjust_lr_fn,
                                      ns_dtype=ns_dtype))
        self.iterations_run = 0   # Newton-Schulz iterations this process has run

    def add_param_group(self, group: dict[str, Any]) -> None:
        super().add_param_group(group)
        added = self.param_groups[-1]
        check_muon_args(added["lr"], added["momentum"], added["weight_decay"],
                        added["ns_coefficients"], added["ns_steps"], added["eps"],
                        added["adjust_lr_fn"])
        check_ns_dtype(added["ns_dtype"])
        for p in added["params"]:
            self.check_matrices(p)

    def check_matrices(self, p: Any) -> None:
        """Raise unless parameter ``p`` holds matrices only (here: is one), each whole or
        a piece whose other pieces this optimizer brings together."""
        refuse_non_matrix(self.whole_shape(p))
        layout = piece_layout(p)
        if layout is not None and layout.tensor_groups and not self.knows_pieces(p):
            raise ValueError(
                f"Muon's Newton-Schulz iteration needs the whole matrix, but a parameter of "
                f"shape {tuple(p.shape)} is this rank's piece of a matrix cut over other "
                "ranks (fully_shard, parallelize_module or a tensor-parallel layer): "
                "iterating on the piece alone is not Muon's step. Use "
                "minidist.distributed.muon.ShardedMuon(params, fully_shard_pieces(model) or "
                "tensor_parallel_pieces(model)), or Zero1 / Zero2(model, Muon) on the whole "
                "model")

    def knows_pieces(self, p: Any) -> bool:
        """Whether the step brings the pieces of ``p`` together (here: never)."""
        return False

    def whole_shape(self, p: Any) -> tuple:
        """The shape of the matrix ``p`` is (a piece of): its own here."""
        return tuple(p.shape)

    def matrices(self, p: Any, update: Any) -> list[MatrixUpdate]:
        """The matrices parameter ``p`` holds, with their U_t: here p itself, whole."""
        return [MatrixUpdate(p.data, update, tuple(p.shape), None)]

    def _update_group(self, group: dict[str, Any], params: list) -> None:
        """The three phases over one group, inside the base class's ``step`` (so its step
        post-hooks, DiLoCo's outer sync among them, see the parameters updated)."""
        items = []
        for p in params:                                                     # phase 1
            items.extend(self.matrices(p, self._momentum(p, group, self.state.setdefault(p, {}))))
        orthos = self._orthogonalize(items, group)                           # phase 2
        for item, ortho in zip(items, orthos):                               # phase 3
            apply_muon(item.target, ortho, lr=group["lr"], weight_decay=group["weight_decay"],
                       adjusted=adjusted_lr(group["lr"], group["adjust_lr_fn"], item.shape))

    def _momentum(self, p, group, state) -> Any:
        """Phase 1, per parameter: the momentum, and U_t; the iteration waits for the group."""
        if not state:
            state["momentum_buffer"] = xp.zeros_like(p.data)
        return muon_direction(p.grad, state["momentum_buffer"], momentum=group["momentum"],
                              nesterov=group["nesterov"])

    def _orthogonalize(self, items: list[MatrixUpdate], group: dict) -> list:
        """Phase 2: O_t for each matrix of a group (here: each on its own, whole)."""
        self.iterations_run += len(items)
        return [newton_schulz(item.update, group["ns_coefficients"], group["ns_steps"],
                              group["eps"], group["ns_dtype"]) for item in items]


def muon_param_groups(model: Any, adamw_name_parts: tuple = ADAMW_NAME_PARTS
                      ) -> tuple[list, list]:
    """(Muon's parameters, AdamW's) of ``model``: the 2-D weights of the hidden layers go
    to Muon; everything else to AdamW: 1-D and 3-D parameters (biases, norm gains,
    stacked experts) and matrices whose dotted name has a part among
    ``adamw_name_parts`` (the embeddings and the output head, as Moonlight and
    torchtitan split them). A tied weight is listed once."""
    names = set(adamw_name_parts)
    muon, adamw, seen = [], [], set()
    for name, p in model.named_parameters():
        if id(p) in seen or not p.requires_grad:
            continue
        seen.add(id(p))
        special = any(part in names for part in name.split("."))
        (muon if p.ndim == 2 and not special else adamw).append(p)
    return muon, adamw
