"""One MPI world of 8 ranks across two hosts (4 on each), over TCP on a veth pair.

Checked against oracles computed in one process: every collective of the comm
suite against NumPy (bitwise, on integer-valued inputs) and the hierarchical
all-reduce on the nodes found; a DDP run and a dp x pp x tp GPT step against
one process; the topology found from the host names (LOCAL_RANK,
LOCAL_WORLD_SIZE, the mesh's TP groups inside a node). And the bytes that
crossed the link, read from each end's interface counters: the hierarchical
all-reduce puts 2(K-1)/K * M/L per rank on it (L ranks per host: 2(K-1)/K * M
per host), the flat ring 2(N-1)/N * M from the one rank of each host whose
neighbour is on the other host; protocol overhead (TCP/IP headers of the
segments, ACKs, libfabric's headers, the same-call check) is bounded by
OVERHEAD. The world starts once (across.py); each test reads its part.
"""
import json
import os

import pytest

pytestmark = pytest.mark.launcher   # the NumPy pass only (tests/conftest.py)

N, PER_HOST = 8, 4
HERE = os.path.dirname(os.path.abspath(__file__))
OVERHEAD = 0.05          # measured 0.15-3.2 % on the veth (docs/running.md)


@pytest.fixture(scope="module")
def parts(hosts):
    before = hosts.counters()
    out = hosts.mpiexec([os.path.join(HERE, "across.py")], N,
                        hosts=f"hosta:{PER_HOST},hostb:{PER_HOST}", timeout=300)
    after = hosts.counters()
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-6000:]
    got = {}
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            part = json.loads(line[len("RESULT "):])
            got[part.pop("part")] = part
    assert "done" in got, out.stdout[-4000:]
    got["link"] = {h: after[h][0] - before[h][0] for h in after}
    return got


def test_bytes_crossed_the_veth_in_both_directions(parts):
    for host, sent in parts["link"].items():
        assert sent > 2 * 2 ** 20, (host, sent)     # at least the byte probes' MiBs


def test_the_topology_is_found_from_the_host_names(parts):
    ranks = parts["topology"]["ranks"]
    assert [r["host"] for r in ranks] == ["hosta"] * PER_HOST + ["hostb"] * PER_HOST
    assert [r["node"] for r in ranks] == [0] * PER_HOST + [1] * PER_HOST
    assert [r["local_rank"] for r in ranks] == list(range(PER_HOST)) * 2
    assert all(r["local_world_size"] == PER_HOST for r in ranks)
    assert parts["topology"]["pp_groups_cross_hosts"]   # tp and dp inside, pp between


def test_every_collective_matches_numpy_across_hosts(parts):
    assert parts["collectives"]["checked"] >= 50


def test_ddp_and_3d_steps_equal_one_process(parts):
    assert parts["ddp"]["max_err"] <= 1e-12
    assert parts["three_d"]["max_err"] <= 1e-12


def test_hierarchical_sends_2_k_minus_1_over_k_m_over_l_per_rank_between_hosts(parts):
    b = parts["bytes"]
    want = b["hier_per_rank"] * b["local"]             # the host's L ranks share its link
    assert b["hier_per_rank"] == 2 * (2 - 1) / 2 * b["m"] / PER_HOST
    for host, sent in b["sent"]["hierarchical"].items():
        assert want <= sent <= want * (1 + OVERHEAD), (host, sent, want)


def test_the_flat_ring_puts_more_on_the_link_by_the_docs_factor(parts):
    b = parts["bytes"]
    want = b["ring_per_rank"]                          # one rank per host sends across
    for host, sent in b["sent"]["ring"].items():
        assert want <= sent <= want * (1 + OVERHEAD), (host, sent, want)
        ratio = sent / b["sent"]["hierarchical"][host]
        factor = (N - 1) / N * 2 / (2 - 1)             # (N-1)/N * K/(K-1) = 1.75
        assert abs(ratio / factor - 1) <= OVERHEAD, (host, ratio, factor)


def test_round_robin_ranks_make_nodes_of_every_other_rank_and_tp_stays_inside(hosts):
    out = hosts.mpiexec([os.path.join(HERE, "round_robin.py")], 4, hosts="hosta,hostb",
                        timeout=120)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-4000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))
    got = json.loads(line[len("RESULT "):])
    assert got["hosts"] == ["hosta", "hostb", "hosta", "hostb"]
    assert got["nodes"] == [[0, 2], [1, 3]] and got["local_ranks"] == [0, 0, 1, 1]
    assert got["tp"] == [0, 2]
