"""GPTConfig refuses, when it is made, a shape that no model can have."""
import pytest

from minidist.nn import GPTConfig


@pytest.mark.parametrize("fields,message", [
    (dict(n_embd=30, n_head=4), "not divisible by n_head"),
    (dict(n_head=0), "n_head must be at least 1"),
    (dict(vocab_size=0), "vocab_size must be at least 1"),
    (dict(n_layer=-1), "n_layer must be at least 0"),
    (dict(dropout=1.0), r"dropout must be in \[0, 1\)"),
])
def test_a_config_no_model_can_have_is_refused_when_made(fields, message):
    with pytest.raises(ValueError, match=message):
        GPTConfig(**fields)
