import pytest
import torch
from tiny_models import naive_greedy

from warpdecode.decoding.generate import generate
from warpdecode.errors import ConfigError
from warpdecode.models.config import ModelConfig
from warpdecode.models.tokenizer import train_bpe
from warpdecode.models.transformer import Transformer

TEXT = ["def add(a, b):\n    return a + b\n", "class Stack:\n    def push(self, x):\n        self.items.append(x)\n"]


@pytest.fixture(scope="module")
def tiny():
    tokenizer = train_bpe(TEXT * 20, vocab_size=300)
    config = ModelConfig(vocab_size=tokenizer.vocab_size, n_layer=2, n_head=4, n_kv_head=2, d_model=64, d_ff=128,
                         max_seq_len=64, eos_token_ids=[tokenizer.eos_token_id])
    torch.manual_seed(0)
    model = Transformer(config)
    model.init_weights(std=0.5)  # a peaked random model so greedy paths are not ties
    return model.eval(), tokenizer


def test_cached_greedy_equals_naive_loop(tiny):
    model, tokenizer = tiny
    ids = tokenizer.encode("def add(a, b):")
    out = generate(model, tokenizer, ids, max_new_tokens=20, stop_at_eos=False)
    with torch.inference_mode():
        assert out.token_ids == naive_greedy(model, ids, 20)
    assert out.stats.new_tokens == 20 and out.stats.target_forwards == 19
    assert out.finish_reason == "length"
    assert out.text == tokenizer.decode(out.token_ids)


def test_stops_at_eos(tiny):
    model, tokenizer = tiny
    ids = tokenizer.encode("class Stack:")
    full = generate(model, tokenizer, ids, max_new_tokens=30, stop_at_eos=False).token_ids
    eos = full[5]
    model.config.eos_token_ids = [eos]
    try:
        out = generate(model, tokenizer, ids, max_new_tokens=30)
    finally:
        model.config.eos_token_ids = [tokenizer.eos_token_id]
    assert out.finish_reason == "eos"
    assert out.token_ids == full[: full.index(eos) + 1]


def test_context_limit_caps_generation(tiny):
    model, tokenizer = tiny
    ids = list(range(1, 61))  # context is 64
    out = generate(model, tokenizer, ids, max_new_tokens=10, stop_at_eos=False)
    assert len(out.token_ids) == 4 and out.finish_reason == "context"


def test_prompt_longer_than_context_is_refused(tiny):
    model, tokenizer = tiny
    with pytest.raises(ConfigError, match="context is 64 tokens"):
        generate(model, tokenizer, list(range(1, 70)), max_new_tokens=1)


def test_sampling_is_reproducible_with_seed(tiny):
    model, tokenizer = tiny
    kwargs = {"max_new_tokens": 15, "do_sample": True, "temperature": 1.5, "stop_at_eos": False}
    a = generate(model, tokenizer, "def", seed=3, **kwargs).token_ids
    b = generate(model, tokenizer, "def", seed=3, **kwargs).token_ids
    c = generate(model, tokenizer, "def", seed=4, **kwargs).token_ids
    assert a == b and a != c


def test_streamer_receives_the_whole_text(tiny):
    model, tokenizer = tiny
    pieces: list[str] = []
    out = generate(model, tokenizer, "def add", max_new_tokens=12, stop_at_eos=False, streamer=pieces.append)
    assert "".join(pieces) == out.text
