"""Communication between processes: point-to-point transports, the launcher,
process groups, and every collective built from send/recv.

    transport.py    the point-to-point interface; local.py (shared memory),
                    mpi.py (mpi4py); shm.py the segment layout
    launch.py       World / launch: spawn ranks, collect results, fail loudly
    group.py        ProcessGroup, init_process_group, new_group; mesh.py DeviceMesh
    p2p.py          send, recv, isend, irecv, recv_reduce
    collectives.py  broadcast, reduce, all_reduce, all_gather, reduce_scatter,
                    gather, scatter, all_to_all, barrier
    ring.py, tree.py, all_reduce.py   the algorithms; check.py the same-call check
    cost.py         the alpha-beta cost model; work.py async handles

This package imports only ``minidist.backend`` (never nn, autograd or parallel).
"""
from minidist.comm.collectives import (all_gather, all_gather_into_tensor, all_reduce,
                                       all_to_all, barrier, broadcast, gather, reduce,
                                       reduce_scatter, reduce_scatter_tensor, scatter)
from minidist.comm.errors import (CollectiveMismatchError, CommError, CommTimeoutError,
                                  MessageMismatchError, RankFailedError, WorldAbortedError)
from minidist.comm.group import (NON_GROUP_MEMBER, ProcessGroup, destroy_process_group,
                                 get_rank, get_world_size, init_process_group, is_initialized,
                                 launched, new_group)
from minidist.comm.launch import World, launch
from minidist.comm.mesh import DeviceMesh
from minidist.comm.ops import ReduceOp
from minidist.comm.p2p import irecv, isend, recv, recv_reduce, send
from minidist.comm.work import Work
