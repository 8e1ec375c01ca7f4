"""compare: one model, one seed, the same batches under two layouts; where do they part?

    from minidist.parallel.compare import RunSpec, compare, parse_layout
    report = compare(spec, parse_layout("dp=2 tp=2"), parse_layout("single"))

torchtitan's and Megatron's users ask why a 4-D run's loss differs from a 1-D
run's; here every layout equals one process up to the order of its sums, so the
question has an exact answer: the step and the tensor where two runs first part,
and whether that is a reordered sum, a rounding format or a bug.

Files, in reading order:

    layout.py    "dp_replicate=2 tp=2" -> Layout (torchtitan's dimension names), refusals
    run.py       one layout's run: per step the loss, every gradient and parameter piece
                 with the dense positions of its elements
    diff.py      ulps, the tolerance, the summation-order bound and the cause
    api.py       compare(): both runs, per-step losses, the first parting tensor
    command.py   `minidist compare --a ... --b ... --steps K` (exit 1 past the tolerance
                 with --assert-equal, 2 on a usage error)
    measure.py   one layout's run timed and its peak memory per rank: what
                 `minidist plan --measure` holds the planner's predictions against
"""
from minidist.parallel.compare.api import Report, StepLine, compare
from minidist.parallel.compare.diff import BUG, REORDERED, ROUNDING, Parting, Tolerance, ulps
from minidist.parallel.compare.layout import Layout, LayoutError, check_layout, parse_layout
from minidist.parallel.compare.run import Plant, RunSpec

__all__ = ["compare", "Report", "StepLine", "Parting", "Tolerance", "ulps", "Layout",
           "LayoutError", "parse_layout", "check_layout", "Plant", "RunSpec", "BUG",
           "REORDERED", "ROUNDING"]
