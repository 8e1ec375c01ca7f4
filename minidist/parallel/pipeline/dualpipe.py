"""DualPipeV: DeepSeek-V3's DualPipe folded onto half the ranks, two chunks per rank in a V.

DeepSeek-AI, "DeepSeek-V3 Technical Report" (2024), section 3.2.1, and the
deepseek-ai/DualPipe repository's ``dualpipev.py``; torch's ``ScheduleDualPipeV``
builds the same order. Rank r holds pieces r (chunk 0, on the way down) and
2p - 1 - r (chunk 1, on the way back up): zb_v's placement "v", so the first and
the last piece (and the loss) sit on rank 0.

The steady state pairs the forward of one micro-batch on one chunk with the full
backward of another on the other chunk ("F&B", op.Overlap): one op, which starts
once both inputs are here, so that the communication of one half hides behind
the other's compute (DeepSeek overlaps the MoE all-to-all this way). Its
arithmetic is the F, then the B and W, in that order. For rank r of p,
m >= 2p micro-batches, its eight phases:

    1  2(p-r-1)     F0                    warm-up, chunk 0 only
    2  r+1          F0 F1                 both chunks fill
    3  p-r-1        B1 W F1               zero bubble: input gradient, an old W, a forward
    4  m-2p+r+1     F0&B1 F1&B0           the steady state, forward paired with backward
    5  p-r-1        B1 F1&B0
    6  r+1          B1 B0                 full backwards, then input-only from half-way
    7  p-r-1        W B0                  (B0 input-only: its W waits)
    8  r+1          W                     the W's kept back fill the drain

("B" here is a full backward, B then W, unless marked input-only; "W" the oldest
W kept back.) With chunk costs F (forward), B (full backward), W (its weight
part) and F&B (an overlapped pair, between B and F + B), the DualPipe README's
bubble, the idle time of the busiest rank from the step's first op anywhere to
its last, is

    DualPipeV   (PP/2 - 1)(F&B + B - 3W)      PP = 2p pieces: (p - 1)(F&B + B - 3W)
    1F1B        (PP - 1)(F + B)               ZB1P  (PP - 1)(F + B - 2W)

on the ideal clock (schedule.simulate) exactly when 2B = F + 3W (the README's
figure has F = W = B / 2), F / W within [(p-1)/(p+1), (p+1)/(p-1)] and F&B >=
B + max(0, (p-1)(F - W)/2): then the last rank's chain, (p-1) F of warm-up and
(p-1)(F&B - B) in its drain, is the longest. For any costs the idle time is the
largest of six such chains (calc.dualpipe_v_exact_idle). The gap is in the
comparison, not in the order (torch's, tested) or the clock: the README's
formula is a closed form for its figure's proportions. A rank holds at most
PP + 1 = 2p + 1 chunk activations at once (each from its F to its W).
"""
from __future__ import annotations

from minidist.parallel.pipeline.op import Op, Overlap, Schedule, check_sizes


def check_dualpipe_v(stages: int, microbatches: int, chunks: int = 2) -> None:
    """Raise ValueError unless DualPipeV can run: two chunks per rank (an even
    number of pieces, a V) and m >= 2p micro-batches (the steady state needs one
    micro-batch per piece in flight)."""
    check_sizes(stages, microbatches, chunks)
    if chunks != 2:
        raise ValueError(f"dualpipe_v needs exactly 2 chunks (pipeline stages) per rank, "
                         f"in a V; got {chunks}")
    if microbatches < 2 * stages:
        raise ValueError(f"dualpipe_v needs at least 2p = {2 * stages} micro-batches for "
                         f"{stages} ranks, got {microbatches}")


def dualpipe_v(stages: int, microbatches: int) -> Schedule:
    """DualPipeV's order on every rank (the module docstring's eight phases)."""
    check_dualpipe_v(stages, microbatches)
    return [_RankOrder(r, stages).build(microbatches) for r in range(stages)]


class _RankOrder:
    """One rank's ops, appended phase by phase: the next micro-batch of each (kind,
    chunk) and the W's kept back, oldest first."""

    def __init__(self, rank: int, stages: int):
        self.r, self.p = rank, stages
        self.ops: list[Op] = []
        self.next = {(kind, c): 0 for kind in "FB" for c in (0, 1)}
        self.kept_w: list[Op] = []

    def forward(self, c: int) -> None:
        self.ops.append(Op("F", self.next[("F", c)], c))
        self.next[("F", c)] += 1

    def backward(self, c: int, full: bool = True) -> None:
        """B of chunk c; a full backward runs its W right after, an input-only one keeps it."""
        mb = self.next[("B", c)]
        self.next[("B", c)] += 1
        self.ops.append(Op("B", mb, c))
        if full:
            self.ops.append(Op("W", mb, c))
        else:
            self.kept_w.append(Op("W", mb, c))

    def kept_weight(self) -> None:
        """The oldest W kept back, if any."""
        if self.kept_w:
            self.ops.append(self.kept_w.pop(0))

    def overlapped(self, forward_chunk: int) -> None:
        """F&B: the forward of one chunk paired with the full backward of the other."""
        f, b = ("F", forward_chunk), ("B", 1 - forward_chunk)
        self.ops.append(Overlap(Op("F", self.next[f], f[1]), Op("B", self.next[b], b[1])))
        self.next[f] += 1
        self.next[b] += 1

    def build(self, m: int) -> list[Op]:
        r, p = self.r, self.p
        for _ in range(2 * (p - r - 1)):           # 1: warm-up on chunk 0
            self.forward(0)
        for _ in range(r + 1):                     # 2: both chunks
            self.forward(0)
            self.forward(1)
        for _ in range(p - r - 1):                 # 3: B1 W F1
            self.backward(1, full=False)
            self.kept_weight()
            self.forward(1)
        for i in range(m - 2 * p + r + 1):         # 4: F0&B1 F1&B0
            if i == 0 and r == p - 1:              # the last rank's first pair runs apart:
                self.forward(0)                    # its B1 waits for that very F0's
                self.backward(1)                   # forward through chunk 1
            else:
                self.overlapped(0)
            self.overlapped(1)
        for _ in range(p - r - 1):                 # 5: B1 F1&B0
            self.backward(1)
            self.overlapped(1)
        self._both_backwards()                     # 6
        for _ in range(p - r - 1):                 # 7: W B0
            self.kept_weight()
            self.backward(0, full=False)
        for _ in range(r + 1):                     # 8: W
            self.kept_weight()
        return self.ops

    def _both_backwards(self) -> None:
        """Phase 6: r + 1 times B1 B0, full until half-way, then input-only (an odd
        rank switches before its B1, an even rank between B1 and B0)."""
        n, full = self.r + 1, True
        for i in range(n):
            if i == n // 2 and self.r % 2 == 1:
                full = False
            self.backward(1, full)
            if i == n // 2 and self.r % 2 == 0:
                full = False
            self.backward(0, full)
