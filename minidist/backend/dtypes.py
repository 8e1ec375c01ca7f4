"""A dtype from its name, ml_dtypes' included.

``dtype.str`` does not say which ml_dtypes type an array holds: bfloat16's is '<V2'
(void) and float8_e4m3fn's '<f1', so an array rebuilt from it comes back as raw
bytes. ``dtype.name`` ('bfloat16', 'float8_e4m3fn', 'float32') does; a record that
travels (a checkpoint's index, the healing buffer's skeleton) names its dtype so.
"""
from __future__ import annotations

import numpy as np


def named_dtype(name: str) -> np.dtype:
    """The dtype ``name`` names: NumPy's, or ml_dtypes' (bfloat16, float8_e4m3fn, ...).
    ValueError, saying what to install, when neither knows it."""
    try:
        return np.dtype(name)           # ml_dtypes' names too, once it is imported
    except TypeError:
        pass
    try:
        import ml_dtypes
    except ImportError:
        raise ValueError(f"dtype {name!r} needs the ml_dtypes package: "
                         "pip install ml_dtypes") from None
    found = getattr(ml_dtypes, name, None) if name.isidentifier() else None
    if not isinstance(found, type):
        raise ValueError(f"dtype {name!r} is known neither to NumPy nor to ml_dtypes") from None
    return np.dtype(found)


def is_numpy_scalar(value: object) -> bool:
    """A NumPy scalar (np.float64(1.5), np.int64(3)): no plain Python value, no array."""
    return isinstance(value, np.generic)
