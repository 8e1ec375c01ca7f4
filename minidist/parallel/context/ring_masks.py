"""Which parts of a ring step to compute: masks from the global positions of the tokens.

At ring step t, rank r holds its queries Q_r and the keys K_b of rank b. Their
tokens are not where they sit in the arrays: under the zigzag layout rank r holds
chunks r and 2N-1-r of the 2N chunks of the sequence (each of cs = T / 2N tokens),
so its local row a*cs + i is global position i + cs * (chunk a). Each pair
(query chunk, key chunk) is contiguous in the sequence, so one integer says where
the two stand relative to each other:

    shift = cs * (query chunk - key chunk)        row i stands at key position i + shift

and the masks, all of global positions p_q = j_start + i + shift and p_k, are

    causal:    p_k <= p_q                               visible iff shift > -cs
    window:    p_q - p_k < window                       visible iff shift - cs + 1 < window
    documents: doc[p_q] == doc[p_k]                     visible iff the chunks' id ranges meet

(the same definitions as minidist.attention, row i sees keys i - window + 1 .. i of
its own document). A chunk pair that no query can see is skipped altogether, as the
causal ring already skips the blocks in the future; inside a visible pair, flash
attention skips the tiles outside the diagonal and the window (``Structure.shift``).

What a window saves. Of the 2N x 2N chunk pairs, causal attention computes about
half, N (2N+1). With a window w, a query chunk sees only itself and the
ceil((w-1)/cs) chunks before it, so about 2N (1 + ceil((w-1)/cs)) pairs are computed:
the fraction of the causal work done is (1 + ceil((w-1)/cs)) / (N + 1/2), e.g. with
T = 8192 on N = 4 ranks (cs = 1024) and w = 1024, 2/4.5: 56% of the work is saved,
and more as N grows. ``plan_work(..., window=w)`` counts it.

What it saves in bytes: the ring runs only as many steps as some rank still sees
a block (``steps``). Under the contiguous layout a window of w keys needs the
blocks of the 1 + ceil((w-1)/c) ranks up to and including its own, so K/V travel that
many hops less one, not N - 1 (packed documents that do not span shards cut it the
same way). Under zigzag a rank's second chunk needs the keys of the next rank's,
which the one-way ring reaches last, so the whole ring runs.

Documents are skipped by their id ranges: a query chunk whose smallest id exceeds the
key chunk's largest id (or the other way round), in every row of the batch, shares no
document with it. That is exact for packed rows (ids non-decreasing along the row)
and safe for any ids: pairs that do meet are masked entry by entry.
"""
from __future__ import annotations

from typing import Any

from minidist import backend
from minidist.attention import common
from minidist.autograd.tensor import Tensor
from minidist.backend import xp


def chunks(layout: str, rank: int, world_size: int) -> list[int]:
    """Which of the equal chunks of the sequence ``rank`` holds, in order."""
    if layout == "zigzag":
        return [rank, 2 * world_size - 1 - rank]                # of 2N chunks
    return [rank]                                               # of N chunks


def document_array(document_ids: Any, batch: int, length: int) -> Any:
    """``document_ids`` of the whole sequence, (T,) or (B, T) -> an array (Bd, T), checked."""
    ids = document_ids.data if isinstance(document_ids, Tensor) else document_ids
    if not backend.is_array(ids) or ids.dtype.kind not in "iu":
        raise TypeError("document_ids must be an integer array of the active backend, "
                        f"got {type(ids).__name__} {getattr(ids, 'dtype', '')}")
    if ids.ndim == 1:
        ids = ids[None, :]
    if ids.ndim != 2 or ids.shape[1] != length or ids.shape[0] not in (1, batch):
        raise ValueError(f"ring attention takes the document_ids of the whole sequence, "
                         f"(T,) or (B, T) with T={length} (local length times the group "
                         f"size) and B={batch}, got {tuple(ids.shape)}; every rank passes "
                         f"the same ids")
    return ids


