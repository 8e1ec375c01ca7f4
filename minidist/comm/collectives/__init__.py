"""Every collective, built only from the transport's send and receive.

    ring all-reduce   T = 2(N-1) * alpha + 2(N-1)/N * M / beta;  each rank sends 2(N-1)/N * M

Files, in reading order:

- p2p.py         send, recv, isend, irecv, recv_reduce on a group (global ranks)
- api.py         the entry points shaped like torch.distributed: broadcast, reduce,
                 all_reduce, all_gather, reduce_scatter, gather, scatter, all_to_all,
                 all_to_all_single, barrier
- check.py       the same-call check: every rank made the same call, or all raise
- ring.py        ring reduce-scatter and all-gather, the two halves of ring all-reduce
- tree.py        binomial trees and recursive doubling, the log(N)-step algorithms
- small.py       the small all-reduce that travels inside the same-call check
- alltoall.py    all-to-all with uneven splits (pairwise exchange), its split check
- all_reduce.py  all-reduce six ways (naive, tree, recursive doubling, ring, all-gather,
                 hierarchical)
- hierarchical.py  two-level all-reduce: ring in the node, ring between nodes on 1/L
- work.py        ``Work``: async handles and the background thread that runs them
- cost.py        the alpha-beta cost model of each algorithm

Docs: docs/collectives.md. Demos: demos/02_collectives.py, demos/03_ring_allreduce.py.
Tests: tests/comm/collectives/. Bench: bench/bench_collectives.py.
"""
