"""Communication between processes: what a user meets first, and two layers below it.

    group.py        ProcessGroup, init_process_group, new_group, get_rank, get_world_size
    stats.py        CommStats: the bytes and messages a rank moved, per collective and last
    mesh.py         DeviceMesh: ranks on a grid (dp x pp x tp ...), a group per axis
    errors.py       what fails, loudly: timeouts, mismatched calls, a failed rank
    launch/         World / launch: spawn ranks, collect results, fail loudly
    collectives/    every collective built from send/recv, the same-call check, the cost
                    model, async handles (its __init__ lists the files)
    transport/      moving bytes: the point-to-point interface, shared memory, the emulated
                    link, MPI (its __init__ lists the files)

This package imports only ``minidist.backend`` (never nn, autograd or parallel).
"""
from minidist.comm.collectives.api import (all_gather, all_gather_into_tensor, all_reduce,
                                           all_to_all, barrier, broadcast, gather, reduce,
                                           reduce_scatter, reduce_scatter_tensor, scatter)
from minidist.comm.collectives.api import all_to_all_single
from minidist.comm.errors import (CollectiveMismatchError, CommError, CommTimeoutError,
                                  MessageMismatchError, NestedWorldError, NotThisRankError,
                                  PeerDiedError, PeerFinishedError, RankFailedError,
                                  WorldAbortedError, WorldTimeoutError)
from minidist.comm.group import (NON_GROUP_MEMBER, ProcessGroup, destroy_process_group,
                                 get_node_local_rank, get_rank, get_topology, get_world_size,
                                 init_process_group, is_initialized, launched, new_group)
from minidist.comm.launch import World, launch
from minidist.comm.mesh import DeviceMesh
from minidist.comm.transport.reduce_op import ReduceOp
from minidist.comm.collectives.p2p import irecv, isend, recv, recv_reduce, send
from minidist.comm.collectives.work import Work
