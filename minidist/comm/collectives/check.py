"""Check that every rank called the same collective, before moving any data.

Each rank describes its call in one line (``all_reduce op=SUM algorithm=ring
dtype=float32 shape=(4, 3)``), padded to a 128-byte record, and the group
gathers the records with a Bruck all-gather: in round k (d = 2**k) every rank
sends the rows it has to rank r - d and receives as many from rank r + d, so
after ceil(log2 N) rounds row i of its table holds the record of rank r + i.
If any row differs from its own, every rank raises ``CollectiveMismatchError``
naming what differed (a mismatch would otherwise hang, or worse, silently mix
data).

Two mechanisms use this exchange (docs/collectives.md, "Same call everywhere"):

- Most collectives run it on its own first (``verify_same_call``): ceil(log2 N)
  extra rounds of records-only messages before their data moves.
- A small all-reduce carries its data inside it (small.py): each block is the
  record followed by the rank's array, and the all-reduce *is* the check, at
  no extra message. It can because its data moves in exactly this pattern;
  a broadcast root, say, only sends, and would learn nothing.

Why every rank finds a mismatch, whichever mechanism each rank is in: every
collective starts with the same rounds, same partners, one message each way
per round, so every message is matched. Blocks may then differ in size (a
record alone vs a record and an array, or two shapes): a message of another
size is dropped and its rows marked ``POISON``, which differs from every
record and is passed on like one. A rank whose rows all equal its own record
has, through the all-gather, seen the genuine record of every rank, so all
calls were the same; otherwise every rank sees a differing or poisoned row.
Then all of them run the exchange once more with records only (same size
everywhere) to learn who called what, and raise. Every message of the failed
call has then been received, so the next call starts on empty channels.
"""
from __future__ import annotations

import hashlib
from typing import Any

from minidist.comm.errors import CollectiveMismatchError, MessageMismatchError
from minidist.comm.transport.base import host_view

RECORD_BYTES = 128
POISON = 0xFF  # fills the rows of a dropped message: a byte no record contains


def describe(name: str, **fields) -> str:
    """One line describing a collective call: the name, then key=value pairs
    (values without spaces, so the line splits back into its fields)."""
    return " ".join([name] + [f"{k}={v}".replace(" ", "") for k, v in fields.items()])


_encoded: dict[str, bytes] = {}  # the lines seen most recently, encoded once


def encode(line: str) -> bytes:
    """The record of a line: its bytes, zero-padded to RECORD_BYTES."""
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


def host_table(rows: int, row_bytes: int) -> Any:
    """A zeroed host uint8 array of shape (rows, row_bytes): what the exchange moves."""
    return host_view(bytearray(rows * row_bytes)).reshape(rows, row_bytes)


def bruck_rounds(group, table: Any) -> list[tuple]:
    """The rounds of the Bruck all-gather on ``table`` (one row per rank, row 0
    ours): in round k, d = 2**k, send rows 0..count-1 to rank r - d and receive
    count rows from rank r + d into rows d.., count = min(d, N - d). Afterwards
    row i holds row 0 of rank r + i (mod N), after ceil(log2 N) rounds.
    Returns (send bytes, dst, receive bytes, src) per round, flat views of table."""
    n, r = group.size, group.rank
    rounds = []
    d = 1
    while d < n:
        count = min(d, n - d)
        rounds.append((table[:count].reshape(-1), (r - d) % n,
                       table[d:d + count].reshape(-1), (r + d) % n))
        d *= 2
    return rounds


def gather_rows(group, rounds: list[tuple], tag: int, what: str, abortable: bool = True,
                strict: bool = False) -> bool:
    """Run the Bruck all-gather ``rounds`` (from ``bruck_rounds``). Returns False
    if some message had another size than expected; its rows, and those passed
    on from them, are then filled with POISON. ``strict``: raise
    MessageMismatchError at once instead (when no record tells the rows apart)."""
    whole = True
    for send, dst, inbox, src in rounds:
        if not group.exchange(send, dst, inbox, src, tag, what, abortable):
            if strict:
                raise MessageMismatchError(
                    f"rank {group.global_rank(group.rank)}: in {what}, rank "
                    f"{group.global_rank(src)} sent a message of another size than the "
                    f"{inbox.size} bytes expected (different shapes or dtypes?)")
            inbox[:] = POISON
            whole = False
    return whole


def verify_same_call(group, line: str, tag: int) -> None:
    """Raise CollectiveMismatchError on every rank unless all ranks passed the same line."""
    if group.size == 1:
        return
    cached_plan(group, ("check", line), CheckTable, group, line, 0).gather(
        group, tag, "the collective check")