class RingMasks:
    """The causal, window and document masks of the whole sequence, as the ring sees them.

    ``docs``: (Bd, T) document ids of the whole sequence or None; ``local``: the
    length each rank holds. ``pieces(rank, block)`` lists what to compute at the step
    where ``rank`` holds the keys of ``block``.
    """

    def __init__(self, is_causal: bool, window: int | None, docs: Any, layout: str,
                 world_size: int, local: int):
        self.is_causal, self.window, self.docs = is_causal, window, docs
        self.layout, self.world_size, self.local = layout, world_size, local
        self.chunk = local // len(chunks(layout, 0, world_size))        # cs
        self.ranges = None
        if docs is not None:                                    # per row and chunk: id range
            by_chunk = docs.reshape(docs.shape[0], -1, self.chunk)       # (Bd, chunks, cs)
            lo, hi = (backend.to_host(f(by_chunk, axis=-1)) for f in (xp.min, xp.max))
            self.ranges = (lo.tolist(), hi.tolist())

    def _documents_meet(self, qc: int, kc: int) -> bool:
        lo, hi = self.ranges
        return any(max(lo[b][qc], lo[b][kc]) <= min(hi[b][qc], hi[b][kc])
                   for b in range(len(lo)))

    def visible(self, qc: int, kc: int) -> bool:
        """Whether some query of chunk ``qc`` may see some key of chunk ``kc``."""
        shift, cs = self.chunk * (qc - kc), self.chunk
        if self.is_causal and shift <= -cs:                     # every key in the future
            return False
        if self.window is not None and shift - cs + 1 >= self.window:   # all too far back
            return False
        return self.ranges is None or self._documents_meet(qc, kc)

    def sees(self, rank: int, block: int) -> bool:
        """Whether ``rank``'s queries see any key of ``block``."""
        if not self.is_causal and self.docs is None:
            return True
        return any(self.visible(qc, kc) for qc in chunks(self.layout, rank, self.world_size)
                   for kc in chunks(self.layout, block, self.world_size))

    def steps(self) -> int:
        """Ring steps worth running: 1 + the last step t at which some rank r still sees
        block (r - t) mod N (the same number on every rank: the masks are global)."""
        n = self.world_size
        for t in range(n - 1, 0, -1):
            if any(self.sees(r, (r - t) % n) for r in range(n)):
                return t + 1
        return 1

    def pieces(self, rank: int, block: int) -> list[tuple[slice, slice, common.Structure]]:
        """(local query rows, local key columns, masks) to compute at this ring step."""
        everything = slice(0, self.local)
        if not self.is_causal and self.docs is None:
            return [(everything, everything, common.Structure())]
        cs, out = self.chunk, []
        for a, qc in enumerate(chunks(self.layout, rank, self.world_size)):
            for b, kc in enumerate(chunks(self.layout, block, self.world_size)):
                if not self.visible(qc, kc):
                    continue
                docs = None
                if self.docs is not None:                       # (Bd, cs) ids of each chunk
                    docs = (self.docs[:, qc * cs:(qc + 1) * cs],
                            self.docs[:, kc * cs:(kc + 1) * cs])
                out.append((slice(a * cs, (a + 1) * cs), slice(b * cs, (b + 1) * cs),
                            common.Structure(self.is_causal, self.window, docs,
                                             shift=cs * (qc - kc))))
        return out

    def pairs(self, rank: int, block: int) -> int:
        """Query-key pairs scored at this step: within each piece, the rows times the keys
        its visible rows span (the tiles flash attention cannot skip, at tile size 1)."""
        total = 0
        for rows, cols, structure in self.pieces(rank, block):
            lq, lk = rows.stop - rows.start, cols.stop - cols.start
            for i in range(lq):
                start, stop = structure.keys(i, i + 1, lk)
                total += max(0, stop - start)
        return total
