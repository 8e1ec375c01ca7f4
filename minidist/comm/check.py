"""Check that every rank called the same collective, before moving any data.

Each rank describes its call in one line (``all_reduce op=SUM algorithm=ring
dtype=float32 shape=(4, 3)``) and the group exchanges these lines with a Bruck
all-gather: in round k every rank sends what it has to rank - 2**k and receives
from rank + 2**k, so after ceil(log2 N) rounds everyone holds every line. If any
line differs, every rank raises ``CollectiveMismatchError`` naming what differed
(a mismatch would otherwise hang, or worse, silently mix data).
"""
from __future__ import annotations

import hashlib

from minidist import backend
from minidist.backend import xp
from minidist.comm.errors import CollectiveMismatchError

RECORD_BYTES = 128


def describe(name: str, **fields) -> str:
    """One line describing a collective call: the name, then key=value pairs
    (values without spaces, so the line splits back into its fields)."""
    return " ".join([name] + [f"{k}={v}".replace(" ", "") for k, v in fields.items()])


_encoded: dict[str, bytes] = {}  # the lines seen most recently, encoded once


def _encode(line: str) -> bytes:
    record = _encoded.get(line)
    if record is None:
        if len(_encoded) > 256:
            _encoded.clear()
        record = _encoded[line] = _pad(line)
    return record


def _pad(line: str) -> bytes:
    data = line.encode()
    if len(data) > RECORD_BYTES:  # keep a readable prefix and a digest of the rest
        digest = hashlib.sha1(data).hexdigest()[:16]
        data = data[:RECORD_BYTES - 18] + b"~" + digest.encode() + b"~"
    return data.ljust(RECORD_BYTES, b"\0")


def _differences(lines: list[str]) -> list[str]:
    parsed = [dict(p.split("=", 1) if "=" in p else ("collective", p) for p in line.split())
              for line in lines]
    keys = sorted({k for p in parsed for k in p}, key=lambda k: (k != "collective", k))
    return [k for k in keys if len({p.get(k) for p in parsed}) > 1]


def verify_same_call(group, line: str, tag: int) -> None:
    """Raise CollectiveMismatchError on every rank unless all ranks passed the same line."""
    n, r = group.size, group.rank
    if n == 1:
        return
    record = _encode(line)
    table = xp.empty((n, RECORD_BYTES), dtype="uint8")  # row i: the line of rank r + i
    table[0] = backend.from_host(memoryview(record))
    d = 1
    while d < n:
        count = min(d, n - d)
        # Not abortable: a rank that already found the mismatch aborts the world,
        # but every rank should finish the exchange and report the mismatch itself.
        group.sendrecv(table[:count], (r - d) % n, table[d:d + count], (r + d) % n, tag,
                       what="the collective check", abortable=False)
        d *= 2
    host = backend.to_host(table)
    if host.tobytes() == record * n:
        return  # every rank made the same call
    lines = [""] * n
    for i in range(n):
        lines[(r + i) % n] = bytes(host[i]).rstrip(b"\0").decode(errors="replace")
    if len(set(lines)) > 1:
        listing = "\n".join(f"  rank {group.global_rank(i)}: {lines[i]}" for i in range(n))
        raise CollectiveMismatchError(
            f"ranks of group {group.ranks} called different collectives "
            f"(they differ in {', '.join(_differences(lines))}):\n{listing}")
