"""``minidist plan`` on the command line: an answer, an explanation, and usage errors."""
import pytest

from minidist.calc.planner import published
from minidist.cli import main

pytestmark = pytest.mark.host_only  # the planner's arithmetic: no backend array (tests/conftest.py)


def test_plan_prints_the_best_layouts_and_what_was_excluded(capsys):
    assert main(["plan", "--model", "llama3-8b", "--gpus", "16", "--batch-tokens",
                 str(64 * 4096), "--seq", "4096", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "layouts searched" in out and "excluded" in out
    assert "layout dp" in out and "step time" in out and "memory per GPU" in out


@pytest.mark.parametrize("argv", [["--model", "llama3-70b", "--gpus", "1024"], ["--published"],
                                  ["--model", "llama3-70b", "--gpus", "1024", "--explain",
                                   "dp8 tp8 pp16 cp1 z1 b1 full 1f1b"]])
def test_every_line_fits_100_columns(argv, capsys, monkeypatch):
    # --published searches every layout for each published run (test_published.py checks
    # them all); here one run of each source, Megatron's and Llama 3's, shows the table
    monkeypatch.setattr(published, "PUBLISHED", published.PUBLISHED[::len(published.PUBLISHED) - 1])
    assert main(["plan", *argv]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= 100


def test_the_table_has_whole_headers_and_a_legend_of_the_layout_codes(capsys):
    assert main(["plan", "--model", "llama3-8b", "--gpus", "64"]) == 0
    out = capsys.readouterr().out
    words = set(out.split())
    for header in ("layout", "step", "MFU", "compute", "bubble", "parameters", "gradients",
                   "optimizer", "activations", "logits", "buffers"):
        assert header in words, header
    legend = " ".join(out[out.index("layout: dpN"):].split())
    for code in ("dpN tpN ppN cpN epN", "zN, the ZeRO stage", "bN, sequences per micro-batch",
                 "(none | selective | full)", "1f1b", "interleaved-vV", "zb_h1"):
        assert code in legend, code


def test_explain_reads_a_layout_and_lists_every_term(capsys):
    assert main(["plan", "--model", "llama3-8b", "--gpus", "16", "--batch-tokens",
                 str(64 * 4096), "--seq", "4096", "--explain", "dp2 tp8 pp1 z1 b1 none"]) == 0
    out = capsys.readouterr().out
    for term in ("compute", "bubble", "tp", "dp", "parameters", "activations"):
        assert term in out


def test_explain_of_a_layout_that_cannot_run_says_why(capsys):
    assert main(["plan", "--model", "llama3-8b", "--gpus", "16", "--explain",
                 "dp1 tp16 pp1"]) == 0
    out = capsys.readouterr().out
    assert "cannot run" in out and "spans nodes" in out


def test_out_of_memory_everywhere_names_the_nearest_miss(capsys):
    assert main(["plan", "--model", "llama3-70b", "--gpus", "8", "--memory", "1e9",
                 "--batch-tokens", str(8 * 4096), "--seq", "4096"]) == 1
    out = capsys.readouterr().out
    assert "Nearest miss" in out and "GB over" in out


@pytest.mark.parametrize("argv,reason", [
    (["--gpus", "0"], "must be a positive integer"),
    (["--model", "gpt9"], "unknown model preset"),
    (["--cluster", "tpu"], "unknown cluster preset"),
    (["--batch-tokens", "1000", "--seq", "4096"], "whole number"),
    (["--gpus", "48", "--batch-tokens", "8192", "--seq", "8192"], "divisibility rules"),
    (["--model", "custom", "--layers", "2"], "needs"),
    (["--explain", "dp2 tp4 potato"], "cannot read"),
])
def test_nonsense_is_a_one_line_usage_error(argv, reason, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["plan", *argv])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert reason in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 2          # the usage line and the reason
