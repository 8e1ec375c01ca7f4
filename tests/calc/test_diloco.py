"""calc/diloco.py: DiLoCo sends 1/H of DDP's bytes per step, streaming's peak is 1/F of
DiLoCo's, quantising sends (N-1) of bits/32 of a fragment (an all-gather of codes), and
the bytes equal what the code sends."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.calc import diloco
from minidist.calc.comm import ring_all_reduce_bytes

pytestmark = pytest.mark.host_only  # a cost model: no backend array (tests/conftest.py)


@settings(max_examples=50, deadline=None)
@given(M=st.floats(1e3, 1e12), N=st.integers(2, 64), per=st.integers(1, 8),
       F=st.integers(1, 8), bits=st.sampled_from([4, 8, 16]), c=st.floats(0, 1))
def test_diloco_is_one_over_h_and_streaming_peak_one_over_f(M, N, per, F, bits, c):
    H = per * F
    ddp, plain, stream, quant, _, _ = diloco.diloco_costs(M, N, H, F, bits, c, 1e9)
    assert ddp.bytes_per_step == ring_all_reduce_bytes(M, N)
    assert abs(plain.bytes_per_step - ddp.bytes_per_step / H) <= 1e-9 * ddp.bytes_per_step
    assert abs(stream.peak_bytes_per_step - plain.peak_bytes_per_step / F) <= 1e-9 * M
    assert abs(stream.bytes_per_step - plain.bytes_per_step) <= 1e-9 * M
    codes = M / F * bits / 32                      # what tests/parallel/diloco sends, per sync
    assert abs(quant.bytes_per_step * H / F - (N - 1) * codes) <= 1e-9 * M
    assert abs(quant.bytes_per_step - stream.bytes_per_step * bits / 32 * N / 2) <= 1e-9 * M
    assert ddp.step_seconds >= plain.step_seconds * (1 - 1e-12)
    assert plain.step_seconds >= stream.step_seconds * (1 - 1e-12) and stream.step_seconds >= c


def test_streaming_hides_a_fragment_behind_tau_steps_of_compute():
    # wire of one fragment: 2(N-1)/N * M/F / beta = 0.5 s; tau * c = 0.3 s
    s = diloco.diloco_costs(1e9, 2, 10, 2, 32, compute=0.3, bandwidth=1e9, delay=1)[2]
    assert abs(s.exposed_seconds - 0.2) < 1e-12 and abs(s.step_seconds - (0.3 + 0.2 / 5)) < 1e-12
    hidden = diloco.diloco_costs(1e9, 2, 10, 2, 32, compute=0.3, bandwidth=1e9, delay=2)[2]
    assert hidden.exposed_seconds == 0.0


def test_topk_bytes_are_what_the_hook_sends():
    # tests/parallel/data/test_topk.py measures (N-1) * k * (8 + 8) for float64 values
    t = diloco.diloco_costs(800, 3, 1, 1, 32, 0.0, 1e9, density=0.05, value_bytes=8)[4]
    assert t.bytes_per_step == 2 * 5 * 16


def test_a_syncs_own_copies_hide_under_its_wire():
    # DDP's wire: 2(N-1)/N * M / beta = 1 s (M = 1e9, N = 2, beta = 1e9); copies 0.25 s
    plain = diloco.diloco_costs(1e9, 2, 10, 2, 32, compute=0.5, bandwidth=1e9)[0]
    ddp = diloco.diloco_costs(1e9, 2, 10, 2, 32, compute=0.5, bandwidth=1e9, copies=0.25)[0]
    assert abs(plain.exposed_seconds - 1.0) < 1e-12
    assert abs(ddp.exposed_seconds - 0.75) < 1e-12 and abs(ddp.step_seconds - 1.25) < 1e-12
    longer = diloco.diloco_costs(1e9, 2, 10, 2, 32, compute=2.0, bandwidth=1e9, copies=1.5)[0]
    assert longer.exposed_seconds == 0.0 and longer.step_seconds == 2.0
