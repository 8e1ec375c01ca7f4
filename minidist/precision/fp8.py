"""FP8 training: per-tensor scaled casts, E4M3 forward and E5M2 backward.

FP8 holds too small a range for raw activations and gradients (e4m3fn: max 448,
smallest subnormal 2^-9), so each tensor is multiplied by a *scale* before the
saturating cast and divided by it after:

    x_fp8 = quantize(x * s, fmt, saturate=True);   x ~= x_fp8 / s
    s     = fp8_max / amax / 2^margin              (amax = max |x| seen)

so that the largest magnitude lands just under the format's max. Forward
tensors (inputs and weights of each matmul) use E4M3 (more precision),
gradients E5M2 (more range): the "hybrid" recipe of FP8 training.

Delayed scaling (``DelayedScaling``): the scale used at step t comes from the
amax *history* of the previous steps (the last ``amax_history_len`` values,
their max or the most recent), so the cast needs no extra pass over x before it.
The amax of x is recorded as it is cast. If that amax is 0 or not finite the
old scale is kept. Current scaling (``CurrentScaling``): s from this tensor's
own amax, just in time (an extra reduction, no history).

Which tensor is which: each matmul-like call inside ``fp8_autocast`` is a
*site*, numbered in call order from the start of the block (a fixed network
calls them in the same order every step). A site keeps one scaling state per
input and one for the gradient of its output. The dequantized values are
float32 (x_fp8 * (1/s)); matmuls run on them in float32, their outputs and the
input gradients stay float32, as an FP8 GEMM's higher-precision output does.

    recipe = DelayedScaling(margin=0, amax_history_len=16)
    with fp8_autocast(recipe):
        _, loss = model(x, y)
    loss.backward()          # gradients cast to E5M2 with their own scales

Pieces (autograd/pieces.py). Per-tensor scaling means one amax per tensor. When a
site's weight is one rank's piece of a tensor cut over a group (a tensor-parallel
layer or plan), its other operands and its output gradient are cut over the same
group or replicated over it (column-parallel: x whole, W and dY sliced by output
feature; row-parallel: x and W sliced by input feature, dY whole). So every amax
the site takes is max-combined over the groups that cut its pieces
(``layout.combine_tensor``), and each rank casts with the whole tensors'
scale: bit for bit the scales, casts and results of one process with the same
recipe. Data parallelism (DDP, ``fully_shard``, ZeRO) is not a cut here: a site sees
the whole weight, and the activations' and gradients' amax is this rank's
micro-batch's, not the global batch's (torchao all-reduces it over the data-parallel
ranks for delayed scaling; Transformer Engine's ``fp8_group`` does the same). The
parameters still stay equal across replicas (their gradients are averaged), but
with several ranks the run is not one process's on the whole batch unless the
recipe's ``amax_reduce`` max-combines every amax over the data-parallel group. An
expert (expert parallelism) is a whole tensor on its rank, its rows brought from every
rank of its group by the all-to-all: its site takes its own amax, and ``amax_reduce``
passes it by (its holders hold other experts). Micro-batches run one after the other
(gradient accumulation, a pipeline's) each take their own amax: such a run equals one
process accumulating the same micro-batches, not one pass over the whole batch.

A forward recomputed in backward (checkpointing, ZeRO-3) replays: the policy's
snapshot (autocast.py) brings the site numbering back to where that forward
started and the casts use the sites' scales without recording their amax again,
so the history holds what the one forward recorded. A new step begun between the
forward and its recompute would change the scales it used: that is an error.
"""
from __future__ import annotations

import math
from functools import partial
from typing import Any, Callable

from minidist.backend import xp
from minidist.autograd.pieces import piece_kinds
from minidist.autograd.tensor import Tensor
from minidist.precision.autocast import Round, use_policy
from minidist.precision.formats import FloatFormat, get_format
from minidist.precision.rounding import quantize, quiet


