"""Tests of ``minidist.autograd`` (a package, so module names here never clash
with same-named test files elsewhere in the suite)."""
