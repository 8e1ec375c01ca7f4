"""Moving bytes between ranks: the point-to-point layer every collective is written on.

    h = t.isend(arr, dst, tag, ctx);  h = t.irecv(arr, src, tag, ctx, op=None);  t.wait_all(...)

Files, in reading order:

- base.py       the ``Transport`` interface (isend, irecv, receive-and-reduce, wait_all)
- reduce_op.py  ``ReduceOp`` (SUM, AVG, MAX, MIN, PROD): what a receive-and-reduce applies
- shm.py        the shared-memory segment of a local world and its layout
- wait.py       ``Backoff``: how every wait spins, then yields, then sleeps, and why
- doorbell.py   futex doorbells: how a waiting rank sleeps until a peer has news
- flight.py     the flight recorder: each rank's last call, in shared memory, to name who hangs
- pending.py    pending sends and receives of the local transport, where a piece lands
- local.py      ``LocalTransport``: messages through shared memory, pipelined in slots
- local_wait.py how the local transport waits, and the three ways a wait ends early
- short_way.py  the local transport's fast paths for ``exchange`` and ``sendrecv``
- board.py      one slot per rank that every peer reads in place: small collectives' latency path
- cma.py        single-copy reads of a peer's memory (Linux process_vm_readv), for all-to-all
- link.py       an emulated link: bytes that take M / beta on the wire while the CPU is free
- topology.py   which ranks share a machine: found from host names (MPI) or declared
- mpi.py        ``MPITransport``: the same interface on mpi4py, across machines

Docs: docs/collectives.md. Tests: tests/comm/transport/ and tests/comm/collectives/test_p2p.py.
"""