class ScalingState:
    """One tensor's scale (float32) and amax history, for delayed or current scaling."""

    def __init__(self, fmt: FloatFormat, margin: int, history_len: int, algo: str,
                 delayed: bool):
        self.fmt, self.margin, self.algo, self.delayed = fmt, margin, algo, delayed
        self.scale = xp.ones((), dtype=xp.float32)
        self.amax_history = xp.zeros((history_len,), dtype=xp.float32)  # [0] = this step

    def _scale_from(self, amax: Any, old: Any) -> Any:
        """fp8_max / amax / 2^margin, or ``old`` where amax is 0 or not finite."""
        with quiet():
            new = (xp.float32(self.fmt.max) / amax / xp.float32(2.0 ** self.margin))
        keep = ~xp.isfinite(amax) | (amax <= 0) | ~xp.isfinite(new)
        return xp.where(keep, old, new).astype(xp.float32)

    def cast(self, x: Any, record: bool = True, whole: Callable[[Any], Any] | None = None) -> Any:
        """x rounded to fmt under this state's scale, returned dequantized (x's dtype).

        ``record=False`` (a recomputed forward): the same cast, leaving the state as it is.
        ``whole``: the whole tensor's amax from this rank's (a 0-d float32 array; module
        docstring), a collective when x is a piece.
        """
        amax = xp.max(xp.abs(x)).astype(xp.float32) if x.size else xp.zeros((), xp.float32)
        if whole is not None:
            amax = whole(amax)
        if self.delayed:
            if record:
                self.amax_history[0] = xp.maximum(self.amax_history[0], amax)
            scale = self.scale
        else:
            scale = self._scale_from(amax, xp.ones((), dtype=xp.float32))
            if record:
                self.scale = scale
        y = quantize(x * scale.astype(x.dtype), self.fmt, saturate=True)
        y *= (1 / scale).astype(x.dtype)
        return y

    def update(self) -> None:
        """New scale from the history, then open a fresh slot for the next step."""
        if not self.delayed:
            return
        h = self.amax_history
        amax = h.max() if self.algo == "max" else h[0]
        self.scale = self._scale_from(amax, self.scale)
        self.amax_history = xp.roll(h, 1)
        self.amax_history[0] = 0


