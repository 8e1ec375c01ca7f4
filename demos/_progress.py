"""A dependency-free progress bar for the demos' training loops."""
from __future__ import annotations

import sys
import time


class Progress:
    """``for step in Progress(range(n), "train"): ...; bar.note("loss 1.23")``.

    Draws one line that redraws itself on a terminal, and a line every tenth
    of the way when the output is a file or a CI log.
    """

    def __init__(self, iterable, desc: str = "", width: int = 24):
        self.items = list(iterable)
        self.desc, self.width, self.text = desc, width, ""
        self.tty = sys.stdout.isatty()

    def note(self, text: str) -> None:
        self.text = text

    def __iter__(self):
        n = len(self.items)
        t0 = time.perf_counter()
        every = max(1, n // 10)
        for i, item in enumerate(self.items):
            yield item
            done = i + 1
            if self.tty or done % every == 0 or done == n:
                filled = self.width * done // n
                bar = "#" * filled + "." * (self.width - filled)
                line = (f"{self.desc} [{bar}] {done}/{n} "
                        f"{time.perf_counter() - t0:5.1f}s {self.text}")
                print(("\r" if self.tty else "") + line, end="" if self.tty else "\n", flush=True)
        if self.tty:
            print()
