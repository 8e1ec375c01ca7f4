"""The 1-bit compressed all-reduce of 1-bit Adam: signs and one scale, errors kept twice.

Tang et al. 2021 (arXiv 2102.02888), as DeepSpeed's ``NcclBackend.compressed_allreduce``
does it. A tensor of n numbers (1-bit Adam's: the model's flattened momentum,
onebit_adam.py) is padded to n' (a multiple of 8 N, so each of the N
chunks packs into whole bytes) and averaged in two compressed halves:

    worker (every rank i, the whole tensor):
        x_i      = m_i + e_i                          e_i: the worker error (n',)
        s_i      = ||x_i|| / sqrt(n')                 one scale per tensor and worker
        e_i      = x_i - s_i * sign(x_i)              sign(0) = +1
        send sign(x_i)'s chunk j to rank j            all-to-all, n' / 8 bytes of bits
    server (rank j, chunk j of every worker):
        y_j      = (1/N) sum_i s_i * sign(x_i)[j] + f_j      f_j: the server error (n'/N,)
        t_j      = ||y_j|| / sqrt(n' / N)
        f_j      = y_j - t_j * sign(y_j)
        all-gather sign(y_j) and t_j                  n' / 8 bytes of bits again
    result (every rank): chunk j = t_j * sign(y_j)    the same bits on every rank

Bytes per rank: about 2 (N-1)/N * n'/8 plus 2 (N-1) scales, 1/32 of a float32
all-reduce's 2 (N-1)/N * 4n. The errors carry what each rounding to a sign lost
into the next step, on both sides, so it is not lost for good.

A rank whose input does not fit this step (1-bit Adam's: gradients for other
parameters than the error feedback is laid out over) cannot just raise: its peers
would wait for it in the all-to-all until the timeout. It makes the worker half's
calls with ``refuse=True`` and sends s_i = -1 in place of its scale: a norm is
never negative, so no byte or message is added. Every rank reads the gathered
scales (N numbers to the host) and, where one is negative, raises ``Refused``
naming the ranks that refused, at the same point, before the server half and with
the errors untouched.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import minidist.distributed as dist
from minidist import backend
from minidist.backend import xp


class Refused(Exception):
    """Some ranks refused this compressed all-reduce (``refuse=True``); every rank raises
    it at the same point, so the caller can name the cause on every rank."""

    def __init__(self, ranks: list[int]):
        super().__init__(f"ranks {ranks} of the group refused the compressed all-reduce")
        self.ranks = ranks                 # group ranks that sent a negative scale


class OneBitErrors(NamedTuple):
    """The two error-feedback buffers of one tensor on one rank."""
    worker: Any                   # (n',) what this rank's signs lost
    server: Any                   # (n'/N,) what this rank's server chunk's signs lost


def padded_size(n: int, world: int) -> int:
    """n rounded up to a multiple of 8 * world: whole bytes of bits per chunk."""
    unit = 8 * world
    return -(-n // unit) * unit


def new_errors(n: int, world: int, dtype: Any) -> OneBitErrors:
    size = padded_size(n, world)
    return OneBitErrors(xp.zeros(size, dtype=dtype), xp.zeros(size // world, dtype=dtype))


def sign_bits(x: Any) -> Any:
    """The signs of x as packed bits, 1 for x >= 0 (so sign(0) = +1)."""
    return xp.packbits(x >= 0)


def signs_of(bits: Any, n: int, dtype: Any) -> Any:
    """+1 / -1 from packed bits (the first n)."""
    return xp.unpackbits(bits)[:n].astype(dtype) * 2 - 1


def scale_of(x: Any) -> Any:
    """||x|| / sqrt(numel): the one number that stands for x's magnitudes."""
    return xp.sqrt(xp.sum(x * x) / x.size).reshape(1)


def compressed_allreduce(m: Any, errors: OneBitErrors, group: Any = None,
                         refuse: bool = False) -> Any:
    """The average of ``m`` (flat, (n,)) over ``group`` as above; updates ``errors``
    in place and returns a new (n,) array, the same bits on every rank. ``refuse``:
    this rank cannot take part (``m`` is ignored); every rank raises ``Refused``."""
    world = dist.get_world_size(group)
    n, size = m.size, errors.worker.size
    chunk = size // world
    x = xp.zeros(size, dtype=m.dtype)
    if not refuse:
        x[:n] = m
    x += errors.worker                                       # x_i = m_i + e_i
    s = -xp.ones(1, dtype=x.dtype) if refuse else scale_of(x)   # (1,); -1: refused
    # worker -> server: chunk j of my signs to rank j, and my scale to everyone
    bits_in = xp.empty(size // 8, dtype=xp.uint8)            # (N * chunk / 8,)
    dist.all_to_all_single(bits_in, sign_bits(x), group=group)
    scales = xp.empty(world, dtype=x.dtype)                  # (N,) every worker's s_i
    dist.all_gather_into_tensor(scales, s, group=group)
    refused = [i for i, v in enumerate(backend.to_host(scales).tolist()) if v < 0]
    if refused:
        raise Refused(refused)
    errors.worker[...] = x - s * signs_of(sign_bits(x), size, x.dtype)   # e_i = x_i - s_i sign(x_i)
    # server: my chunk j of every worker, averaged, plus my error
    y = xp.zeros(chunk, dtype=x.dtype)
    for i in range(world):                                   # in worker order
        part = bits_in[i * chunk // 8:(i + 1) * chunk // 8]
        y += scales[i] * signs_of(part, chunk, x.dtype)
    y /= world
    y += errors.server                                       # y_j = mean + f_j
    t = scale_of(y)
    errors.server[...] = y - t * signs_of(sign_bits(y), chunk, x.dtype)
    # server -> everyone: the signs of every chunk and their scales
    all_bits = xp.empty(size // 8, dtype=xp.uint8)
    dist.all_gather_into_tensor(all_bits, sign_bits(y), group=group)
    all_t = xp.empty(world, dtype=x.dtype)
    dist.all_gather_into_tensor(all_t, t, group=group)
    out = signs_of(all_bits, size, x.dtype).reshape(world, chunk) * all_t.reshape(world, 1)
    return out.reshape(-1)[:n].copy()
