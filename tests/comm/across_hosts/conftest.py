"""Two hosts made of this machine (scripts/two_hosts.py), one pair per test module.

Where they cannot be made (not root, no iproute2, no namespaces) the tests fail
with the reason; ``MINIDIST_SKIP_TWO_HOST=1`` skips them instead, on purpose.
"""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import two_hosts  # noqa: E402  (scripts/two_hosts.py)

SKIP_ENV = "MINIDIST_SKIP_TWO_HOST"


@pytest.fixture(scope="module")
def can_make_hosts():
    """Skip on purpose, fail with the reason, or go on."""
    if os.environ.get(SKIP_ENV) == "1":
        pytest.skip(f"{SKIP_ENV}=1: the two-host tests are skipped on purpose")
    reason = two_hosts.why_unavailable()
    if reason:
        pytest.fail(f"two hosts cannot be made here: {reason} "
                    f"(set {SKIP_ENV}=1 to skip these tests)", pytrace=False)


@pytest.fixture(scope="module")
def hosts(can_make_hosts):
    with two_hosts.TwoHosts(lifetime=400) as made:
        yield made

