"""A function sent to a world takes its modules by reference (payload.py).

``import minidist`` then ``minidist.tensor(...)`` inside a launched function works from
a script's ``__main__`` and from a notebook cell, beside ``np.*`` and a helper defined
next to the function; a module is never pickled whole.
"""
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import minidist
from minidist.comm.launch import payload
from minidist.comm.launch.world import World

# the body of a script or a notebook cell; prints the per-rank results as one line
PROGRAM = textwrap.dedent("""
    import numpy as np
    import minidist

    def helper(x):
        return x * 2.0

    def on_rank():
        t = minidist.tensor(np.arange(3.0))
        return float(np.sum(helper(t).data)) + 10 * minidist.comm.get_rank()
""")
LAUNCH = "print('results', minidist.launch(on_rank, 2))"
WANT = "results [6.0, 16.0]"


def test_an_importable_module_travels_by_name_not_by_value():
    message = payload.dumps(minidist)
    names = [n for n in sys.modules if n == "minidist" or n.startswith("minidist.")]
    # the name and the loaded submodules' names (a few bytes of framing each), no __dict__:
    # by value, minidist's functions and docstrings would be hundreds of kilobytes
    assert len(message) < sum(len(n) + 8 for n in names) + 1000, (len(message), len(names))
    assert pickle.loads(message) is minidist


def test_a_function_of_main_using_minidist_and_numpy_runs_on_every_rank(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(PROGRAM + "\nif __name__ == '__main__':\n    " + LAUNCH + "\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    assert WANT in out.stdout


def test_a_closure_over_a_module_runs_in_a_world():
    np_sum = np.sum
    with World(2, timeout=30.0, run_timeout=120.0) as world:
        got = world.run(lambda: float(np_sum(minidist.tensor(np.ones(4)).data)))
    assert got == [4.0, 4.0]


def test_a_function_of_a_notebook_cell_runs_on_every_rank(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(PROGRAM), nbformat.v4.new_code_cell(LAUNCH)]
    client = nbclient.NotebookClient(notebook, timeout=180, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    text = "".join(o.get("text", "") for o in notebook.cells[1].outputs)
    assert WANT in text
