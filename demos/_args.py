"""The flag types of the demos: a count of 0, a negative seed or a learning rate
of 0 is a usage error (argparse prints the usage line and the reason and exits
with status 2) instead of a traceback from inside a rank."""
import argparse
from typing import Any, Callable

from minidist.calc.cli_args import (non_negative, non_negative_int, positive, positive_int,
                                    probability)

__all__ = ["non_negative", "non_negative_int", "or_usage_error", "positive", "positive_int",
           "probability", "quick_or_full"]


def or_usage_error(parser: argparse.ArgumentParser, make: Callable[..., Any], *args, **kwargs):
    """``make(*args, **kwargs)``; a ValueError it raises (flags no model can have:
    GPTConfig with n_embd not divisible by n_head, say) becomes the usage line
    and its reason, exit status 2."""
    try:
        return make(*args, **kwargs)
    except ValueError as e:
        parser.error(str(e))


def quick_or_full(args: argparse.Namespace, quick: dict, full: dict) -> None:
    """Give each flag the user left unset (None) its value from ``quick``, or from
    ``full`` when ``--full`` was given: a demo's defaults run in seconds, ``--full``
    is the longer run its docs page quotes. A flag the user set is kept."""
    for name, value in (full if args.full else quick).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
