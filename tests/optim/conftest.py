"""The ``torch`` fixture: PyTorch as the oracle, or a skip where it is not installed.

A fixture instead of a module-level ``importorskip`` so that only the tests that
compare against PyTorch are skipped, not their neighbours.
"""
import pytest
from oracles.optional import require


@pytest.fixture
def torch():
    return require("torch")
