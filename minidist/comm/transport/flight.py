"""The flight recorder: every rank's last communication call, in shared memory.

When a world hangs, the question is not "who is waiting" (nearly everyone) but
"who is *not* in the call the others wait in". Each rank writes what it is
doing into its own record in the world's segment before it starts a
collective or a blocking send/recv, and marks it finished after. Because the
records live in shared memory, anyone attached to the segment can read them,
also while the rank that wrote them is stuck in a computation or a
``time.sleep``: the rank that times out (to name the missing ranks in its
error) and the launcher (for ``minidist run --timeout``).

One record per rank, ``RECORD_BYTES`` each, int64 words then text::

    word 0  calls      how many calls this rank has recorded (0: none yet)
    word 1  state      IN_CALL while the call runs, FINISHED after
    word 2  ctx        the group's context (ctx 0 is the world)
    word 3  number     the call's number in its group (all ranks number alike)
    word 4  started    when the call started: time.perf_counter(), seconds, as a float64
    word 5  ended      ... and ended (read only once the state is FINISHED)
    word 6  length     bytes of the text
    words 8..15        the group's ranks as a bit mask (at most MAX_RANKS)
    word 16 done_ctx   the context of the last collective the rank finished
    word 17 done       1 + that collective's number (0: none finished yet)
    bytes 144..        the text: "all_reduce op=SUM algorithm=ring dtype=float32 shape=(4,)"

A rank *entered* call number k of a group if its record is for that group with a
number of at least k. It *finished* it if, besides, the record is FINISHED or past k,
or its last finished collective is of that group and numbered k or more: a rank that
died in a call of another group after finishing ours (fault tolerance's vote, then the
next step's all-reduce) sent all it was to send in ours (local_wait.py). Like NCCL's flight recorder and PyTorch's
``TORCH_NCCL_DUMP_ON_TIMEOUT``, only in a few words: one record, the last call.

The times are read on ``time.perf_counter``, the clock the stats and the trace
time a call with: a call of the latency path reads it once as it begins and
once as it ends, and passes each reading to the recorder (``now``). Every
reader of a record is on the writer's machine, where that clock is one clock
for every process (on Linux, CLOCK_MONOTONIC: seconds since boot).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

RECORD_BYTES = 384
MASK_WORD, MASK_WORDS = 8, 8
MAX_RANKS = 64 * MASK_WORDS       # ranks the mask can name
DONE_WORD = 16                    # words 16, 17: the last finished collective
TEXT_OFFSET = 144
TEXT_MAX = RECORD_BYTES - TEXT_OFFSET
IN_CALL, FINISHED = 1, 2


def region_bytes(world_size: int) -> int:
    return world_size * RECORD_BYTES


class NaiveRecorder:
    """The writing side, held by one rank: ``begin`` before a call, ``end`` after.

    The plain version: every word of the record written on every call, in the
    order of the layout above. Kept as the oracle of ``Recorder`` (the one the
    transport uses), which must leave the same record after every call."""

    def __init__(self, buf, offset: int, rank: int):
        start = offset + rank * RECORD_BYTES
        self._words = buf[start:start + TEXT_OFFSET].cast("q")
        self._times = buf[start:start + TEXT_OFFSET].cast("d")   # words 4, 5 as float64
        self._text = buf[start + TEXT_OFFSET:start + RECORD_BYTES]
        self._calls = 0

    def begin(self, ctx: int, number: int, ranks: list[int], text: str,
              now: float | None = None) -> None:
        """Note call ``number`` of group ``ctx`` (ranks, its line), begun at ``now``
        (time.perf_counter(); None: read here)."""
        w = self._words
        w[1] = 0  # the record is being written: a reader sees no state
        write_ranks(w, ranks)
        data = text.encode()[:TEXT_MAX]
        self._text[:len(data)] = data
        w[6] = len(data)
        self._calls += 1
        w[0], w[2], w[3], w[5] = self._calls, ctx, number, 0
        self._times[4] = time.perf_counter() if now is None else now
        w[1] = IN_CALL

    def end(self, now: float | None = None) -> None:
        """The call noted last ended at ``now`` (as ``begin``'s)."""
        w = self._words
        self._times[5] = time.perf_counter() if now is None else now
        if w[3] >= 0:    # a collective (point-to-point calls have no shared number)
            w[DONE_WORD], w[DONE_WORD + 1] = w[2], w[3] + 1
        w[1] = FINISHED

    def close(self) -> None:
        self._words.release()
        self._times.release()
        self._text.release()


class Recorder(NaiveRecorder):
    """``NaiveRecorder`` at the price of a few stores per call: the record of a
    small collective is written on every call (every call is named in a hang
    report), and what repeats is not written again.

    A loop repeats the same call of the same group, so the group's mask, the
    text and the context are written only when they change (an identity test
    of the caller's list and string first: the plan of a small collective
    passes the same objects every time), and the words ``end`` needs (context,
    number) are kept in Python, not read back from shared memory. What is left,
    per call: state, calls, number, start time at ``begin``; end time, the last
    finished collective and state at ``end``. ``ended`` is not cleared at
    ``begin``: a reader uses it only once the state is FINISHED."""

    def __init__(self, buf, offset: int, rank: int):
        super().__init__(buf, offset, rank)
        self._last_ranks: list | None = None   # the group's list, and its ranks as a tuple
        self._last_key: tuple = ()
        self._last_text: str | None = None
        self._ctx = self._done_ctx = None        # words 2 and 16 as written
        self._number = -1                        # word 3 as written

    def begin(self, ctx: int, number: int, ranks: list[int], text: str,
              now: float | None = None) -> None:
        w = self._words
        w[1] = 0  # the record is being written: a reader sees no state
        if ranks is not self._last_ranks and tuple(ranks) != self._last_key:
            self._last_ranks, self._last_key = ranks, tuple(ranks)
            write_ranks(w, ranks)
        if text is not self._last_text:
            self._last_text = text
            data = text.encode()[:TEXT_MAX]
            self._text[:len(data)] = data
            w[6] = len(data)
        if ctx != self._ctx:
            self._ctx = w[2] = ctx
        self._calls += 1
        self._number = w[3] = number
        w[0] = self._calls
        self._times[4] = time.perf_counter() if now is None else now
        w[1] = IN_CALL

    def end(self, now: float | None = None) -> None:
        w = self._words
        self._times[5] = time.perf_counter() if now is None else now
        if self._number >= 0:    # a collective (point-to-point calls have no shared number)
            if self._ctx != self._done_ctx:
                self._done_ctx = w[DONE_WORD] = self._ctx
            w[DONE_WORD + 1] = self._number + 1
        w[1] = FINISHED


def write_ranks(words, ranks: list[int]) -> None:
    """The group's ranks as a bit mask into words 8..15 of a record."""
    mask = [0] * MASK_WORDS
    for r in ranks:
        if r < MAX_RANKS:
            mask[r // 64] |= 1 << (r % 64)
    for i, m in enumerate(mask):
        words[MASK_WORD + i] = m - (1 << 64) if m >= 1 << 63 else m  # as int64


@dataclass
class Record:
    """One rank's last call, as read back."""
    rank: int
    calls: int
    state: int
    ctx: int
    number: int
    started: float      # time.perf_counter() of the writer (one clock per machine)
    ended: float
    ranks: list
    text: str
    done_ctx: int = 0     # the last collective the rank finished: its context
    done: int = 0         # ... and 1 + its number (0: none)

    def entered(self, ctx: int, number: int) -> bool:
        return self.calls > 0 and self.ctx == ctx and self.number >= number

    def finished(self, ctx: int, number: int) -> bool:
        """Has the rank finished collective ``number`` of context ``ctx``?"""
        if self.ctx == ctx and (self.number > number or (
                self.number == number and self.state == FINISHED)):
            return True
        return self.done > 0 and self.done_ctx == ctx and self.done - 1 >= number

    def describe(self, now: float | None = None) -> str:
        """``all_reduce #12 of [0, 1, 2] op=SUM ...: in it for 60.1 s`` (or finished ... ago)."""
        if self.calls == 0:
            return "no call yet"
        now = time.perf_counter() if now is None else now
        name, _, rest = self.text.partition(" ")
        number = f" #{self.number}" if self.number >= 0 else ""  # point-to-point: none
        call = f"{name}{number} of group {self.ranks}" + (f" {rest}" if rest else "")
        if self.state == IN_CALL:
            return f"{call}: in it for {now - self.started:.1f} s"
        return f"{call}: finished {now - self.ended:.1f} s ago"


def read(buf, offset: int, world_size: int) -> list[Record]:
    """Every rank's record (a snapshot; a record being rewritten reads as it was or is)."""
    out = []
    for r in range(world_size):
        start = offset + r * RECORD_BYTES
        w = buf[start:start + TEXT_OFFSET].cast("q")
        words = list(w)
        w.release()
        t = buf[start:start + TEXT_OFFSET].cast("d")
        started, ended = t[4], t[5]
        t.release()
        length = max(0, min(words[6], TEXT_MAX))
        text = bytes(buf[start + TEXT_OFFSET:start + TEXT_OFFSET + length]).decode(
            "utf-8", "replace")
        ranks = [i for i in range(min(world_size, MAX_RANKS))
                 if (words[MASK_WORD + i // 64] >> (i % 64)) & 1]
        out.append(Record(r, words[0], words[1], words[2], words[3], started,
                          ended, ranks, text, words[DONE_WORD], words[DONE_WORD + 1]))
    return out


def table(records: list[Record], now: float | None = None) -> str:
    """The flight-recorder table: one line per rank, its last call."""
    now = time.perf_counter() if now is None else now
    lines = ["last call of every rank (flight recorder):"]
    lines += [f"  rank {r.rank}: {r.describe(now)}" for r in records]
    return "\n".join(lines)


def missing(records: list[Record], me: int) -> tuple[Record | None, list[Record]]:
    """The call rank ``me`` is in, and the records of the ranks of its group that
    have not entered it (they are elsewhere: computing, or in another call)."""
    mine = records[me]
    if mine.calls == 0 or mine.state != IN_CALL or mine.number < 0:
        return None, []
    return mine, [records[r] for r in mine.ranks
                  if r < len(records) and not records[r].entered(mine.ctx, mine.number)]


def _ranks(ranks) -> str:
    ranks = sorted(ranks)
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(str(r) for r in ranks)}"


def who_is_missing(records: list[Record]) -> list[str]:
    """For every collective some ranks are in: which ranks of its group are not.
    One line per such call: "rank 2 did not enter all_reduce #12 of group [0, 1,
    2, 3], which ranks 0, 1, 3 wait in"."""
    calls: dict = {}
    for rec in records:
        mine, absent = missing(records, rec.rank)
        if mine is not None and absent:
            entry = calls.setdefault((mine.ctx, mine.number), (mine, set(), set()))
            entry[1].add(rec.rank)
            entry[2].update(a.rank for a in absent)
    return [f"{_ranks(absent)} did not enter {mine.text.partition(' ')[0]} #{mine.number} "
            f"of group {mine.ranks}, which {_ranks(waiting)} wait{'s' if len(waiting) == 1 else ''} in"
            for mine, waiting, absent in calls.values()]


def hang_report(records: list[Record], me: int) -> str:
    """What a rank that timed out adds to its error: who is not in its call, and the table."""
    mine, absent = missing(records, me)
    lines = []
    if mine is not None and absent:
        lines.append(f"{_ranks(r.rank for r in absent)} did not enter "
                     f"{mine.text.partition(' ')[0]} #{mine.number} of group {mine.ranks}, "
                     f"which rank {me} waits in")
    elif mine is not None:
        lines.append(f"every rank of group {mine.ranks} entered "
                     f"{mine.text.partition(' ')[0]} #{mine.number}; a message went missing "
                     "inside it (mismatched point-to-point calls?)")
    lines.append(table(records))
    return "\n".join(lines)
