"""A world per size kept up for a test module, started again after a failing case."""
import pytest

from minidist.comm import World


class Restarting:
    """A world of ``n`` ranks; a case that brought it down starts a fresh one, so
    hypothesis can replay the failure and report it."""

    def __init__(self, n: int, **kwargs):
        self.kwargs = {"timeout": 20.0, "run_timeout": 90.0, **kwargs}   # World's options
        self.world_size, self.world = n, World(n, **self.kwargs)

    def run(self, fn, *args):
        if self.world.closed:
            self.world = World(self.world_size, **self.kwargs)
        return self.world.run(fn, *args)

    def close(self):
        self.world.close()


def world_fixture(sizes):
    """A module-scoped fixture giving a ``Restarting`` world of each size in turn."""
    @pytest.fixture(scope="module", params=sizes, ids=lambda n: f"world{n}")
    def world(request):
        w = Restarting(request.param)
        yield w
        w.close()
    return world


class Worlds:
    """Worlds by size, each started the first time a case asks for it and kept up for
    the module: ``worlds(n)`` is a ``Restarting`` world of ``n`` ranks, so hypothesis
    can draw the world size with the rest of a case."""

    def __init__(self, **kwargs):
        self.kwargs, self.by_size = kwargs, {}

    def __call__(self, n: int) -> Restarting:
        if n not in self.by_size:
            self.by_size[n] = Restarting(n, **self.kwargs)
        return self.by_size[n]

    def close(self):
        for w in self.by_size.values():
            w.close()


def worlds_fixture(**kwargs):
    """A module-scoped ``Worlds`` fixture (``kwargs``: World's options, e.g. slot_bytes)."""
    @pytest.fixture(scope="module")
    def worlds():
        pool = Worlds(**kwargs)
        yield pool
        pool.close()
    return worlds
