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


@pytest.mark.parametrize("command, first", [("demo", "01_autograd"), ("bench", "bench_alltoall")])
def test_a_listing_ends_with_how_to_run_one(command, first, capsys):
    assert main([command]) == 0
    run_one, options = capsys.readouterr().out.rstrip().splitlines()[-2:]
    short = first.split("_")[0] if command == "demo" else first.removeprefix("bench_")
    folder = "demos" if command == "demo" else "bench"
    assert run_one == f"run one: minidist {command} {short}  (or python {folder}/{first}.py)"
    assert options == f"its options: minidist {command} {short} --help"


@pytest.mark.parametrize("command, folder, pattern", [("demo", "demos", "[0-9]*.py"),
                                                      ("bench", "bench", "bench_*.py")])
def test_a_listing_fits_100_columns_and_keeps_each_summary_whole(command, folder, pattern,
                                                                 capsys):
    """Each script's first docstring paragraph, wrapped at spaces: no word is cut."""
    from minidist.cli import _summary
    assert main([command]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 100
    entries = " ".join(out.split())
    for path in sorted(REPO.glob(f"{folder}/{pattern}")):
        assert f"{path.stem} {_summary(path)}" in entries, path.stem
    assert _summary(REPO / "demos/24_planner.py").endswith("layouts that real runs published.")


def test_a_subcommands_usage_error_shows_that_subcommands_usage(capsys):
    for argv, usage in ((["calc", "llama", "--bogus", "1"], "usage: minidist calc llama"),
                        (["trace", "summary", "run.json", "--bogus"],
                         "usage: minidist trace summary"),
                        (["plan", "--bogus"], "usage: minidist plan")):
        with pytest.raises(SystemExit) as stop:
            main(argv)
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith(usage) and "unrecognized arguments: --bogus" in err, err


def test_every_subcommand_help_has_a_description_line(capsys):
    from minidist.cli import SUBCOMMANDS
    for name in SUBCOMMANDS:
        with pytest.raises(SystemExit):
            main([name, "--help"])
        lines = capsys.readouterr().out.split("\n\n")
        assert len(lines) > 2 and not lines[1].startswith(("positional", "options")), name


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


BAD_VALUES = [
    ["zero", "--params", "-5", "--gpus", "4"],
    ["zero", "--params", "7e9", "--gpus", "0"],
    ["zero", "--params", "7e9", "--gpus", "4", "--stage", "4"],
    ["zero", "--params", "7e9", "--gpus", "4", "--precision", "fp8"],
    ["zero", "--params", "nan", "--gpus", "4"],
    ["bubble", "--stages", "0", "--microbatches", "4"],
    ["bubble", "--stages", "4", "--microbatches", "4", "--schedule", "zb"],
    ["allreduce", "--bytes", "1e6", "--gpus", "4", "--bandwidth", "0"],
    ["allreduce", "--bytes", "1e6", "--gpus", "4.5", "--bandwidth", "1e9"],
    ["activations", "--batch", "1", "--seq", "8", "--hidden", "8", "--heads", "0"],
    ["activations", "--batch", "1", "--seq", "8", "--hidden", "8", "--heads", "2",
     "--recompute", "some"],
    ["tp", "--hidden", "100", "--seq", "4", "--batch", "1", "--tp", "3"],
    ["flops", "--batch", "4"],
    ["flops", "--params", "7e9", "--tokens", "1e12", "--mfu", "1.5"],
    ["mfu", "--batch", "1", "--seq", "8", "--layers", "1", "--hidden", "8", "--vocab", "8",
     "--step-seconds", "0", "--gpus", "1", "--peak-tflops", "1"],
    ["params", "--layers", "-1", "--hidden", "8", "--vocab", "8", "--seq", "8"],
    ["batch", "--target", "0", "--micro", "1", "--dp", "1"],
]


@pytest.mark.parametrize("argv", BAD_VALUES, ids=lambda argv: " ".join(argv))
def test_calc_answers_a_bad_value_with_a_usage_error_and_status_2(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["calc", *argv])
    assert exit_.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    error_lines = [line for line in captured.err.splitlines() if "error:" in line]
    assert len(error_lines) == 1 and "Traceback" not in captured.err
    assert error_lines[0].startswith(f"minidist calc {argv[0]}: error:")


@pytest.mark.parametrize("topic", sorted(TOPICS))
def test_every_calc_topic_help_names_its_source_in_plain_words(topic, capsys):
    with pytest.raises(SystemExit):
        main(["calc", topic, "--help"])
    out = capsys.readouterr().out
    assert "source: " in out and "``" not in out


def test_calc_bubble_shows_gpipe_and_1f1b_idle_alike_in_both_conventions(capsys):
    assert main(["calc", "bubble", "--stages", "4", "--microbatches", "8"]) == 0
    out = capsys.readouterr().out
    assert "idle / useful" in out and "idle / whole step" in out
    rows = {line.split()[0]: line.split()[1:3] for line in out.splitlines()
            if line.strip().startswith(("gpipe", "1f1b"))}
    assert rows["gpipe"] == rows["1f1b"] == ["37.50%", "27.27%"]


def test_calc_activations_params_flops_reproduce_gpt3(capsys):
    gpt3 = ["--seq", "2048", "--hidden", "12288"]
    main(["calc", "activations", "--batch", "1", "--heads", "96", "--layers", "96", *gpt3])
    assert "all 96 layers: 275.41 GB" in capsys.readouterr().out
    main(["calc", "activations", "--batch", "1", "--heads", "96", "--layers", "96", *gpt3,
          "--tp", "8", "--sp", "--recompute", "selective"])
    assert "all 96 layers: 10.27 GB" in capsys.readouterr().out
    main(["calc", "params", "--layers", "96", "--vocab", "51200", *gpt3])
    assert "174,615,822,336" in capsys.readouterr().out
    main(["calc", "flops", "--batch", "1536", "--layers", "96", "--vocab", "51200", *gpt3,
          "--recompute"])
    assert "4.5110e+18" in capsys.readouterr().out


def test_calc_mfu_and_hfu_differ_by_the_recomputed_forward(capsys):
    argv = ["calc", "mfu", "--batch", "1536", "--seq", "2048", "--layers", "96", "--hidden",
            "12288", "--vocab", "51200", "--step-seconds", "33", "--gpus", "1024",
            "--peak-tflops", "312"]
    main(argv + ["--recompute"])
    u = calc.flops_utilization(1536, 2048, 96, 12288, 51200, 33, 1024, 312e12, True)
    out = capsys.readouterr().out
    assert f"MFU (model FLOPs, no recomputation): {100 * u.mfu:.2f}%" in out
    assert f"{100 * u.hfu:.2f}%" in out and u.hfu > u.mfu


BAD_BENCH_ARGS = [
    ("bench_autograd", ["--steps", "0"], "positive integer"),
    ("bench_autograd", ["--n-head", "3"], "divisible by --n-head"),
    ("bench_autograd", ["--model", "llama", "--n-kv-head", "3"], "must divide --n-head"),
    ("bench_gqa_memory", ["--n-kv-head", "5"], "must divide --n-head"),
    ("bench_collectives", ["--worlds", "0"], "positive integer"),
    ("bench_collectives", ["--max-size", "4Q"], "not an integer"),
    ("bench_ddp", ["--bucket-mb", "0"], "> 0"),
    ("bench_rounding", ["--n", "0"], "positive integer"),
    ("bench_ring_attention", ["-n", "3", "--length", "100"], "divisible by 2 x -n"),
]


@pytest.mark.parametrize("name,args,reason", BAD_BENCH_ARGS,
                         ids=[f"{n} {' '.join(a)}" for n, a, _ in BAD_BENCH_ARGS])
def test_a_bad_benchmark_argument_is_a_usage_error(name, args, reason, capfd):
    assert main(["bench", name, *args]) == 2               # the script runs as a child
    err = capfd.readouterr().err
    assert "usage:" in err and reason in err and "Traceback" not in err, err
