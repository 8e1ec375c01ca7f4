"""The flag types of the demos: a count of 0, a negative seed or a learning rate
of 0 is a usage error (argparse prints the usage line and the reason and exits
with status 2) instead of a traceback from inside a rank."""
from minidist.calc.cli_args import (non_negative, non_negative_int, positive, positive_int,
                                    probability)

__all__ = ["non_negative", "non_negative_int", "positive", "positive_int", "probability"]
