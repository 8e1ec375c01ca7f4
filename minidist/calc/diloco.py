"""Bytes and step time when the network is the bottleneck: DDP, DiLoCo, Streaming
DiLoCo, quantised outer gradients, Top-K and 1-bit Adam.

With M the model's bytes (float32: 4 bytes per parameter), N replicas on a ring of
bandwidth beta, c the compute time of one step, H = sync_every, F fragments,
tau the fragment delay and b the bits per outer-gradient number:

    DDP          every step   2(N-1)/N * M                       exposed: all of it
    DiLoCo       every H-th   2(N-1)/N * M                       mean per step: 1/H of DDP's
    Streaming    every H/F-th 2(N-1)/N * M / F (one fragment)    peak per step: 1/F of DiLoCo's
                 exposed per sync: max(0, wire(M/F) - tau * c)   (tau inner steps hide it)
    quantised    an all-gather of the b-bit codes: (N-1) * M / F * b / 32
                 (= Streaming's bytes x b / 32 x N / 2: the codes are gathered, not added)
    Top-K        every step   (N-1) * k * (8 + s)                k = density * n, s = 4
    1-bit Adam   every step   ~2(N-1)/N * M / 32                 after the warm-up: one
                 compressed all-reduce of the flat momentum (onebit_adam.py), an
                 all-to-all and three all-gathers, 4(N-1) messages: 4(N-1) * alpha

Step time (mean over a round): c + exposed wire seconds / steps between syncs, with
wire(X) = X / beta + 2(N-1) * alpha for an all-reduce (calc/comm.py) and
(N-1) * X / beta + (N-1) * alpha for an all-gather. A synchronisation's own copies
(the CPU seconds it spends writing and adding its bytes, part of c) run while its bytes
are on the wire, as a NIC reads memory while it sends (comm/transport/link.py), so a
sync that is not delayed exposes

    exposed = max(0, wire - copies)                      (copies = 0: all of the wire)

Pure functions; docs/diloco.md.

    >>> d = diloco_costs(1e9, 2, sync_every=10, fragments=2, bits=4, compute=0.1,
    ...                  bandwidth=1e9)
    >>> [round(c.bytes_per_step / 1e9, 3) for c in d]      # GB per rank per step
    [1.0, 0.1, 0.1, 0.013, 0.03, 0.031]
"""
from __future__ import annotations

from typing import NamedTuple

from minidist.calc.comm import ring_all_reduce_bytes, ring_all_reduce_time


class StrategyCost(NamedTuple):
    """What one strategy costs per rank (SI units)."""
    name: str
    bytes_per_sync: float          # bytes one rank sends in one synchronisation
    steps_per_sync: float          # inner steps between synchronisations (1: every step)
    bytes_per_step: float          # mean bytes per rank per step: bytes_per_sync / steps
    peak_bytes_per_step: float     # the most one step sends (bytes_per_sync)
    exposed_seconds: float         # wire time per sync not hidden behind compute
    step_seconds: float            # compute + exposed / steps_per_sync


def _cost(name: str, per_sync: float, steps: float, exposed: float,
          compute: float) -> StrategyCost:
    return StrategyCost(name, per_sync, steps, per_sync / steps, per_sync, exposed,
                        compute + exposed / steps)


def diloco_costs(model_bytes: float, ranks: int, sync_every: int, fragments: int, bits: int,
                 compute: float, bandwidth: float, latency: float = 0.0, delay: int = 1,
                 density: float = 0.01, value_bytes: int = 4, index_bytes: int = 8,
                 copies: float = 0.0) -> list[StrategyCost]:
    """DDP, DiLoCo, Streaming, Streaming quantised, Top-K and 1-bit Adam (module
    docstring). ``copies``: CPU seconds of one sync's copies, hidden under its wire."""
    if sync_every % fragments:
        raise ValueError(f"sync_every {sync_every} must be a multiple of fragments {fragments}")
    N, M, H, F = ranks, model_bytes, sync_every, fragments
    full = ring_all_reduce_time(M, N, bandwidth, latency)
    part = ring_all_reduce_time(M / F, N, bandwidth, latency)
    codes = M / F * bits / 32                              # one replica's wire
    quant = (N - 1) * codes / bandwidth + (N - 1) * latency  # an all-gather of it
    k = max(1.0, density * M / value_bytes)
    topk_bytes = (N - 1) * k * (index_bytes + value_bytes)
    onebit = ring_all_reduce_bytes(M / 32, N)

    def exposed(wire: float) -> float:
        return max(0.0, wire - copies)
    return [
        _cost("DDP", ring_all_reduce_bytes(M, N), 1, exposed(full), compute),
        _cost("DiLoCo", ring_all_reduce_bytes(M, N), H, exposed(full), compute),
        _cost("Streaming", ring_all_reduce_bytes(M / F, N), H / F,
              max(0.0, part - delay * compute), compute),
        _cost(f"Streaming {bits}-bit", (N - 1) * codes, H / F,
              max(0.0, quant - delay * compute), compute),
        _cost("Top-K", topk_bytes, 1, exposed(topk_bytes / bandwidth + (N - 1) * latency),
              compute),
        _cost("1-bit Adam", onebit, 1, exposed(onebit / bandwidth + 4 * (N - 1) * latency),
              compute),
    ]
