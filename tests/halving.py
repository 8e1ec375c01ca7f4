"""The guard pass's property tests draw half their examples (tests/conftest.py)."""
from hypothesis import settings


def halve_examples(test) -> None:
    """A property test's examples, halved on another backend's pass: what that pass
    looks for (a host conversion the backend refuses) depends on the code path a call
    takes, which the first half of the (derandomized, on CI) examples reaches as the
    NumPy pass's whole does for the values; the NumPy pass keeps them all."""
    given = getattr(test, "_hypothesis_internal_use_settings", None)
    if given is not None and given.max_examples > 2:
        test._hypothesis_internal_use_settings = settings(
            given, max_examples=max(2, given.max_examples // 2))
