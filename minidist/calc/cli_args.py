"""What a ``minidist calc`` topic is, and the checks its flags go through.

A bad number (a negative count, a ZeRO stage of 4, a bandwidth of 0, a
precision the models do not know) is a usage error: argparse prints the usage
line and the reason and exits with status 2, before any formula runs.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class Topic:
    help: str                                   # one line, in `minidist calc --help`
    formula: str                                # shown by `minidist calc TOPIC --help`
    source: str                                 # where the formula comes from, in words
    # (flag, kind, default, help): flag is a name or a tuple of names (the first is the
    # one shown, the others kept as aliases); kind is a parse function (below), a tuple
    # of allowed values, or bool for an on/off switch; default None = required,
    # "" = optional with no default
    flags: list = field(default_factory=list)
    run: Callable[[argparse.Namespace], list[str]] = None


def _number(kind: type, text: str) -> Any:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a{'n integer' if kind is int else ' number'}")
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def _checked(kind: type, ok: Callable[[Any], bool], rule: str) -> Callable[[str], Any]:
    """A flag type: parse the text as ``kind``, then require ``ok(value)``."""
    def parse(text: str) -> Any:
        value = _number(kind, text)
        if not ok(value):
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text}")
        return value
    return parse


positive_int = _checked(int, lambda v: v >= 1, "a positive integer")        # a count
non_negative_int = _checked(int, lambda v: v >= 0, ">= 0")                 # 0: none
positive = _checked(float, lambda v: v > 0, "> 0")                         # size, time, rate
non_negative = _checked(float, lambda v: v >= 0, ">= 0")                   # latency; 0: none
fraction = _checked(float, lambda v: 0 <= v <= 1, "between 0 and 1")       # utilization
probability = _checked(float, lambda v: 0 <= v < 1, "in [0, 1)")        # dropout: 1 drops all


def add_topic_parser(topics: Any, name: str, topic: Topic) -> argparse.ArgumentParser:
    """One ``minidist calc NAME`` parser: its flags, and its formula and source in --help."""
    formula = "\n  ".join(part.strip() for part in topic.formula.split(";"))
    p = topics.add_parser(name, help=topic.help,
                          description=f"{topic.help}.\n\nformula:\n  {formula}\n\n"
                                      f"source: {topic.source}",
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag, kind, default, text in topic.flags:
        names = flag if isinstance(flag, tuple) else (flag,)
        if kind is bool:
            p.add_argument(*names, action="store_true", help=text)
            continue
        options: dict = {"type": kind}
        if isinstance(kind, tuple):
            options = {"type": type(kind[0]), "choices": kind}
        if default is None:
            p.add_argument(*names, required=True, help=text, **options)
        elif default == "":
            p.add_argument(*names, default=None, help=text, **options)
        else:
            p.add_argument(*names, default=default, help=f"{text} (default {default})",
                           **options)
    return p
