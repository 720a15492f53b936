"""Early-exit agreement: the exit after the last block is the model itself; an exit never agrees more
often among all positions than the share of confident positions allows."""

from __future__ import annotations

import pytest
import torch
from tiny_models import greedy_target, naive_greedy

from warpdecode.bench.early_exit import exit_agreement, markdown
from warpdecode.datamodules.self_distill import Example
from warpdecode.errors import ConfigError

pytestmark = pytest.mark.usefixtures("single_thread")


def examples(model) -> list[Example]:
    prompts = [[3, 7, 1, 9], [5, 6, 7, 8, 9], [2, 2, 4]]
    return [Example(torch.tensor(p + naive_greedy(model, p, 12)).numpy().astype("int32"), len(p), None) for p in prompts]


def test_exit_agreement():
    model = greedy_target()
    result = exit_agreement(model, examples(model), confidence_blocks=[1, 2])
    L = model.config.n_layer
    assert result["positions"] == 3 * 12 and len(result["agreement"]) == L
    assert result["agreement"][-1] == 1.0 and all(0.0 <= a <= 1.0 for a in result["agreement"])
    hits = 0
    with torch.inference_mode():  # the exit after block 1, computed directly
        for example in examples(model):
            tokens = torch.from_numpy(example.tokens.astype("int64"))[None]
            out = model(tokens, hidden_layers=(1,))
            start = example.prompt_length - 1
            exits = model.head(model.norm(out.hidden_states[1][0, start:-1])).argmax(-1)
            hits += int((exits == out.logits[0, start:-1].argmax(-1)).sum())
    assert result["agreement"][0] == pytest.approx(hits / 36)
    for block in (1, 2):
        shares = [result["confident"][block][t][0] for t in (0.5, 0.8, 0.9)]
        assert shares == sorted(shares, reverse=True)
    assert "| 3 | 100% | 1.000 |" in markdown(result, L)


def test_bad_blocks_and_empty_answers_are_refused():
    model = greedy_target()
    with pytest.raises(ConfigError, match="confidence blocks"):
        exit_agreement(model, examples(model), confidence_blocks=[0])
    empty = Example(torch.tensor([1, 2, 3]).numpy().astype("int32"), 3, None)
    with pytest.raises(ConfigError, match="no answer position"):
        exit_agreement(model, [empty], confidence_blocks=[1])
