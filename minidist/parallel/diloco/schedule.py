"""When each fragment of Streaming DiLoCo synchronises, and the checks on H, F, tau, alpha.

With ``sync_every`` = H inner steps per round and F fragments (H a multiple of F),
fragment f (0-based, in the order given) starts its synchronisation after the inner
steps t (counted from 1) with

    t % H == ((f + 1) * H // F) % H          (the last fragment at t = H, 2H, ...)

so one fragment starts every H / F steps and each one every H steps. Its outer
gradient is taken from the parameters at step t; the outer step's result is merged
into the local parameters after inner step t + tau (tau = ``fragment_sync_delay``):

    theta_local <- alpha * theta_local + (1 - alpha) * theta_global

with alpha = ``fragment_update_alpha``. tau < H / F, so a fragment's result is merged
before the next fragment starts: at most one synchronisation is in flight. F = 1,
tau = 0, alpha = 0 is DiLoCo (Algorithm 1 of arXiv 2311.08105).

    >>> [fragment_starting_at(t, sync_every=4, num_fragments=2) for t in range(1, 9)]
    [None, 0, None, 1, None, 0, None, 1]
"""
from __future__ import annotations


def check_schedule(sync_every: int, num_fragments: int, fragment_sync_delay: int,
                   fragment_update_alpha: float) -> None:
    """Raise ValueError naming the fix for a schedule that cannot run."""
    H, F, tau = sync_every, num_fragments, fragment_sync_delay
    if not isinstance(H, int) or H < 1:
        raise ValueError(f"sync_every must be an int >= 1 (inner steps between "
                         f"synchronisations), got {H!r}")
    if F < 1:
        raise ValueError("fragments must hold at least one fragment")
    if H % F != 0:
        raise ValueError(f"sync_every = {H} is not a multiple of the {F} fragments: "
                         f"fragments start H / F steps apart; use sync_every = "
                         f"{max(F, H - H % F)} or {H + F - H % F}")
    if not isinstance(tau, int) or tau < 0:
        raise ValueError(f"fragment_sync_delay must be an int >= 0, got {tau!r}")
    if tau >= H // F:
        raise ValueError(f"fragment_sync_delay = {tau} must be < sync_every / fragments "
                         f"= {H // F} (a fragment's result is merged before the next "
                         f"fragment starts); lower it or raise sync_every")
    if not 0.0 <= fragment_update_alpha <= 1.0:
        raise ValueError(f"fragment_update_alpha must lie in [0, 1] (the weight of the "
                         f"local parameters in the merge), got {fragment_update_alpha!r}")


def start_offset(fragment: int, sync_every: int, num_fragments: int) -> int:
    """t % H at which ``fragment`` starts: ((f + 1) * H // F) % H."""
    return ((fragment + 1) * sync_every // num_fragments) % sync_every


def fragment_starting_at(step: int, sync_every: int, num_fragments: int) -> int | None:
    """The fragment whose synchronisation starts after inner step ``step`` (from 1)."""
    for f in range(num_fragments):
        if step % sync_every == start_offset(f, sync_every, num_fragments):
            return f
    return None
