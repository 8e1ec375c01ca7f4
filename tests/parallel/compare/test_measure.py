"""parallel/compare/measure.py: a layout runs, and what it reports is the rank's real memory.

No timing is asserted: only that every timed step was measured."""
import pytest

from minidist.comm import World
from minidist.nn.gpt import GPT, GPTConfig
from minidist.parallel.compare import measure

CFG = GPTConfig(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=32)


@pytest.fixture(scope="module")
def world():
    with World(2, timeout=60.0, run_timeout=120.0) as w:
        yield w


@pytest.mark.parametrize("layout", [
    dict(dp=2, tp=1, pp=1, zero=0, micro_batch=2, recompute="none"),
    dict(dp=2, tp=1, pp=1, zero=2, micro_batch=1, recompute="full"),
    dict(dp=1, tp=2, pp=1, zero=0, micro_batch=2, recompute="none"),
    dict(dp=1, tp=1, pp=2, zero=0, micro_batch=1, recompute="none"),
])
def test_a_layout_reports_each_rank_and_at_least_its_model_state(world, layout):
    got = measure.run_layout(world, CFG, layout, sequences=4, steps=2)
    assert len(got["all_seconds"]) == 2 and all(t > 0 for t in got["all_seconds"])
    assert len(got["peak_per_rank"]) == 2
    params = GPT(CFG).num_parameters()
    shards = layout["dp"] if layout["zero"] >= 1 else 1
    split = layout["tp"] * layout["pp"]
    # weights (4 bytes) and AdamW's two moments (8 / shards) of this rank's share at least
    floor = params / split * (4 + 8 / shards) * 0.9      # replicated norms make it more
    for peak, base in zip(got["peak_per_rank"], got["base_bytes"]):
        assert peak > base >= floor


def test_a_layout_that_does_not_use_the_ranks_is_refused(world):
    with pytest.raises(ValueError, match="dp x tp x pp = 2"):
        measure.run_layout(world, CFG, dict(dp=2, tp=2, pp=1, zero=0, micro_batch=1,
                                            recompute="none"), sequences=4)
