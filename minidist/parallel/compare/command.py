"""`minidist compare`: two layouts, one model and seed, the same corpus batches; per step
both losses and their ulps, then the first tensor where they part and why.

    minidist compare --a "dp=2 tp=2" --b single --steps 3
    minidist compare --a "tp=2 amp=bf16" --b "tp=2" --dtype float32 --assert-equal

Exit 0, or 1 with --assert-equal when a tensor is past the tolerance; 2 on a usage
error (an unknown dimension, degrees that do not multiply to --world-size, ep that
cannot borrow from dp_shard x cp, a layout the model refuses: cp on the GPT, ep not
dividing the experts, a --block the zigzag layout cannot split, heads that a tp degree
does not divide, micro-batches an interleaved schedule cannot spread), with a message
naming the fix.
"""
from __future__ import annotations

import argparse
import pathlib
import sys
from typing import Callable

import numpy as np

from minidist.comm.errors import RankFailedError
from minidist.parallel.compare.api import Report, compare, show_sharding
from minidist.parallel.compare.diff import Tolerance
from minidist.parallel.compare.layout import (DEGREES, Layout, LayoutError, check_layout,
                                              parse_layout)
from minidist.parallel.compare.run import RunSpec, model_config

CORPUS = pathlib.Path(__file__).resolve().parents[3] / "demos" / "data" / "corpus.txt"


def add_arguments(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    parser.add_argument("--a", required=True, help='a layout, e.g. "dp_replicate=2 tp=2"')
    parser.add_argument("--b", default="single", help="the reference layout (default: single)")
    parser.add_argument("--steps", type=int, default=3, help="training steps (default 3)")
    parser.add_argument("--model", choices=("gpt", "llama", "moe_llama"), default="gpt",
                        help="moe_llama: 4 experts a layer, top 2, with the balancing loss")
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    parser.add_argument("--batch", type=int, default=4, help="global batch rows (default 4)")
    parser.add_argument("--block", type=int, default=8, help="characters per row (default 8)")
    parser.add_argument("--seed", type=int, default=0, help="weights and batches (default 0)")
    parser.add_argument("--atol", type=float, default=1e-9)
    parser.add_argument("--rtol", type=float, default=1e-6)
    parser.add_argument("--bitwise", action="store_true", help="every bit equal")
    parser.add_argument("--world-size", type=int, default=None,
                        help="check that each parallel layout has this many ranks")
    parser.add_argument("--assert-equal", action="store_true",
                        help="exit 1 if a tensor is past the tolerance")
    parser.add_argument("--corpus", default=str(CORPUS), help="a text file (the shipped corpus)")
    parser.add_argument("--show-sharding", metavar="NAME", default=None,
                        help="first print which ranks of layout a hold which block of the "
                             "parameter NAME (e.g. blocks.0.mlp.c_fc.weight)")
    return run


def corpus_batches(path: str, steps: int, batch: int, block: int, seed: int) -> tuple:
    """(vocabulary size, [(idx, targets)] per step): random windows of the text's characters."""
    text = pathlib.Path(path).read_text()
    chars = sorted(set(text))
    ids = np.array([chars.index(c) for c in text[:20000]], dtype=np.int64)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        starts = rng.integers(0, len(ids) - block - 1, batch)
        out.append((np.stack([ids[s:s + block] for s in starts]),              # (B, T)
                    np.stack([ids[s + 1:s + block + 1] for s in starts])))     # (B, T)
    return len(chars), out


def print_report(report: Report) -> None:
    print(f"a: {report.a}\nb: {report.b}")
    print(f"{'step':>4}  {'loss a':>22}  {'loss b':>22}  {'ulps':>6}")
    for line in report.steps:
        print(f"{line.step:>4}  {line.loss_a:>22.17g}  {line.loss_b:>22.17g}  {line.ulps:>6}")
    part = report.parting
    if part is None:
        print("equal within the tolerance at every step")
        return
    where = "" if part.rank is None else f" (rank {part.rank} of a)"
    what = part.kind if part.kind == "loss" else f"{part.kind} of {part.name}"
    print(f"first past the tolerance: the {what} at step {part.step}{where}: "
          f"max |a - b| = {part.max_abs:.3e}, {part.max_ulps} ulps")
    print(f"cause: {part.cause}: {part.why}")


def check_model_layout(spec: RunSpec, layout: Layout, text: str) -> None:
    """Refuse a layout the model cannot take: cp on the GPT (no positions to give a shard),
    ep without experts or not dividing them, a --block the zigzag layout cannot split."""
    from minidist.parallel.compose.parallel_dims import ParallelDims, ParallelDimsError
    if layout.cp > 1 and spec.model == "gpt":
        raise LayoutError(f"layout {text!r}: cp needs a model with rotary positions (each "
                          "rank's shard at its global positions): use --model llama or "
                          "moe_llama")
    dims = ParallelDims(**{d: getattr(layout, d) for d in DEGREES})
    try:
        dims.check_model(model_config(spec), spec.batches[0][0].shape[1])
    except ParallelDimsError as e:
        raise LayoutError(f"layout {text!r}: {e}") from None


def microbatch_rows(layout: Layout, rows: int) -> list:
    """The batch's rows each micro-batch routes together: micro-batch j holds every data
    shard's j-th rows (one group of all rows for ``single``)."""
    if layout.single:
        return [list(range(rows))]
    dp, m = layout.dp_replicate * layout.dp_shard, layout.microbatches
    mine, mb = rows // dp, rows // dp // m
    return [sorted(d * mine + j * mb + i for d in range(dp) for i in range(mb))
            for j in range(m)]


def refuse_other_microbatches(spec: RunSpec, a: Layout, b: Layout) -> None:
    """An MoE balancing loss counts each micro-batch's tokens (f_i), so two layouts that
    group the rows into other micro-batches train other objectives: refused."""
    if spec.model != "moe_llama":
        return
    rows = spec.batches[0][0].shape[0]
    if microbatch_rows(a, rows) != microbatch_rows(b, rows):
        raise LayoutError(
            f"layouts {str(a)!r} and {str(b)!r} route other micro-batches together "
            f"({microbatch_rows(a, rows)} against {microbatch_rows(b, rows)}), and the MoE "
            "balancing loss counts each micro-batch's tokens: they train other objectives. "
            "Give both mb=1 (pipelines: the same mb and dp_replicate x dp_shard)")


def _last_line(e: Exception) -> str:
    """A rank's ValueError message (the last line of its traceback), or the error's own."""
    text = e.remote_traceback if isinstance(e, RankFailedError) else str(e)
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].removeprefix("ValueError: ") if lines else text


