import pytest

from warpdecode.decoding.drafters.draft_model import DraftModel
from warpdecode.decoding.generate import build_method, generate
from warpdecode.errors import ConfigError
from warpdecode.models.checkpoint import load_pretrained


def test_target_as_its_own_draft_accepts_everything(tiny_model_dir, single_thread):
    target, tokenizer = load_pretrained(tiny_model_dir)
    plain = generate(target, tokenizer, "for i in range", max_new_tokens=20, stop_at_eos=False, chat=False)
    method = build_method("draft_model", options={"model": str(tiny_model_dir), "num_tokens": 4})
    drafted = generate(target, tokenizer, "for i in range", max_new_tokens=20, stop_at_eos=False, chat=False,
                       method=method)
    assert drafted.token_ids == plain.token_ids
    assert drafted.stats.acceptance_rate == 1.0
    # 1 token from the prefill, then 4 accepted + 1 bonus per verify forward (the last one is cut to fit)
    assert drafted.stats.accepted_per_step[:3] == [4, 4, 4]
    assert drafted.stats.target_forwards == 4


def test_needs_exactly_one_draft_source():
    with pytest.raises(ConfigError, match="exactly one"):
        DraftModel()
    with pytest.raises(ConfigError, match="exactly one"):
        DraftModel(model="x", layers=2)