# Plans kept per group (tables of the check, plans of small.py, direct.py and
# alltoall.py): a training loop makes the same handful of calls again and again.
MAX_PLANS = 32


def cached_plan(group, key: tuple, make, *args, keep=None):
    """``group``'s plan for ``key``: ``make(*args)`` on first use, kept unless
    ``keep(plan)`` says no (at most MAX_PLANS per group: a loop has a handful)."""
    plan = group.small_plans.get(key)
    if plan is None:
        plan = make(*args)
        if keep is None or keep(plan):
            keep_plan(group, key, plan)
    return plan


def keep_plan(group, key: tuple, plan) -> None:
    """Keep ``plan`` as ``group``'s plan for ``key`` (at most MAX_PLANS)."""
    if len(group.small_plans) >= MAX_PLANS:
        group.small_plans.clear()
    group.small_plans[key] = plan


class CheckTable:
    """The table of an exchange that carries the same-call check (small.py,
    alltoall.py, direct.py): row i is rank r + i's block, [record (128 B) |
    payload_bytes], gathered with ``bruck_rounds``. Made once per plan; a call
    fills ``payload[0]`` and calls ``gather``. ``with_record=False`` (a group
    made with check=False): blocks of payload alone."""

    def __init__(self, group, line: str, payload_bytes: int, with_record: bool = True):
        self.line = line
        record = encode(line) if with_record else b""
        head = len(record)
        self.table = host_table(group.size, head + payload_bytes)
        self.table[0, :head] = host_view(record)
        self.records = self.table[:, :head]          # (N, 128): every rank's record
        self.payload = self.table[:, head:]          # (N, payload_bytes)
        self.expected = record * group.size          # what the records hold if all agree
        self.rounds = bruck_rounds(group, self.table)

    def gather(self, group, tag: int, what: str) -> None:
        """Gather every rank's block; raise CollectiveMismatchError on every rank
        unless every rank made this call. Without records, a block of another
        size raises MessageMismatchError where it arrives."""
        if not self.expected:
            gather_rows(group, self.rounds, tag, what, strict=True)
            return
        whole = gather_rows(group, self.rounds, tag, what)
        if not whole or self.records.tobytes() != self.expected:
            raise_mismatch(group, self.line, tag)    # raises on every rank


def agree(group, ok: bool, tag: int, flags: tuple, what: str) -> bool:
    """Dissemination: in round k rank r sends one byte, ``ok``, to r + 2**k and
    receives r - 2**k's, AND-ing them. After ceil(log2 N) rounds every rank has
    heard, directly or not, from all, and all hold the same answer: True only
    if every rank said ok. ``flags``: two one-byte host buffers (a plan's)."""
    n, r = group.size, group.rank
    mine, theirs = flags
    d = 1
    while d < n:
        mine[0] = ok
        same = group.exchange(mine, (r + d) % n, theirs, (r - d) % n, tag, what)
        ok = ok and same and bool(theirs[0])
        d *= 2
    return ok


def one_byte_flags() -> tuple:
    """The two buffers ``agree`` sends from and receives into."""
    return host_view(bytearray(1)), host_view(bytearray(1))


def raise_mismatch(group, line: str, tag: int) -> None:
    """Called on every rank once the exchange showed a difference: gather the
    records alone (now the same size everywhere) and raise, naming what differs.

    Not abortable: a rank that raises first makes the launcher abort the world,
    but every rank should finish this exchange and report the mismatch itself.
    """
    n = group.size
    table = host_table(n, RECORD_BYTES)
    table[0] = host_view(encode(line))
    gather_rows(group, bruck_rounds(group, table), tag, "the collective check (who called what)",
                abortable=False)
    r = group.rank
    raise mismatch_error(group, [table[(q - r) % n] for q in range(n)])


def mismatch_error(group, records: list) -> CollectiveMismatchError:
    """The error every rank raises: ``records[q]`` is group rank q's record."""
    lines = [bytes(rec).rstrip(b"\0").decode(errors="replace") for rec in records]
    listing = "\n".join(f"  rank {group.global_rank(i)}: {line}" for i, line in enumerate(lines))
    differ = _differences(lines) if len(set(lines)) > 1 else ["the size of their data"]
    return CollectiveMismatchError(
        f"ranks of group {group.ranks} called different collectives "
        f"(they differ in {', '.join(differ)}):\n{listing}")


def _differences(lines: list[str]) -> list[str]:
    parsed = [dict(p.split("=", 1) if "=" in p else ("collective", p) for p in line.split())
              for line in lines]
    keys = sorted({k for p in parsed for k in p}, key=lambda k: (k != "collective", k))
    return [k for k in keys if len({p.get(k) for p in parsed}) > 1]
