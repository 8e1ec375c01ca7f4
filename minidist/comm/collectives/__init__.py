"""Every collective, built only from the transport's send and receive.

    ring all-reduce   T = 2(N-1) * alpha + 2(N-1)/N * M / beta;  each rank sends 2(N-1)/N * M

Files, in reading order:

- p2p.py           send, recv, isend, irecv, recv_reduce on a group (global ranks)
- api.py           the entry points shaped like torch.distributed: broadcast, reduce,
                   all_reduce, all_gather, reduce_scatter, gather, scatter, all_to_all,
                   all_to_all_single, barrier; each checks, runs and counts its call
- call.py          one call from issue to bytes: tag, same-call check, stats, async or not
- stats.py         CommStats: the bytes and messages a rank moved, per collective and last;
                   a Tally per plan of the latency path (its calls, multiplied out on read)
- check.py         the same-call check: every rank made the same call, or all raise
- ring.py          ring reduce-scatter and all-gather, the two halves of ring all-reduce
- tree.py          binomial trees and recursive doubling, the log(N)-step algorithms
- all_reduce.py    all-reduce eight ways in one place: every algorithm's entry (naive,
                   tree, recursive doubling, ring, allgather, hierarchical, direct, twoshot),
                   ``choose`` (auto by size) and its measured thresholds
- small.py         the allgather all-reduce, which travels inside the same-call check
- oneshot.py       the latency path: the allgather all-reduce as one post on the board
                   and N-1 reads in place (transport/board.py), called straight from api.py
- twoshot.py       the two-shot all-reduce on the board: each rank reduces its chunk of
                   every post, raises a second flag, and copies the others' chunks out
- direct.py        the direct all-reduce: one-copy reads of the peers' arrays, and the
                   probe that learns whether the ranks may read each other
- hierarchical.py  two-level all-reduce: ring in the node, ring between nodes on 1/L
- alltoall.py      all-to-all with uneven splits (pairwise exchange, single-copy reads)
- alltoall_board.py  all-to-all's splits, and inputs that fit a slot, in one post on the board;
                   a split plan per call shape, compared byte for byte with the posts
- alltoall_rounds.py  an all-to-all input larger than a slot through it in rounds (4 ranks)
- work.py          ``Work``: async handles and the background thread that runs them
- interleave.py    two computations taking turns, each handing over while its collective
                   is in flight (DualPipeV's F&B: one micro-batch's all-to-all hidden
                   behind another's compute)
- cost.py          the alpha-beta cost model of each algorithm
- clock.py         one clock for a trace across machines: each rank's offset to rank 0's,
                   from send / recv round trips (Cristian's algorithm)

Docs: docs/collectives.md. Demos: demos/02_collectives.py, demos/03_ring_allreduce.py.
Tests: tests/comm/collectives/. Bench: bench/bench_collectives.py.
"""
