"""Under the guard backend, tests/precision runs with CuPy's flush-to-zero imitated
(backend/guard_ftz.py): float32 subnormals are values these tests check, and a GPU
reads them as 0 unless minidist.precision keeps them (precision/subnormals.py)."""
import pytest

from minidist import backend
from minidist.backend import guard_ftz


@pytest.fixture(autouse=True)
def flush_like_cupy():
    if backend.get_backend() != "guard":
        yield
        return
    guard_ftz.flush_subnormals(True)
    try:
        yield
    finally:
        guard_ftz.flush_subnormals(False)
