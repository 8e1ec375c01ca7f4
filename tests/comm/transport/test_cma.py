"""cma.read copies bytes out of a process's memory (here our own, by its
address), and reports a refused read (a bad address) as False, not an error."""
import os

import numpy as np
import pytest

from minidist.comm.transport import cma

pytestmark = pytest.mark.skipif(not cma.available(), reason="no process_vm_readv here")


def test_read_copies_the_bytes_at_an_address():
    src = np.arange(1000, dtype="float64")
    out = np.zeros(300, dtype="float64")
    assert cma.read(os.getpid(), cma.host_address(src) + 100 * 8, out)
    assert np.array_equal(out, src[100:400])


def test_a_refused_read_returns_false():
    out = np.zeros(4, dtype="uint8")
    assert not cma.read(os.getpid(), 8, out)  # page 0 is never mapped
    assert cma.read(os.getpid(), 8, out[:0])  # nothing to read: done


def test_host_address_is_none_for_a_strided_array():
    a = np.zeros(10)
    assert cma.host_address(a[::2]) is None
