"""Starting a world of local processes, running functions on it, and failing loudly.

Files:

- world.py   ``World`` and ``launch``: spawn N ranks, attach them to one shared-memory
             segment, run functions, tear everything down when one rank fails
- payload.py how a function travels to the ranks: dill, importable modules by reference
- output.py  the ranks' stdout and stderr: whole lines prefixed ``[rank N]``, log files
- report.py  what a failing rank reports: its traceback from the user's code on, minidist's
             own frames hidden for minidist's own errors (``MINIDIST_VERBOSE=1`` shows them)
- script.py  ``minidist run``: a script on N ranks, torchrun's flags, elastic restarts,
             exit status and failure messages

``minidist run -n N script.py`` (minidist/cli.py) starts a script this way, as torchrun
does. Docs: docs/running.md. Tests: tests/comm/launch/.
"""
from minidist.comm.launch.world import RankLost, World, launch

__all__ = ["RankLost", "World", "launch"]
