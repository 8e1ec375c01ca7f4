"""Healing: a replica that is behind receives the whole training state from a live peer.

The state is whatever the user's ``state_dict()`` returns (torchft's contract):
nested dicts, lists and tuples whose leaves are arrays (parameters, optimizer
moments) or plain values (the step, hyperparameters, an RNG's state, a sampler's
epoch). It travels over the quorum's group in two parts, from the source
(a member at the quorum's step) to each healing member:

    1. the skeleton: ``repr`` of the state with array i replaced by
       ``{"__array__": i, "shape": ..., "dtype": ...}``; its length (one int64),
       then its bytes. Read back with ``ast.literal_eval``: plain values only, never
       code, and every float exactly (repr round-trips a float; inf and nan, which
       are no literals, travel as ``{"__float__": "inf"}``).
    2. the arrays, one message each, as they are: a copy of the bytes, so the
       healed replica is bit-identical to its source.

    bytes moved = 8 + len(skeleton) + sum_i nbytes(array_i)

No checkpoint is read or written: the transfer is the same send/recv every collective
is built from (comm/collectives/p2p.py).
"""
from __future__ import annotations

import ast
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

from minidist import backend
from minidist.backend import xp
from minidist.comm.collectives.p2p import recv, send
from minidist.comm.group import ProcessGroup

ARRAY = "__array__"     # the key that marks an array's place in the skeleton
FLOAT = "__float__"     # the key of a float that repr cannot write as a literal: inf, nan


def split_state(state: Any, arrays: list) -> Any:
    """The skeleton of ``state``: its arrays appended to ``arrays``, each replaced by
    a record of its index, shape and dtype; mappings become plain dicts."""
    if backend.is_array(state):
        arrays.append(state)
        return {ARRAY: len(arrays) - 1, "shape": tuple(state.shape), "dtype": state.dtype.str}
    if isinstance(state, Mapping):
        return {key: split_state(value, arrays) for key, value in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(split_state(value, arrays) for value in state)
    if isinstance(state, float) and not math.isfinite(state):
        return {FLOAT: repr(state)}                       # 'inf', '-inf', 'nan'
    return state


def join_state(skeleton: Any, arrays: list) -> Any:
    """The state ``split_state`` took apart: each array record replaced by its array."""
    if isinstance(skeleton, dict):
        if ARRAY in skeleton:
            return arrays[skeleton[ARRAY]]
        if FLOAT in skeleton:
            return float(skeleton[FLOAT])
        return {key: join_state(value, arrays) for key, value in skeleton.items()}
    if isinstance(skeleton, (list, tuple)):
        return type(skeleton)(join_state(value, arrays) for value in skeleton)
    return skeleton


class Received(NamedTuple):
    """What ``recv_state`` took in."""
    state: Any            # the state, as the source's ``state_dict()`` returned it
    nbytes: int           # the bytes moved: 8 + len(skeleton) + sum of the arrays' nbytes


def send_state(state: Any, dst: int, group: ProcessGroup) -> int:
    """Send ``state`` to global rank ``dst`` of ``group``; return the bytes sent."""
    arrays: list = []
    text = repr(split_state(state, arrays)).encode()
    skeleton = backend.from_host(list(text), dtype="uint8")
    send(backend.from_host([len(text)], dtype="int64"), dst, group)
    send(skeleton, dst, group)
    for array in arrays:
        send(xp.ascontiguousarray(array), dst, group)
    return 8 + len(text) + sum(int(a.nbytes) for a in arrays)


def recv_state(src: int, group: ProcessGroup) -> Received:
    """Receive a state that ``send_state`` sends from global rank ``src`` of ``group``."""
    length = xp.zeros(1, dtype="int64")
    recv(length, src, group)
    skeleton = xp.zeros(int(backend.to_host(length)[0]), dtype="uint8")
    recv(skeleton, src, group)
    shape = ast.literal_eval(bytes(backend.to_host(skeleton)).decode())
    records: list = []
    _array_records(shape, records)
    arrays = []
    for record in sorted(records, key=lambda r: r[ARRAY]):
        array = xp.empty(record["shape"], dtype=record["dtype"])
        recv(array, src, group)
        arrays.append(array)
    nbytes = 8 + len(skeleton) + sum(int(a.nbytes) for a in arrays)
    return Received(join_state(shape, arrays), nbytes)


def _array_records(skeleton: Any, out: list) -> None:
    if isinstance(skeleton, dict):
        if ARRAY in skeleton:
            out.append(skeleton)
            return
        skeleton = list(skeleton.values())
    if isinstance(skeleton, (list, tuple)):
        for value in skeleton:
            _array_records(value, out)
