"""The recompute extension point: a context captured at forward time wraps the recompute.

A capture registered with ``register_recompute_context`` is called when a
checkpointed forward runs; the context manager it returns is entered around that
block's recompute in backward and exited after it, once per recompute, also when
the recompute raises.
"""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

from minidist import Tensor, backend
from minidist.autograd import checkpoint, recompute


@pytest.fixture
def log(monkeypatch):
    """A registered capture that records the forward's ``mode`` and what runs inside it."""
    events, state = [], {"mode": "outer"}
    monkeypatch.setattr(recompute, "_captures", list(recompute._captures))

    def capture():
        mode = state["mode"]

        @contextlib.contextmanager
        def reenter():
            previous, state["mode"] = state["mode"], mode
            events.append(("enter", mode))
            try:
                yield
            finally:
                state["mode"] = previous
                events.append(("exit", mode))
        return reenter()

    recompute.register_recompute_context(capture)
    recompute.register_recompute_context(capture)      # registering twice keeps one
    return events, state


def test_the_recompute_runs_inside_the_forwards_context(log):
    events, state = log
    seen = []

    def block(t):
        seen.append(state["mode"])
        return t * 2.0

    x = Tensor(backend.from_host(np.ones(3)), requires_grad=True)
    state["mode"] = "forward-mode"
    out = checkpoint(block, x)
    state["mode"] = "after"
    out.sum().backward()
    assert seen == ["forward-mode", "forward-mode"]     # forward, then its recompute
    assert events == [("enter", "forward-mode"), ("exit", "forward-mode")]
    assert state["mode"] == "after"
    np.testing.assert_array_equal(backend.to_host(x.grad), np.full(3, 2.0))


def test_a_failing_recompute_still_leaves_the_context(log):
    events, state = log
    calls = []

    def block(t):
        calls.append(1)
        if len(calls) == 2:
            raise ValueError("boom in the recompute")
        return t * 2.0

    out = checkpoint(block, Tensor(backend.from_host(np.ones(2)), requires_grad=True))
    with pytest.raises(ValueError, match="boom"):
        out.sum().backward()
    assert events == [("enter", "outer"), ("exit", "outer")]
    assert state["mode"] == "outer"
