"""Suite-wide settings: the backend under test and the hypothesis profile.

The suite runs once per backend: ``pytest`` (NumPy) and
``MINIDIST_BACKEND=guard pytest`` (CuPy-like arrays that refuse implicit host
conversion). Hypothesis examples are derandomized on CI so a run is repeatable.

A test module that makes no backend array (cost models and the planner's
arithmetic, the docs, the layering, a demo's usage error) is marked
``host_only``: it cannot meet a CuPy rule, so it runs on the NumPy pass only and
another backend's pass deselects it. A module marked ``launcher`` tests how worlds
of processes start, stop, restart, time out and report (the launcher, the two-host
link, a killed save): its arrays take the paths the math tests already take through
every backend, so it too runs on the NumPy pass only. Another backend's pass draws half
the examples of each property test (tests/halving.py).
"""
import os

# One BLAS thread per process unless the caller chose: the suite runs in two pytest
# workers on two cores (README's test command) and its multi-process tests start ranks
# and demos of their own, all of which inherit this. OpenBLAS's threads spin while they
# wait for work, so with more threads than cores a small matmul costs many times its
# CPU time (demo 09 at the suite's settings: 40 s of CPU with a thread per core, 5 s
# with one). Set before NumPy loads OpenBLAS, which reads it once (a plugin that loaded
# NumPy first would leave this process as it is; the processes it starts still follow).
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

from hypothesis import HealthCheck, settings  # noqa: E402

from minidist import backend  # noqa: E402
from halving import halve_examples  # noqa: E402
from oracles.optional import hide_if_asked  # noqa: E402

HIDDEN = hide_if_asked(backend.get_backend())

settings.register_profile(
    "default", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "ci", deadline=None, derandomize=True, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else "default")


def pytest_collection_modifyitems(config, items):
    """On a backend other than NumPy, deselect the ``host_only`` and ``launcher`` tests,
    and draw half the examples of each property test (at least 2)."""
    if backend.get_backend() == "numpy":
        return
    numpy_only = [item for item in items if _numpy_pass_only(item)]
    if numpy_only:
        config.hook.pytest_deselected(items=numpy_only)
        items[:] = [item for item in items if not _numpy_pass_only(item)]
    for test in {id(item.obj): item.obj for item in items if hasattr(item, "obj")}.values():
        halve_examples(test)           # once per function: a parametrized one has many items


def _numpy_pass_only(item) -> bool:
    return bool(item.get_closest_marker("host_only") or item.get_closest_marker("launcher"))


def pytest_report_header(config):
    hidden = f"; hidden: {', '.join(HIDDEN)}" if HIDDEN else ""
    return f"minidist backend: {backend.get_backend()}{hidden}"
