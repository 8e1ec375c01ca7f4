"""Does minidist compute the same on this backend as on NumPy? ``minidist selftest``.

- compare.py: running one computation on two backends, and the two rules
  (bit for bit; the flash-attention "at most twice NumPy's error" rule)
- checks.py: the comparison suite, one named check per line of output
- command.py: the subcommand, which also runs the property suite (pytest) under
  ``MINIDIST_BACKEND`` in a subprocess

On a GPU machine: ``minidist selftest --backend cupy`` (docs/gpu.md).
"""
from minidist.selftest.checks import CHECKS
from minidist.selftest.compare import BITWISE, TWICE, Check, Result, run_check

__all__ = ["CHECKS", "Check", "Result", "run_check", "BITWISE", "TWICE"]
