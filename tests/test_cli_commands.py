"""`minidist demo`, `minidist bench` and `minidist calc` (`minidist run` is in tests/comm)."""
import pathlib

import pytest

from minidist import calc
from minidist.calc.commands import TOPICS
from minidist.cli import main

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_demo_lists_every_numbered_demo(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    for path in REPO.glob("demos/[0-9][0-9]_*.py"):
        assert path.stem in out


def test_bench_lists_every_benchmark(capsys):
    assert main(["bench"]) == 0
    out = capsys.readouterr().out
    for path in REPO.glob("bench/bench_*.py"):
        assert path.stem in out


def test_an_unknown_demo_is_a_clear_error(capsys):
    assert main(["demo", "no_such_demo"]) == 2
    assert "matches none" in capsys.readouterr().err


def test_calc_zero_prints_the_formula_and_the_number(capsys):
    assert main(["calc", "zero", "--params", "7e9", "--gpus", "64", "--stage", "2"]) == 0
    out = capsys.readouterr().out
    assert "2 + 14/N" in out
    expected = calc.zero_memory_per_gpu(7e9, 64, 2) / 1e9
    assert f"{expected:,.2f} GB" in out


@pytest.mark.parametrize("topic", sorted(TOPICS))
def test_every_calc_topic_help_shows_its_formula(topic, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["calc", topic, "--help"])
    assert exit_.value.code == 0
    assert TOPICS[topic].formula.split(";")[0].strip()[:20] in " ".join(capsys.readouterr().out.split())


def test_calc_allreduce_agrees_with_the_cost_model(capsys):
    main(["calc", "allreduce", "--bytes", "100e6", "--gpus", "8", "--bandwidth", "50e9",
          "--latency", "10e-6"])
    out = capsys.readouterr().out
    ring = calc.ring_all_reduce_time(100e6, 8, 50e9, 10e-6)
    assert f"ring: time {ring * 1e3:,.3f} ms" in out


def test_calc_without_a_required_flag_fails_loudly(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["calc", "bubble", "--stages", "4"])
    assert exit_.value.code == 2
    assert "--microbatches" in capsys.readouterr().err


def test_bench_gpu_without_a_gpu_says_so_in_one_line_and_exits_2(capfd):
    from minidist import backend
    if backend.cupy_unavailable() is None:
        pytest.skip("CuPy and a CUDA device are here: the benchmark would run")
    assert main(["bench", "bench_gpu"]) == 2
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and err.startswith("bench_gpu: needs CuPy")
