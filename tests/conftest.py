"""Suite-wide settings: the backend under test and the hypothesis profile.

The suite runs once per backend: ``pytest`` (NumPy) and
``MINIDIST_BACKEND=guard pytest`` (CuPy-like arrays that refuse implicit host
conversion). Hypothesis examples are derandomized on CI so a run is repeatable.
"""
import os

from hypothesis import HealthCheck, settings

from minidist import backend
from oracles.optional import hide_if_asked

HIDDEN = hide_if_asked(backend.get_backend())

settings.register_profile(
    "default", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "ci", deadline=None, derandomize=True, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else "default")


def pytest_report_header(config):
    hidden = f"; hidden: {', '.join(HIDDEN)}" if HIDDEN else ""
    return f"minidist backend: {backend.get_backend()}{hidden}"
