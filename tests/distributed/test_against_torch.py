"""minidist's DTensor against PyTorch's on the same inputs (gloo on the CPU).

The same drawn cases (meshes (3,), (4,) and (2, 2), uneven and empty
pieces, three dtypes, every pair of placements) run through torch's
``distribute_tensor(...).redistribute(...)`` and minidist's; every rank's local
piece and the placements must agree: bit for bit where no Partial sum is
involved, to 1e-12 (float64) / 1e-5 (float32) where one is. Pairs that torch
refuses are skipped (minidist goes through Replicate instead).

Run on the NumPy backend only: torch's side does not change with the backend, and
minidist's side of every case (``redistribute_case``, ``every_pair_case``,
``rule_case``) runs under the guard backend in test_redistribute.py, test_ops.py
and test_propagation_rules.py.
"""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.distributed.test_propagation_rules import (TABLE, Drawn, _name, make_case, oracle, rule_case,
                                                      table_cases)
from tests.distributed.test_redistribute import cases, redistribute_case
from minidist.backend import get_backend
from tests.distributed.worlds import world_fixture
from oracles.optional import require

require("torch")
torch_dtensor = pytest.importorskip("tests.distributed.torch_dtensor")

pytestmark = pytest.mark.skipif(get_backend() != "numpy",
                                reason="an oracle test: minidist's side runs under guard elsewhere")
world = world_fixture([3, 4])
BATCH = 12


@settings(max_examples=1, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_redistribute_matches_torch_dtensor(world, data):
    n = world.world_size
    batch = [data.draw(cases(n)) for _ in range(BATCH)]
    theirs = torch_dtensor.run(n, "redistribute", batch)
    compared = 0
    for case, torch_ranks in zip(batch, theirs):
        ours = world.run(redistribute_case, case)
        if isinstance(torch_ranks[0][0], str) and torch_ranks[0][0] == "refused":
            continue
        compared += 1
        partial = any(p[0] == "P" for p in case["src"] + case["dst"])
        tol = 0.0 if not partial else (1e-12 if case["full"].dtype == np.float64 else 1e-5)
        for (coord, local, _, _), (their_local, their_placements) in zip(ours, torch_ranks):
            assert local.shape == their_local.shape, (case, coord)
            np.testing.assert_allclose(local, their_local, rtol=tol, atol=tol)
            expected = [repr(p) for p in torch_dtensor._placements(case["dst"])]
            assert their_placements == expected
    assert compared >= BATCH // 2


def _op_cases():
    from tests.distributed.test_ops import _all_cases
    cases = _all_cases(11)
    for case in cases:
        case["mesh"] = (4,)
    return cases


def _drawn_rule_cases():
    rng = np.random.default_rng(30)
    return [make_case(Drawn(rng=rng), [(4,), (2, 2)][i % 2]) for i in range(2 * BATCH)]


@pytest.fixture(scope="module")
def torch_on_4():
    """torch's results for the op cases and the drawn rule cases, from one start of 4
    processes (each imports torch: seconds)."""
    ops, rules = torch_dtensor.run_batches(4, [("op", _op_cases()), ("rule", _drawn_rule_cases())])
    return {"op": ops, "rule": rules}


def test_propagated_ops_match_torch_dtensor(world, torch_on_4):
    """Every op and pair of placements for which minidist has a rule (no fallback): the
    same output placements as torch's sharding propagation and the same values."""
    from tests.distributed.test_ops import every_pair_case
    if world.world_size != 4:
        return
    cases = _op_cases()
    theirs = torch_on_4["op"]
    ours = world.run(every_pair_case, 11)
    compared = 0
    for i, case in enumerate(cases):
        out, placements, _, warned = ours[0][i]
        if warned or isinstance(theirs[i][0][0], str):         # torch refused the pair
            continue
        # torch does not shard a dimension shorter than the mesh (it replicates instead)
        if any(p[0] == "S" and full.shape[p[1]] < 4
               for full, spec in zip(case["inputs"], case["placements"]) for p in spec):
            continue
        compared += 1
        their_out, their_placements = theirs[i][0]
        assert placements == their_placements, (case["op"], case["placements"])
        np.testing.assert_allclose(out, their_out, rtol=1e-12, atol=1e-12)
    assert compared >= 10


def test_rule_table_matches_torch_dtensor():
    """Every row of the rule table of test_propagation_rules.py (mesh of 2): torch's
    output placements are the table's and its values the single-process op's. Rows
    torch refuses (rms_norm over its cut dim, an uneven regroup by view) or keeps as a
    _StridedShard (an inner dim of a merge, which minidist gathers) are not compared."""
    cases = table_cases()
    compared = 0
    for case, row, theirs in zip(cases, TABLE, torch_dtensor.run(2, "rule", cases)):
        if isinstance(theirs[0][0], str) or "_StridedShard" in theirs[0][1][0]:
            continue
        compared += 1
        out, placements = theirs[0]
        assert placements == [_name(p) for p in row[4]], row
        np.testing.assert_allclose(out, oracle(case)[0], rtol=1e-12, atol=1e-12)
    assert compared >= len(TABLE) - 3


def _comparable(case):
    """Whether torch picks the rule minidist has: torch does not shard a dimension shorter
    than the mesh dim (it replicates instead); for a norm with a Partial input it picks,
    by cost, a reduce-scatter to Shard(0) where minidist all-reduces to Replicate; its
    rms_norm on the CPU is a composite of pointwise ops, which keeps a cut weight cut."""
    specs = case["placements"]
    if any(p[0] == "S" and full.shape[p[1]] < n for full, spec in zip(case["inputs"], specs)
           for n, p in zip(case["mesh"], spec)):
        return False
    if case["op"] in ("layer_norm", "rms_norm") and any(p[0] == "P" for s in specs for p in s):
        return False
    return case["op"] != "rms_norm" or all(p == ("R",) for p in specs[1])


def test_drawn_rules_match_torch_dtensor(world, torch_on_4):
    """Cases of the new rules drawn at random (a fixed seed) on meshes (4,) and (2, 2):
    the same output placements as torch's sharding propagation and the same values."""
    if world.world_size != 4:
        return
    cases = _drawn_rule_cases()
    theirs = torch_on_4["rule"]
    ours = world.run(rule_case, cases)[0]
    compared = 0
    for case, their_ranks, (out, placements, _, warned) in zip(cases, theirs, ours):
        their = their_ranks[0]
        if warned or isinstance(their[0], str) or any("Strided" in p for p in their[1]):
            continue
        if not _comparable(case):
            continue
        compared += 1
        assert placements == their[1], (case["op"], case["arg"], case["placements"])
        np.testing.assert_allclose(out, their[0], rtol=1e-12, atol=1e-12)
    assert compared >= BATCH // 2
