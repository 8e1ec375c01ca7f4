"""The library's ring under the properties that grade exercise 35.2 (one suite, two subjects)."""
from minidist.exercises.collectives import RING
from minidist.exercises.core import Subject
from minidist.exercises.grading import check


def test_ring_module_holds_the_exercise_properties(tmp_path):
    # chunk_bounds straight from minidist.comm.collectives.ring; the all-reduce through
    # the exercise's interface, on real processes
    library = Subject("minidist.comm.collectives.ring")
    assert check(RING, library, max_examples=20)[0].passed
    solution = tmp_path / RING.filename
    solution.write_text(RING.solution)
    results = check(RING, Subject(solution))
    assert all(r.passed for r in results), "\n".join(l for r in results for l in r.lines())
