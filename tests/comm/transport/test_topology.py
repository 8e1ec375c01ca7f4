"""The topology found from host names (transport/topology.py), against a direct count.

Hypothesis draws the host name of every rank (any interleaving, any number of
ranks per host); the oracle is the definition: ranks with the same host name
are one node, numbered by first rank, local ranks in increasing global rank.
The override MINIDIST_NODE_SIZE splits each host into consecutive local ranks,
and is refused, naming the counts, where it would make a node span two hosts.
"""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.comm.transport import topology

hosts_st = st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(hosts=hosts_st)
def test_a_node_is_the_ranks_of_one_host(hosts):
    topo = topology.from_hosts(hosts)
    order = list(dict.fromkeys(hosts))                 # hosts by first rank
    for rank, host in enumerate(hosts):
        same = [r for r, h in enumerate(hosts) if h == host]
        assert topo.node_of[rank] == order.index(host)
        assert topo.local_ranks[rank] == same.index(rank)
        assert topo.local_world_size(rank) == len(same)
    assert topo.nodes() == [[r for r, h in enumerate(hosts) if h == host] for host in order]


@settings(max_examples=60, deadline=None)
@given(hosts=hosts_st, size=st.integers(1, 4))
def test_the_override_splits_hosts_or_names_the_counts(hosts, size):
    counts = {h: hosts.count(h) for h in hosts}
    if any(c % size for c in counts.values()):
        with pytest.raises(ValueError, match="a node cannot span two machines") as e:
            topology.from_hosts(hosts, size)
        assert all(f"{h}: {c}" in str(e.value) for h, c in counts.items())
        return
    topo = topology.from_hosts(hosts, size)
    assert topo.node_size == size
    for members in topo.nodes():                       # inside one host, consecutive there
        assert len({hosts[r] for r in members}) == 1
        on_host = [r for r, h in enumerate(hosts) if h == hosts[members[0]]]
        start = on_host.index(members[0])
        assert members == on_host[start:start + size]
        assert [topo.local_ranks[r] for r in members] == list(range(size))


def test_uneven_nodes_are_an_error_naming_each_host():
    topo = topology.from_hosts(["a", "a", "a", "b"])
    with pytest.raises(ValueError, match=r"node 0 \(a\): 3 ranks \[0, 1, 2\], node 1 \(b\): 1"):
        topo.node_size


def test_the_environment_override_is_a_whole_number(monkeypatch):
    monkeypatch.setenv("MINIDIST_NODE_SIZE", "two")
    with pytest.raises(ValueError, match="MINIDIST_NODE_SIZE='two'"):
        topology.env_node_size()
    monkeypatch.setenv("MINIDIST_NODE_SIZE", "2")
    assert topology.env_node_size() == 2
    monkeypatch.delenv("MINIDIST_NODE_SIZE")
    assert topology.env_node_size() is None


def test_export_env_sets_what_torchrun_would(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"):
        # setenv first: monkeypatch then restores the variable (removes it) at the end,
        # which a delenv of an absent variable would not, and the next tests would run as
        # rank 2 of 4
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    import os
    topology.export_env(topology.from_hosts(["a", "b", "a", "b"]), 2)
    assert [os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                    "GROUP_RANK")] == ["2", "4", "1", "2", "0"]