def run(ns: argparse.Namespace) -> int:
    try:
        a, b = parse_layout(ns.a), parse_layout(ns.b)
        for layout, text in ((a, ns.a), (b, ns.b)):
            check_layout(layout, text, ns.world_size)
            rows = layout.dp_replicate * layout.dp_shard * layout.microbatches
            if ns.batch % rows:
                raise LayoutError(f"layout {text!r}: --batch {ns.batch} does not split into "
                                  f"dp_replicate x dp_shard x mb = {rows} equal pieces; pick a multiple")
        if ns.steps < 1:
            raise LayoutError("--steps must be at least 1")
        vocab, batches = corpus_batches(ns.corpus, ns.steps, ns.batch, ns.block, ns.seed)
        spec = RunSpec(batches, vocab, ns.model, ns.dtype, ns.seed)
        for layout, text in ((a, ns.a), (b, ns.b)):
            check_model_layout(spec, layout, text)
        refuse_other_microbatches(spec, a, b)
    except LayoutError as e:
        print(f"minidist compare: error: {e}", file=sys.stderr)
        return 2
    try:
        if ns.show_sharding is not None:
            print(show_sharding(spec, a, ns.show_sharding) + "\n")
        report = compare(spec, a, b, Tolerance(ns.atol, ns.rtol, ns.bitwise))
    except (ValueError, RankFailedError) as e:
        if isinstance(e, RankFailedError) and e.exc_type == "KeyError":    # --show-sharding
            print(f"minidist compare: error: {_last_line(e).removeprefix('KeyError: ')}",
                  file=sys.stderr)
            return 2
        if isinstance(e, RankFailedError) and e.exc_type != "ValueError":
            raise                                    # a crash, not a layout the model refuses
        print(f"minidist compare: error: the model refuses the layout: {_last_line(e)}",
              file=sys.stderr)
        return 2
    print_report(report)
    return 1 if ns.assert_equal and report.parting is not None else 0
