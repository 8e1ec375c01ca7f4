"""Two computations taking turns at each collective in flight (interleave.py), without
a world: stand-in ``Work``s that have already landed."""
import pytest

from minidist.comm.collectives.interleave import Turns, hand_over, paired

pytestmark = pytest.mark.host_only


def test_turns_run_one_half_at_a_time_handing_over_at_each_collective():
    """Without a world: two halves that hand over at stand-in collectives run in the
    order the hand-overs fix; the first half's error is raised after both ended."""
    from minidist.comm.collectives.interleave import Turns, hand_over, paired

    class Landed:
        def wait(self):
            return True

    order = []

    def half(name, n):
        def run():
            for k in range(n):
                order.append((name, k, paired()))
                hand_over(Landed())
        return run

    Turns(("a", "b")).run(half("a", 3), half("b", 2))
    assert order == [("a", 0, True), ("b", 0, True), ("a", 1, True), ("b", 1, True),
                     ("a", 2, True)]
    assert not paired()

    def fails():
        raise ValueError("in the first half")
    with pytest.raises(ValueError, match="in the first half"):
        Turns(("a", "b")).run(fails, half("b", 2))


def test_a_second_halfs_error_is_raised_after_the_first_half_ran_to_its_end():
    ran = []

    def first():
        for k in range(3):
            ran.append(k)
            hand_over(_Landed())

    def second():
        raise RuntimeError("in the second half")
    with pytest.raises(RuntimeError, match="in the second half"):
        Turns(("a", "b")).run(first, second)
    assert ran == [0, 1, 2]


class _Landed:
    def wait(self):
        return True