class DelayedScaling:
    """FP8 recipe with scales from an amax history (see the module docstring).

    ``margin``: scale down by 2^margin for headroom; ``amax_history_len``: how
    many steps of amax to remember; ``amax_compute_algo``: "max" over the
    history or "most_recent"; ``fwd_format`` / ``bwd_format``: E4M3 / E5M2.
    """

    delayed = True

    def __init__(self, margin: int = 0, amax_history_len: int = 16,
                 amax_compute_algo: str = "max", fwd_format: FloatFormat | str = "e4m3fn",
                 bwd_format: FloatFormat | str = "e5m2",
                 amax_reduce: Callable[[Any], Any] | None = None):
        if amax_compute_algo not in ("max", "most_recent"):
            raise ValueError(f"amax_compute_algo must be 'max' or 'most_recent', "
                             f"got {amax_compute_algo!r}")
        if amax_history_len < 1:
            raise ValueError(f"amax_history_len must be >= 1, got {amax_history_len}")
        self.margin, self.history_len, self.algo = margin, amax_history_len, amax_compute_algo
        self.fwd_format, self.bwd_format = get_format(fwd_format), get_format(bwd_format)
        self.amax_reduce = amax_reduce           # every amax combined over ranks, or None
        self.sites: list[dict[str, Any]] = []   # per site: {"inputs": [...], "grad": state}
        self._next = 0
        self._steps = 0                          # begin_step calls: which scales are in use
        self._replays: list[int] = []            # site counters to restore, one per replay

    def _state(self, fmt: FloatFormat) -> ScalingState:
        return ScalingState(fmt, self.margin, self.history_len, self.algo, self.delayed)

    def begin_step(self) -> None:
        """Called on entering ``fp8_autocast``: update every scale, restart site numbering."""
        for site in self.sites:
            for state in site["inputs"] + [site["grad"]]:
                state.update()
        self._next = 0
        self._steps += 1

    def replay_mark(self) -> tuple[int, int]:
        """Where a forward starts (step, site): taken when a recomputable forward runs."""
        return self._steps, self._next

    def begin_replay(self, mark: tuple[int, int]) -> None:
        """Recompute the forward begun at ``mark``: the same sites, no amax recorded."""
        step, site = mark
        if step != self._steps:
            raise RuntimeError("fp8: a forward is recomputed in backward (checkpoint, ZeRO-3) "
                               "after a new fp8_autocast step changed the scales it used; run "
                               "each forward's backward before entering fp8_autocast again")
        self._replays.append(self._next)
        self._next = site

    def end_replay(self) -> None:
        """Back to the site numbering the recompute interrupted."""
        self._next = self._replays.pop()

    def run(self, fn: Callable, args: tuple) -> Tensor:
        """The autocast policy: E4M3 casts of the inputs, an E5M2 cast of dL/d(output)."""
        n = sum(isinstance(a, Tensor) for a in args)
        if self._next == len(self.sites):
            self.sites.append({"inputs": [self._state(self.fwd_format) for _ in range(n)],
                               "grad": self._state(self.bwd_format)})
        site = self.sites[self._next]
        if len(site["inputs"]) != n:
            raise RuntimeError(f"fp8 site {self._next} had {len(site['inputs'])} tensor inputs "
                               f"and now has {n}: the network must call its matmuls in the "
                               "same order every step")
        self._next += 1
        states = iter(site["inputs"])
        record = not self._replays            # a recompute records no amax a second time
        whole = partial(self._whole_amax, [a for a in args if isinstance(a, Tensor)])
        low = [Round.apply(a, fwd=partial(next(states).cast, record=record, whole=whole))
               if isinstance(a, Tensor) else a for a in args]
        return Round.apply(fn(*low), bwd=partial(site["grad"].cast, whole=whole))

    def _whole_amax(self, operands: list, amax: Any) -> Any:
        """The amax of a site's cast over the whole tensor: max-combined over the groups
        that cut its pieces (module docstring), then by ``amax_reduce`` if given, except
        at an expert's site (module docstring). A max of float32 values is one of them:
        exact."""
        layouts = [layout for layout, _ in piece_kinds(operands)[1]]
        for layout in layouts:
            amax = xp.asarray(layout.combine_tensor(float(amax), math.inf), dtype=xp.float32)
        if self.amax_reduce is not None and not any(layout.spread for layout in layouts):
            amax = self.amax_reduce(amax)
        return amax

    def scales(self) -> list[float]:
        """Every scale, site by site (inputs then gradient): for printing and tests."""
        return [float(s.scale) for site in self.sites for s in site["inputs"] + [site["grad"]]]


class CurrentScaling(DelayedScaling):
    """FP8 recipe with just-in-time scales: s = fp8_max / max|x| / 2^margin of x itself."""

    delayed = False

    def __init__(self, margin: int = 0, fwd_format: FloatFormat | str = "e4m3fn",
                 bwd_format: FloatFormat | str = "e5m2",
                 amax_reduce: Callable[[Any], Any] | None = None):
        super().__init__(margin, 1, "most_recent", fwd_format, bwd_format, amax_reduce)


class fp8_autocast(use_policy):
    """``with fp8_autocast(recipe):`` runs matmul-like ops with FP8 casts (see above)."""

    def __init__(self, recipe: DelayedScaling, enabled: bool = True):
        super().__init__(recipe if enabled else None)

    def __enter__(self) -> Any:
        if self.policy is not None:
            self.policy.begin_step()
        return super().__enter__()
