"""minidist's DTensor against PyTorch's on the same inputs (gloo on the CPU).

The same drawn cases (meshes (3,), (4,) and (2, 2), uneven and empty
pieces, three dtypes, every pair of placements) run through torch's
``distribute_tensor(...).redistribute(...)`` and minidist's; every rank's local
piece and the placements must agree: bit for bit where no Partial sum is
involved, to 1e-12 (float64) / 1e-5 (float32) where one is. Pairs that torch
refuses are skipped (minidist goes through Replicate instead).
"""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.distributed.test_redistribute import cases, redistribute_case
from tests.distributed.worlds import world_fixture

pytest.importorskip("torch")
torch_dtensor = pytest.importorskip("tests.distributed.torch_dtensor")

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
        if torch_ranks[0][0] == "refused":
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
