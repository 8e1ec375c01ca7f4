"""The flag types of the benchmarks: a count of 0 or a negative rate is a usage
error (argparse prints the usage line and the reason, exit status 2), not a
traceback after minutes of work.

Plain Python on purpose: bench_autograd, bench_attention and bench_gpu parse
their flags before NumPy is imported, since the BLAS thread count must be set
first, and importing minidist (whose calc/cli_args.py has the same types for
the command line) would load NumPy.
"""
import argparse
import math


def _number(kind, ok, rule):
    """A flag type: parse the text as ``kind`` (finite), then require ``ok(value)``."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a{'n integer' if kind is int else ' number'}")
        if not math.isfinite(value) or not ok(value):
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text}")
        return value
    return parse


positive_int = _number(int, lambda v: v >= 1, "a positive integer")           # a count
positive = _number(float, lambda v: v > 0, "a finite number > 0")             # a rate, a size
non_negative = _number(float, lambda v: v >= 0, "a finite number >= 0")       # 0: off


def byte_size(text: str) -> int:
    """A message size in bytes, with an optional K, M or G suffix (powers of 2): 4K, 16M."""
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    return positive_int(text[:-1] if scale > 1 else text) * scale
