"""`minidist selftest`: the comparison suite passes on the guard backend, and it can fail.

The comparison suite runs here in-process, guard against NumPy (the GPU run is
the same code with ``--backend cupy``). Checks that tamper with their result on
the backend under test show that each rule catches a wrong answer, down to one
ulp or the sign of a zero for the bitwise rule.
"""
import numpy as np
import pytest

from minidist import backend
from minidist.cli import main
from minidist.selftest import BITWISE, CHECKS, TWICE, Check, run_check
from minidist.selftest import command


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.name)
def test_every_comparison_check_passes_on_guard_against_numpy(check):
    result = run_check(check, "guard", quick=True)
    assert result.passed, result.line()


def _under_test() -> bool:
    """True on the backend under test, False on the NumPy reference and gold runs."""
    return backend.get_backend() != "numpy"


def _values(quick):
    return {"x": np.array([1.0, -0.0, 3.5, np.nan, 2.0 ** -140], "float32")}


def _one_ulp_off(inputs, dtype):
    x = inputs["x"].copy()
    if _under_test():
        x[2] = np.nextafter(x[2], np.float32(np.inf))
    return {"x": x}


def _sign_of_zero_off(inputs, dtype):
    x = inputs["x"].copy()
    if _under_test():
        x[1] = 0.0
    return {"x": x}


def _matmul_inputs(quick):
    rng = np.random.default_rng(0)
    return {"a": rng.standard_normal((16, 32)).astype("float32"),
            "b": rng.standard_normal((32, 8)).astype("float32")}


def _matmul_slightly_off(inputs, dtype):
    a, b = (backend.from_host(inputs[k].astype(dtype)) for k in ("a", "b"))
    y = backend.to_host(a @ b).copy()
    return {"y": y * (1 + 1e-4) if _under_test() else y}


def _matmul(inputs, dtype):
    a, b = (backend.from_host(inputs[k].astype(dtype)) for k in ("a", "b"))
    return {"y": backend.to_host(a @ b).copy()}


WRONG = [Check("one ulp off", BITWISE, _values, _one_ulp_off),
         Check("-0 became +0", BITWISE, _values, _sign_of_zero_off),
         Check("matmul 1e-4 off", TWICE, _matmul_inputs, _matmul_slightly_off)]


@pytest.mark.parametrize("check", WRONG, ids=lambda c: c.name)
def test_a_wrong_result_fails_its_rule(check):
    result = run_check(check, "guard")
    assert not result.passed, result.line()
    assert "FAIL" in result.line()


def test_the_same_computations_untampered_pass():
    right = [Check("values", BITWISE, _values, lambda inputs, dtype: dict(inputs)),
             Check("matmul", TWICE, _matmul_inputs, _matmul)]
    for check in right:
        assert run_check(check, "guard").passed


def test_a_check_that_raises_is_a_failure_not_a_crash():
    def broken(inputs, dtype):
        raise RuntimeError("no kernel for this")
    result = run_check(Check("broken", BITWISE, _values, broken), "guard")
    assert not result.passed and "no kernel for this" in result.detail


def test_the_command_exits_1_on_a_failed_check_and_says_tests_are_missing(
        monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(command, "TESTS", tmp_path / "no_tests_here")
    monkeypatch.setattr(command, "CHECKS", WRONG[:1])
    assert main(["selftest", "--backend", "guard"]) == 1
    out = capsys.readouterr().out
    assert "one ulp off" in out and "FAIL" in out
    assert "no tests/ folder" in out


def test_the_command_exits_0_when_everything_selected_passes(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(command, "TESTS", tmp_path / "no_tests_here")
    assert main(["selftest", "--backend", "guard", "--quick", "-k", "round and not fp8"]) == 0
    out = capsys.readouterr().out
    assert "round fp16 " in out and "fp8" not in out


def test_k_selects_checks_as_pytest_does():
    names = [c.name for c in command.select(CHECKS, "(fp8 or bf16) and not codes")]
    assert names and all(("fp8" in n or "bf16" in n) and "codes" not in n for n in names)
    assert command.select(CHECKS, None) == CHECKS


def test_cupy_without_cupy_is_a_one_line_error(capsys):
    if backend.cupy_unavailable() is None:
        pytest.skip("CuPy and a CUDA device are present here")
    assert main(["selftest", "--backend", "cupy"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "cannot run here" in err
