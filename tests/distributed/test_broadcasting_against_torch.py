"""Broadcasting add, sub, mul against PyTorch's DTensor (gloo on the CPU): the same output
placements as torch's sharding propagation and the same values.

Two batches, in one torch world: every pair of placements of a (4, 6) tensor with a (6,), (1, 6), (4, 1),
(2, 4, 6) or (4, 6) one on a mesh of 4 (shapes whose cut dims are at least the mesh long,
so that torch and minidist cut them alike), and cases drawn from a fixed seed on meshes
(4,) and (2, 2). Run on the NumPy backend only, as test_against_torch.py.
"""
import itertools

import numpy as np
import pytest

from minidist.backend import get_backend
from oracles.optional import require
from tests.distributed.test_broadcasting_rules import _kinds, oracle
from tests.distributed.test_ops import op_case
from tests.distributed.worlds import world_fixture

require("torch")
torch_dtensor = pytest.importorskip("tests.distributed.torch_dtensor")

pytestmark = pytest.mark.skipif(get_backend() != "numpy",
                                reason="an oracle test: minidist's side runs under guard elsewhere")
world = world_fixture([4])
SHAPES = [(6,), (1, 6), (4, 1), (2, 4, 6), (4, 6)]


def _case(rng, op, shapes, placements, mesh):
    inputs = [rng.standard_normal(s) for s in shapes]
    weight = rng.standard_normal(np.broadcast_shapes(*shapes))
    return dict(mesh=mesh, op=op, inputs=inputs, placements=placements, weight=weight)


def pair_cases():
    """Every op, shape pair and pair of placements on a mesh of 4 (module docstring)."""
    rng = np.random.default_rng(5)
    out = []
    for op, other in itertools.product(("add", "sub", "mul"), SHAPES):
        for pa, pb in itertools.product(_kinds(2), _kinds(len(other))):
            if any(p[0] == "S" and s[p[1]] < 4 for p, s in ((pa, (4, 6)), (pb, other))):
                continue
            out.append(_case(rng, op, [(8, 6), tuple(8 if n == 4 else n for n in other)],
                             [[pa], [pb]], (4,)))
    return out


def drawn_cases():
    """Cases on meshes (4,) and (2, 2): shapes (8, 6) and a broadcast partner whose cut
    dims are at least the mesh dim long."""
    rng = np.random.default_rng(7)
    out = []
    for i in range(24):
        mesh = [(4,), (2, 2)][i % 2]
        other = SHAPES[int(rng.integers(len(SHAPES)))]
        other = tuple(8 if n == 4 else n for n in other)
        specs = []
        for shape in ((8, 6), other):
            kinds = [k for k in _kinds(len(shape)) if k[0] != "S" or shape[k[1]] >= 4]
            specs.append([kinds[int(rng.integers(len(kinds)))] for _ in mesh])
        op = ["add", "sub", "mul"][int(rng.integers(3))]
        out.append(_case(rng, op, [(8, 6), other], specs, mesh))
    return out


def run_cases(cases):
    return [op_case(case) for case in cases]


def _compare(cases, theirs, ours):
    """The number of cases whose placements agree with torch's; values agree in all."""
    agreed = 0
    for case, their_ranks, (out, placements, _, warned) in zip(cases, theirs, ours):
        what = (case["op"], [x.shape for x in case["inputs"]], case["placements"], case["mesh"])
        their = their_ranks[0]
        assert not isinstance(their[0], str), (what, their)        # torch takes every case
        assert not warned, (what, warned)
        np.testing.assert_allclose(out, their[0], rtol=1e-12, atol=1e-12, err_msg=str(what))
        np.testing.assert_allclose(out, oracle(case)[0], rtol=1e-12, atol=1e-12)
        agreed += placements == their[1]
    return agreed


def test_broadcasting_ops_match_torch_dtensor_on_1d_and_2d_meshes(world):
    """Both batches in one torch world (its start is most of the time). Every pair on the
    mesh of 4 agrees; of the drawn cases one may differ in placements (never in values):
    a - b with a [Shard(1), Shard(1)] and b [Partial, Shard(0)] on (2, 2), where moving a
    or b on mesh dim 1 costs torch's estimate the same to the last bit and the two
    libraries break the tie apart."""
    pairs, drawn = pair_cases(), drawn_cases()
    theirs = torch_dtensor.run(4, "op", pairs + drawn)
    ours = world.run(run_cases, pairs + drawn)[0]
    n = len(pairs)
    assert _compare(pairs, theirs[:n], ours[:n]) == n
    assert _compare(drawn, theirs[n:], ours[n:]) >= len(drawn) - 1
