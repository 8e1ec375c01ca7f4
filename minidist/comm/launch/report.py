"""What a failing rank reports: its traceback, from the user's code on.

A rank's exception reaches the launcher as text (world.py sends it to the
parent). Two kinds of frames say nothing to the person who ran the script:

- the launcher's own (world.py, script.py, runpy), above the user's code:
  always cut, the story starts in the script;
- minidist's inside a call of minidist's own errors (``CommError``: a
  collective mismatch, a timeout, an aborted world). Their message already says
  what went wrong, with every rank's call (the mismatch) or last call (the
  flight recorder's table, for a hang); the frames that matter are the user's,
  the line that made the call. They are hidden, one line counting them.

A mismatch then reads::

    Traceback (most recent call last):
      File "/tmp/train.py", line 7, in <module>
        dist.all_reduce(t)
      [8 frames inside minidist hidden: MINIDIST_VERBOSE=1 or minidist run --verbose shows them]
    minidist.comm.errors.CollectiveMismatchError: ranks of group [0, 1] called different ...

Any other exception (a bug in the script, or in minidist) keeps every frame
below the launcher. ``MINIDIST_VERBOSE=1`` in the environment keeps every frame
of every error.
"""
from __future__ import annotations

import os
import traceback

from minidist.comm.errors import CommError

HERE = os.path.dirname(os.path.abspath(__file__))                  # minidist/comm/launch
PACKAGE_DIR = os.path.dirname(os.path.dirname(HERE)) + os.sep       # minidist/
LAUNCHER_FILES = (HERE, "<frozen runpy>")
VERBOSE_HINT = "MINIDIST_VERBOSE=1 or minidist run --verbose shows them"


def verbose() -> bool:
    """Is ``MINIDIST_VERBOSE`` set (to anything but 0)?"""
    return os.environ.get("MINIDIST_VERBOSE", "0") not in ("", "0")


def traceback_from_user_code(e: BaseException) -> str:
    """``e``'s traceback as text, without the launcher's frames above the user's
    code and, for minidist's own errors, without minidist's frames (module docstring)."""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None and \
            tb.tb_frame.f_code.co_filename.startswith(LAUNCHER_FILES):
        tb = tb.tb_next
    if verbose() or not isinstance(e, CommError):
        return "".join(traceback.format_exception(type(e), e, tb))
    lines = ["Traceback (most recent call last):\n"]
    hidden = 0
    for frame in traceback.extract_tb(tb):
        if frame.filename.startswith(PACKAGE_DIR):
            hidden += 1
            continue
        lines += _hidden_line(hidden)
        hidden = 0
        lines += traceback.format_list([frame])
    lines += _hidden_line(hidden)
    return "".join(lines + traceback.format_exception_only(type(e), e))


def _hidden_line(count: int) -> list[str]:
    if count == 0:
        return []
    frames = "frame" if count == 1 else "frames"
    return [f"  [{count} {frames} inside minidist hidden: {VERBOSE_HINT}]\n"]
